"""Study definitions: field-exact errors, validation before anything is created, search
spaces and parameter-count matching (checked against brute force)."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from text import flat, one_paragraph

import harness
from harness.cli.main import main
from harness.config import parse_run_config
from harness.errors import ConfigError
from harness.params import Choice, FloatRange, IntRange
from harness.study.schema import load_study_config, parse_study_config
from harness.study.space import validate

BASE: dict[str, Any] = {
    "name": "cfg",
    "task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 64, "num_val": 16,
                                        "eval_lengths": [6]}},
    "candidates": [
        {"name": "mha", "model": {"name": "transformer", "params": {"layers": 1, "heads": 2},
                                  "search": {"d_model": [16, 32]},
                                  "attention": {"name": "multi_head"},
                                  "position": {"name": "sinusoidal"}}},
        {"name": "nope", "model": {"name": "transformer", "params": {"layers": 1, "heads": 2},
                                   "search_declared": False,
                                   "attention": {"name": "multi_head"},
                                   "position": {"name": "none"}}},
    ],
    "objective": {"metric": "acc", "length": 6},
    "search": {"lr": {"low": 1.0e-4, "high": 1.0e-2, "log": True}, "batch_size": [8, 16]},
    "train": {"val_every": 10, "num_threads": 1},
    "budget": {"trials": 2, "steps": 20},
}


def study(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        node = data
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[keys[-1]] = value
    return data


def error_of(data: dict[str, Any], registry) -> str:
    with pytest.raises(ConfigError) as exc:
        validate(parse_study_config(data), registry)
    return str(exc.value)


def test_valid_study_space(registry):
    space = validate(parse_study_config(study()), registry)
    mha, nope = space.candidates
    assert mha.model.ranges == {"d_model": Choice((16, 32))}
    # search_declared: false fixes every declared range at its default
    assert nope.model.ranges == {} and nope.model.fixed["dropout"] == 0.0
    assert space.train_ranges == {"lr": FloatRange(1e-4, 1e-2, log=True), "batch_size": Choice((8, 16))}
    assert (space.train_length, space.eval_lengths, space.objective_length) == (4, (4, 6), 6)


def test_run_config_samples_prefixed_names(registry):
    space = validate(parse_study_config(study()), registry)
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    run = space.run_config(space.candidates[0], trial, seed=7)
    assert set(trial.params) == {"model.d_model", "model.ffn_mult", "model.dropout", "model.norm",
                                 "model.tie_embeddings", "attention.dropout", "attention.tied_qk",
                                 "position.base", "train.lr", "train.batch_size"}
    assert run["model"]["params"]["d_model"] == trial.params["model.d_model"]
    assert run["train"]["lr"] == trial.params["train.lr"]
    assert (run["train"]["max_steps"], run["train"]["seed"], run["train"]["data_seed"]) == (20, 7, 0)
    assert run["model"]["params"]["layers"] == 1
    parse_run_config(run)  # a valid run config


@pytest.mark.parametrize(("changes", "expected"), [
    ({"budgett": {}}, "budgett: unknown field"),
    ({"candidates__0__model__position__search": {"base": {"low": 10, "high": 1}}},
     "candidates[0].model.position.search.base: need low <= high"),
    ({"candidates__1__model__position__search": {"base": [1.0]}},
     "candidates[1].model.position.search: unknown parameter 'base'. Known parameters: none."),
    ({"candidates__0__model__params": {"dmodel": 32}},
     "candidates[0].model.params: unknown parameter 'dmodel' (did you mean 'd_model'?)"),
    ({"candidates__0__model__attention__name": "mult_head"},
     "candidates[0].model.attention.name: unknown attention 'mult_head'. Did you mean 'multi_head'?"),
    ({"candidates__0__model__search": {"d_model": 32}}, "candidates[0].model.search.d_model: 32 is not a range"),
    ({"candidates__0__model__search": {"norm": {"low": 1, "high": 4}}},
     "candidates[0].model.search.norm: this parameter is not numeric"),
    ({"candidates__0__model__search": {"tie_embeddings": [True, 3.5]}},
     "candidates[0].model.search.tie_embeddings: 3.5 is invalid"),
    ({"candidates__0__model__search": {"ffn_mult": {"low": 1.5, "high": 3}}},
     "candidates[0].model.search.ffn_mult: an integer parameter needs integer low, high and step"),
    ({"candidates__0__model__params": {"layers": "two"}},
     "candidates[0].model.params.layers: 'two' is invalid"),
    ({"candidates__0__model__search": {"heads": [2]}},
     "candidates[0].model: heads is both fixed (params) and searched (search)"),
    ({"candidates__0__model__params": {"heads": 3, "layers": 1}, "candidates__0__model__search": {}},
     "candidates[0] (mha): model.params: d_model (64) must be divisible by heads (3)"),
    ({"candidates__1__name": "mha"}, "candidate names must be unique; repeated: mha"),
    ({"candidates__1__name": "bad name"}, "candidates[1].name"),
    ({"objective": {"metric": "per_token_whatever"}}, "objective.metric: task 'copy' does not log 'per_token_whatever'"),
    ({"objective": {"metric": "acc", "length": 64}}, "objective.length: 64 is not an evaluation length"),
    ({"train": {"max_steps": 100}}, "train.max_steps: set by budget.steps"),
    ({"train": {"lr": -1}}, "train.lr: Input should be greater than 0"),
    ({"search": {"lr": [0.1], "nesterov": [True]}}, "search: unknown parameter 'nesterov'"),
    ({"train": {"devices": 4, "strategy": "ddp"}}, "train.strategy: 'ddp' with devices 4 would"),
    ({"train": {"devices": "auto"}}, "train.strategy: 'auto' with devices 'auto' would"),
    ({"search": {"batch_size": [0, 8]}}, "search.batch_size: 0 is invalid"),
    ({"confirm": {"baseline": "gpt"}}, "confirm.baseline 'gpt' is not a candidate"),
    ({"task": {"name": "copy", "params": {"lenght": 4}}}, "task.params: unknown parameter 'lenght'"),
])
def test_errors_name_the_field(registry, changes, expected):
    assert expected in error_of(study(**changes), registry)


def test_incompatible_model_and_task_is_rejected(registry):
    data = study()
    data["candidates"][0]["model"]["attention"] = None
    data["candidates"][0]["model"]["name"] = "no_such_model"
    assert "candidates[0].model.name: unknown model 'no_such_model'" in error_of(data, registry)


# -- parameter-count matching --------------------------------------------------------------
def brute_force_width(space, cand, target: int) -> int:
    counts = {}
    for width in cand.widths:
        run = space.base_run_config(cand)
        run["model"]["params"][cand.width_param] = width
        model = harness.create_model(
            run["model"]["name"], vocab_size=space.task.vocab.size, max_length=64,
            attention=run["model"]["attention"]["name"], position=run["model"]["position"]["name"],
            registry=space.registry, **run["model"]["params"])
        counts[width] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return min(counts, key=lambda w: (abs(counts[w] - target), w))


@pytest.mark.parametrize("target", [500, 3000, 9000, 40_000, 10**7])
def test_width_matching_agrees_with_brute_force(registry, target):
    data = study(budget={"trials": 2, "steps": 20, "params": target})
    data["candidates"][0]["model"]["search"] = {"d_model": {"low": 8, "high": 96, "step": 4}}
    space = validate(parse_study_config(data), registry)
    for cand in space.candidates:
        width, count = space.match_width(cand, space.base_run_config(cand))
        assert width == brute_force_width(space, cand, target)
        run = space.base_run_config(cand)
        run["model"]["params"][cand.width_param] = width
        assert count == space.count_params(run)


def test_width_matching_skips_invalid_widths(registry):
    # heads=3 only divides some widths; the others are skipped, not fatal
    data = study(budget={"trials": 2, "steps": 20, "params": 6000})
    data["candidates"] = data["candidates"][:1]
    data["candidates"][0]["model"]["params"] = {"layers": 1, "heads": 3}
    data["candidates"][0]["model"]["search"] = {"d_model": [16, 20, 24, 28, 32, 40, 48, 60]}
    space = validate(parse_study_config(data), registry)
    cand = space.candidates[0]
    width, _ = space.match_width(cand, space.base_run_config(cand))
    assert width % 3 == 0
    trial = optuna.create_study().ask()
    run = space.run_config(cand, trial, seed=0)
    assert run["model"]["params"]["d_model"] % 3 == 0
    assert "model.d_model" not in trial.params  # the width is set, not searched


class NoWidthPlugin:
    """A throwaway model plugin that declares no width_param."""

    @harness.hookimpl
    def harness_register_model(self, register):
        spec = harness.list_plugins("model", registry=harness.load_plugins())
        transformer = next(s for s in spec if s.name == "transformer")
        register(dataclasses.replace(transformer, name="no_width", width_param=None, plugin=""))


def test_matching_needs_a_width_param():
    registry = harness.load_plugins(plugins=[NoWidthPlugin()])
    data = study(budget={"trials": 2, "steps": 20, "params": 5000})
    data["candidates"][1]["model"]["name"] = "no_width"
    msg = error_of(data, registry)
    assert "candidates[1].model.name: budget.params matches candidates' widths" in msg
    data["candidates"][1]["model"]["name"] = "transformer"
    data["candidates"][1]["model"]["params"]["d_model"] = 32
    assert "candidates[1].model.params.d_model: budget.params sets the width" in error_of(data, registry)


def test_multi_objective_disables_pruning_with_a_note(registry):
    space = validate(parse_study_config(study(cost={"metric": "params"})), registry)
    assert space.config.directions() == ["maximize", "minimize"]
    assert any("Optuna does not prune multi-objective" in n for n in space.notes)


def test_fingerprint_ignores_runtime_settings():
    a = parse_study_config(study())
    b = parse_study_config(study(resume={"heartbeat_s": 5}))
    c = parse_study_config(study(budget={"trials": 3, "steps": 20}))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


def test_int_range_with_step(registry):
    data = study()
    data["candidates"][0]["model"]["params"] = {"heads": 2}
    data["candidates"][0]["model"]["search"] = {"layers": {"low": 1, "high": 3, "step": 2}}
    space = validate(parse_study_config(data), registry)
    assert space.candidates[0].model.ranges["layers"] == IntRange(1, 3, step=2)


# -- the command line -------------------------------------------------------------------------
def write(tmp_path: Path, data: dict[str, Any], name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_bad_study_exits_2_and_creates_nothing(tmp_path, harness_home, capsys):
    path = write(tmp_path, study(candidates__0__model__position__name="rotary"))
    assert main(["study", "run", str(path)]) == 2
    err = one_paragraph(capsys.readouterr().err)
    assert "candidates[0].model.position.name: unknown position 'rotary'" in err
    assert not harness_home.exists() or not any(harness_home.iterdir())


def test_file_name_is_the_default_study_name(tmp_path):
    data = study()
    del data["name"]
    assert load_study_config(write(tmp_path, data, "my_study.yaml")).name == "my_study"
    assert load_study_config(write(tmp_path, data, "x.yaml"), name="other").name == "other"


def test_unknown_study_and_missing_storage(tmp_path, capsys):
    assert main(["study", "status", "nothing"]) == 2
    assert "there is no study storage" in flat(capsys.readouterr().err)
    url = f"sqlite:///{tmp_path / 'o.db'}"
    optuna.create_study(study_name="something", storage=url)
    assert main(["report", "nothing", "--storage", url]) == 2
    assert "no study named 'nothing'" in flat(capsys.readouterr().err)


def test_unreachable_storage_exits_2(tmp_path):
    path = write(tmp_path, study())
    out = subprocess.run(
        [sys.executable, "-m", "harness.cli", "study", "run", str(path), "--storage",
         "postgresql+psycopg://postgres@127.0.0.1:9/none"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "cannot open the Optuna storage postgresql+psycopg://postgres@127.0.0.1:9/none" in one_paragraph(out.stderr)


# -- shipped studies ----------------------------------------------------------------------------
STUDIES = sorted(p for p in (Path(__file__).parent.parent / "studies").glob("*.yaml")
                 if yaml.safe_load(p.read_text()).get("candidates")
                 and yaml.safe_load(p.read_text()).get("kind", "study") == "study")  # mad: test_mad


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_shipped_studies_validate(path, registry):
    """Every shipped study passes the checks `harness study run` makes before it creates
    anything (a component another plugin has not registered yet skips, with its name)."""
    config = load_study_config(path)
    header = path.read_text().split("\nname:")[0]
    assert "Published finding" in header, "the header names no published finding it revisits"
    assert "cpu " in header and "full " in header, "the header describes no profiles"
    try:
        space = validate(config, registry)
    except ConfigError as exc:
        if "Registered" in str(exc):  # an unknown-name error lists the registered names
            pytest.skip(f"needs a component that is not registered here: {exc}")
        raise
    assert space.candidates and config.budget.trials >= 1 and config.confirm.seeds >= 2


def test_optimizer_and_schedule_are_searched_like_any_training_setting(registry):
    cfg = parse_study_config(study(search={"optimizer": ["adamw", "sgd"],
                                           "schedule": ["constant", "inverse_sqrt"],
                                           "momentum": {"low": 0.5, "high": 0.95}}))
    space = validate(cfg, registry)
    trial = optuna.create_study().ask()
    run = space.run_config(space.candidates[0], trial, seed=0)
    assert run["train"]["optimizer"] in ("adamw", "sgd")
    assert run["train"]["schedule"] in ("constant", "inverse_sqrt")
    assert {"train.optimizer", "train.schedule", "train.momentum"} <= set(trial.params)
    with pytest.raises(ConfigError, match="search.optimizer"):
        validate(parse_study_config(study(search={"optimizer": ["adamw", "lion"]})), registry)


def test_widths_can_be_matched_by_decoding_state_size(registry):
    """budget.state_size: an attention model's KV cache grows with the training length, an
    LSTM's state with its width only; each width is the one whose state comes closest."""
    data = study(budget={"trials": 1, "steps": 5, "state_size": 2000})
    data["candidates"] = [
        {"name": "mha", "model": {"name": "transformer", "params": {"layers": 1, "heads": 2},
                                  "search": {"d_model": [8, 16, 32, 64, 128]}, "search_declared": False,
                                  "position": {"name": "none"}}},
        {"name": "lstm", "model": {"name": "lstm", "params": {"layers": 1},
                                   "search": {"width": [64, 256, 1000, 4000]}, "search_declared": False}},
    ]
    space = validate(parse_study_config(data), registry)
    length = space.task.train_length * 2 + 1 - 1  # copy as src SEP tgt: the model reads 2L positions
    for cand, expect in zip(space.candidates, ({w: 2 * w * length for w in (8, 16, 32, 64, 128)},
                                               {w: 2 * w for w in (64, 256, 1000, 4000)}), strict=True):
        width, state = space.match_width(cand, space.base_run_config(cand))
        assert state == expect[width]
        assert width == min(expect, key=lambda w: (abs(expect[w] - 2000), w))
    with pytest.raises(ConfigError, match="keep one"):
        parse_study_config(study(budget={"trials": 1, "steps": 5, "state_size": 10, "params": 10}))
    data["candidates"].append({"name": "mixer", "model": {"name": "mlp_mixer", "search_declared": False}})
    with pytest.raises(ConfigError, match="declares none"):
        validate(parse_study_config(data), registry)


def test_a_candidate_may_be_a_mixer_or_a_preset(registry):
    data = study()
    data["candidates"] = [
        {"name": "pp", "model": {"name": "transformer", "preset": "transformer++", "params": {"layers": 1, "heads": 2},
                                 "search_declared": False}},
        {"name": "gla", "model": {"name": "transformer", "params": {"layers": 1, "heads": 2},
                                  "search_declared": False, "mixer": {"name": "gla"},
                                  "position": {"name": "none"}}},
    ]
    space = validate(parse_study_config(data), registry)
    pp, gla = (space.run_config(c, None, seed=0) for c in space.candidates)
    assert pp["model"]["preset"] == "transformer++" and "mixer" not in pp["model"]
    assert gla["model"]["mixer"]["name"] == "gla"
    assert space.candidates[1].label() == "transformer · gla · none"
