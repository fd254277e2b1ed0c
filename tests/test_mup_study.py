"""μP's transfer in studies: ``scaling.transfer: {rule: mup, base}`` builds every cell in μP;
an ordinary study's ``transfer: {rule: mup, base}`` tunes each candidate at the base shape and
confirms at its own width with the tuned values, and its report says so. End to end on CPU."""

from __future__ import annotations

import copy
import json
from typing import Any

import optuna
import pytest
import yaml

from harness.cli.main import main
from harness.errors import ConfigError
from harness.keys import Attr

CANDIDATES = [
    {"name": "att", "model": {"name": "transformer", "params": {"layers": 1, "heads": 2, "d_model": 32, "ffn_mult": 2},
                              "search_declared": False, "attention": {"name": "multi_head", "search_declared": False},
                              "position": {"name": "sinusoidal", "search_declared": False}}},
    {"name": "rnn", "model": {"name": "lstm", "params": {"layers": 1, "width": 32}, "search_declared": False}},
]
STUDY: dict[str, Any] = {
    "name": "small",
    "task": {"name": "char_lm", "params": {"length": 16, "num_train": 256, "num_val": 4}},
    "candidates": CANDIDATES,
    "objective": {"metric": "loss"},
    "search": {"lr": {"low": 1.0e-3, "high": 3.0e-2, "log": True}},
    "train": {"batch_size": 8, "val_every": 12, "warmup_steps": 2, "num_threads": 1},
    "budget": {"trials": 2, "steps": 12},
    "transfer": {"rule": "mup", "base": {"d_model": 16, "width": 16}},
    "pruner": {"name": "none"},
    "confirm": {"seeds": 2, "test": "t", "baseline": "att"},
    "resume": {"heartbeat_s": 1, "grace_s": 60, "poll_s": 0.3},
}


def write(tmp_path, data: dict[str, Any]):
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def load(path):
    from harness.study.schema import load_study_config
    from harness.study.space import load_registry, validate

    cfg = load_study_config(path)
    return validate(cfg, load_registry(cfg))


def configs(storage: str, name: str, cand: str, phase: str) -> list[dict[str, Any]]:
    study = optuna.load_study(study_name=f"{name}/{cand}" + ("/confirm" if phase == "confirm" else ""),
                              storage=storage)
    return [t.user_attrs[Attr.CONFIG] for t in study.get_trials() if Attr.CONFIG in t.user_attrs]


def test_an_ordinary_study_tunes_small_and_confirms_at_full_width(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    storage, uri, out = f"sqlite:///{tmp_path / 'o.db'}", f"sqlite:///{tmp_path / 'm.db'}", tmp_path / "report"
    assert main(["study", "run", str(write(tmp_path, STUDY)), "--storage", storage, "--tracking-uri", uri,
                 "--report", "--out", str(out)]) == 0
    for cand, key in (("att", "d_model"), ("rnn", "width")):
        tuned = configs(storage, "small", cand, "tune")
        confirmed = configs(storage, "small", cand, "confirm")
        assert len(tuned) == 2 and len(confirmed) == 2
        for run in tuned:  # at the base shape, in μP, as many steps as the full-width run
            assert run["model"]["params"][key] == 16 and run["model"]["parametrization"] == "mup"
            assert run["model"]["base"] == {key: 16} and run["train"]["max_steps"] == 12
        best_lrs = {t["train"]["lr"] for t in tuned}
        for run in confirmed:  # the candidate's own width, the same base, a tuned lr unchanged
            assert run["model"]["params"][key] == 32 and run["model"]["base"] == {key: 16}
            assert run["model"]["parametrization"] == "mup" and run["train"]["lr"] in best_lrs
    md = " ".join((out / "results.md").read_text().split())
    assert "tuned at the base shape (d_model = 16, width = 16" in md
    assert "confirmed at each candidate's own width in μP with the tuned hyper-parameters unchanged" in md


def test_the_transfer_mode_turns_a_flop_budget_into_the_full_width_steps(tmp_path):
    data = copy.deepcopy(STUDY) | {"budget": {"trials": 2, "flops": 2e8}}
    space = load(write(tmp_path, data))
    cand = space.candidate("att")
    tune = space.run_config(cand, None, seed=0)
    assert "max_flops" not in tune["train"] and tune["train"]["max_steps"] >= 1
    full = space.confirm_run_config(tune, seed=1, cand=cand)
    assert full["train"]["max_flops"] == 2e8 and "max_steps" not in full["train"]
    assert full["model"]["params"]["d_model"] == 32


@pytest.mark.parametrize(("change", "message"), [
    ({"budget": {"trials": 2, "seconds": 30, "steps": 10}}, "a budget in seconds"),
    ({"transfer": {"rule": "mup", "base": {}}}, "transfer.base"),
    ({"candidates": [CANDIDATES[0] | {"model": CANDIDATES[0]["model"] | {"search": {"d_model": [16, 32]}}}]},
     "the width is not searched"),
    # issue 49: refused at create, not in every trial
    ({"transfer": {"rule": "mup", "base": {"d_model": 16, "width": 16, "bogus": 16}}},
     "transfer.base.bogus: no candidate's model has a param 'bogus'"),
    ({"transfer": {"rule": "mup", "base": {"d_model": 64, "width": 16}}},
     "transfer.base.d_model: 64 is wider than candidate 'att' (d_model = 32)"),
    ({"train": STUDY["train"] | {"strategy": "fsdp"}}, "FSDP"),
])
def test_a_transfer_that_cannot_hold_is_refused(tmp_path, change, message):
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, copy.deepcopy(STUDY) | change))
    assert message in " ".join(str(err.value).split())


def test_a_candidate_without_a_base_param_is_named_at_create(tmp_path):
    data = copy.deepcopy(STUDY) | {"transfer": {"rule": "mup", "base": {"d_model": 16}}}
    with pytest.raises(ConfigError, match="candidate 'rnn' .*width: 64"):
        load(write(tmp_path, data))


SCALING: dict[str, Any] = {
    "name": "grid",
    "task": {"name": "char_lm", "params": {"length": 16, "num_train": 512, "num_val": 4}},
    "candidates": [CANDIDATES[0]],
    "objective": {"metric": "loss"},
    "scaling": {"sizes": [{"d_model": 16}, {"d_model": 24}, {"d_model": 32}],
                "budgets": [3e8, 1e9, 3e9],
                "transfer": {"rule": "mup", "base": {"d_model": 16}, "lr": 1e-2}},
    "train": {"batch_size": 8, "val_every": 1000, "warmup_steps": 2, "num_threads": 1},
    "budget": {"trials": 1},
    "pruner": {"name": "none"},
    "confirm": {"seeds": 2, "test": "t"},
    "resume": {"heartbeat_s": 1, "grace_s": 60, "poll_s": 0.3},
}


def test_a_scaling_study_under_mup_builds_every_cell_in_mup_with_one_lr(tmp_path):
    space = load(write(tmp_path, SCALING))
    for cand in space.candidates:
        run = space.run_config(cand, None, seed=0)
        assert run["model"]["parametrization"] == "mup" and run["model"]["base"] == {"d_model": 16}
        assert run["train"]["lr"] == 1e-2  # the same at every size
    with pytest.raises(ConfigError, match="rule 'mup' needs base"):
        load(write(tmp_path, copy.deepcopy(SCALING) | {"scaling": SCALING["scaling"] | {"transfer": {"rule": "mup"}}}))


def test_the_scaled_rule_says_what_it_does():
    from harness.study.schema import ScalingTransfer

    text = " ".join(ScalingTransfer.model_fields["rule"].description.split())
    assert "every parameter (embeddings, norms' gains, biases and the readout included)" in text
    assert "standard parametrization" in text and "not muP" in text


@pytest.mark.slow
def test_a_tiny_scaling_study_under_mup_runs_and_reports_its_rule(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    out = tmp_path / "report"
    assert main(["study", "run", str(write(tmp_path, SCALING)), "--report", "--out", str(out),
                 "--format", "md,json"]) == 0
    md = " ".join((out / "results.md").read_text().split())
    assert "every size in μP (model.parametrization: mup, base d_model = 16" in md
    assert json.loads((out / "scaling.json").read_text())["fits"]
