"""Compute budgets (harness.run.flops, harness.study.budget): the FLOP count against the
analytic Transformer formula, a run whose steps follow from its FLOP budget landing on it, the
errors before anything runs, and a tiny real scaling study whose every run lands within 2% of
its budget and whose report fits the scaling law."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from harness.config import parse_run_config
from harness.errors import ConfigError
from harness.keys import Metric
from harness.run import flops
from harness.run.plan import load_registry, plan

VOCAB = 65  # char_lm's alphabet


def run_config(d: int = 64, layers: int = 2, length: int = 64, ffn: int = 4, **train: Any) -> dict[str, Any]:
    return {"task": {"name": "char_lm", "params": {"length": length, "num_train": 256, "num_val": 8}},
            "model": {"name": "transformer",
                      "params": {"d_model": d, "layers": layers, "heads": 4, "ffn_mult": ffn,
                                 "dropout": 0.0, "bias": False},
                      "attention": {"name": "multi_head"}, "position": {"name": "rope"}},
            "train": {"batch_size": 8, "progress": False, "val_every": 1000, "warmup_steps": 2,
                      "num_threads": 1, **train},
            "tracking": {"experiment": "flops"}}


def the_plan(cfg: dict[str, Any]) -> Any:
    c = parse_run_config(cfg)
    return plan(c, load_registry(c, None))


def weights(d: int, layers: int, ffn: int, vocab: int) -> int:
    """The weights of the matrix products of the Transformer above, by hand: per layer the
    four attention projections and the two MLP matrices, then the untied output head."""
    return layers * (4 * d * d + 2 * ffn * d * d) + d * vocab


def vocab_size(cfg: dict[str, Any]) -> int:
    from harness.run.build import build_task

    return int(build_task(the_plan(cfg), 0).vocab.size)


@pytest.mark.parametrize(("d", "layers", "length", "ffn"), [(64, 2, 64, 4), (128, 2, 128, 2)])
def test_the_transformer_count_is_6n_plus_12_layers_d_l_within_5_percent(d, layers, length, ffn):
    """Convention: N = the weights of matrix products, the output head included (untied) and
    embedding lookups excluded, biases and norms left out (element-wise); the attention term
    12·layers·d·L counts QK^T and AV over the full L x L (the causal mask not discounted),
    forward and backward. The fused CPU attention kernel is counted (torch counts only the
    CUDA ones)."""
    cfg = run_config(d, layers, length, ffn)
    cost = flops.probe(the_plan(cfg))
    analytic = 6 * weights(d, layers, ffn, vocab_size(cfg)) + 12 * layers * d * length
    assert cost.flops_per_token == pytest.approx(analytic, rel=0.05)
    assert cost.tokens_per_step == 8 * length


def test_the_count_is_exactly_6n_plus_14_layers_d_l_the_backward_recomputing_the_scores():
    """What the counter counts, to the FLOP: the fused kernels' backward recomputes QK^T, so
    attention costs 14 (not 12) x layers x d x L per token; at L >> d this is the gap to the
    12 convention (here 8%)."""
    d, layers, length, ffn = 32, 3, 128, 2
    cfg = run_config(d, layers, length, ffn)
    cost = flops.probe(the_plan(cfg))
    exact = 6 * weights(d, layers, ffn, vocab_size(cfg)) + 14 * layers * d * length
    assert cost.flops_per_token == pytest.approx(exact, rel=1e-9)
    assert cost.flops_per_token / (exact - 2 * layers * d * length) - 1 > 0.05


def test_without_the_cpu_attention_formula_attention_counts_nothing():
    """The reason for harness.run.flops.flop_counter: torch's own counter misses the CPU
    kernel, so the count would fall to 6N."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    p = the_plan(run_config(64, 2, 64, 4))
    from harness.run.build import build_model, build_task, task_info
    from harness.run.system import HarnessSystem, masked_stats

    task = build_task(p, 0)
    model = build_model(p, task_info(p, task))
    system = HarnessSystem(model, task, p.fmt, p.config.train)
    batch = p.fmt.collate(task.examples("train", 64)[:2], task.task_kind)
    with FlopCounterMode(display=False) as plain:
        masked_stats(system(batch), batch)["loss"].backward()
    with flops.flop_counter() as ours:
        masked_stats(system(batch), batch)["loss"].backward()
    tokens = 2 * 64
    attention = 14 * 2 * 64 * 64 * tokens  # forward 4, backward 10 (the scores recomputed)
    assert ours.get_total_flops() - plain.get_total_flops() == pytest.approx(attention, rel=0.01)
    assert torch.get_num_threads() >= 1


@pytest.mark.slow
def test_a_flop_budget_sets_the_steps_and_the_run_lands_within_2_percent():
    from harness.run.pipeline import train

    cfg = run_config(32, 1, 32, 2, max_flops=2e9)
    result = train(cfg)
    m = result.metrics
    assert m[Metric.BUDGET_FLOPS] == 2e9
    assert abs(m[Metric.TRAIN_FLOPS] / 2e9 - 1) < 0.02
    cost = flops.probe(the_plan(cfg))
    assert m[Metric.FLOPS_PER_TOKEN] == cost.flops_per_token  # the same counter, the same count
    assert m[Metric.TRAIN_STEPS] == round(2e9 / (cost.flops_per_token * cost.tokens_per_step)) > 50
    assert m[Metric.TRAIN_TOKENS] == m[Metric.TRAIN_STEPS] * 8 * 32
    assert result.config["train"]["max_steps"] == m[Metric.TRAIN_STEPS]


def test_a_token_budget_sets_the_steps():
    p = the_plan(run_config(32, 1, 32, 2, max_tokens=8 * 32 * 40))
    assert flops.resolve_steps(p) == 40


def test_a_flop_budget_smaller_than_one_step_is_refused_before_anything_runs(tmp_path):
    from harness.run.pipeline import train
    from harness.store import tracking

    with pytest.raises(ConfigError, match="smaller than one training step: one step costs"):
        train(run_config(32, 1, 32, 2, max_flops=1e3))
    assert not list(tracking.home().rglob("mlflow.db"))  # no store, so no run, was created


def test_a_compute_budget_replaces_max_steps_and_flops_and_tokens_exclude_each_other():
    """A run's logged config holds the derived max_steps beside max_flops: it re-runs as it ran."""
    with pytest.raises(ConfigError, match="max_flops and max_tokens both set"):
        parse_run_config(run_config(max_tokens=1000, max_flops=1e9))
    p = the_plan(run_config(32, 1, 32, 2, max_steps=7, max_tokens=8 * 32 * 40))
    assert flops.resolve_steps(p) == 40


# -- studies -------------------------------------------------------------------------------
STUDY: dict[str, Any] = {
    "name": "iso",
    "task": {"name": "char_lm", "params": {"length": 16, "num_train": 512, "num_val": 4}},
    "candidates": [{"name": "att", "model": {
        "name": "transformer", "params": {"layers": 1, "ffn_mult": 2, "dropout": 0.0},
        "search_declared": False, "attention": {"name": "multi_head", "search_declared": False},
        "position": {"name": "rope", "search_declared": False}}}],
    "objective": {"metric": "loss"},
    # every cell trains at least 50 steps, so rounding to whole steps stays under 1%
    "scaling": {"sizes": [{"d_model": 16, "heads": 2}, {"d_model": 24, "heads": 2},
                          {"d_model": 32, "heads": 2}],
                "budgets": [5e8, 1.6e9, 5e9],
                "transfer": {"rule": "scaled", "lr": 1e-2, "width": 16}},
    "train": {"batch_size": 8, "val_every": 1000, "warmup_steps": 2, "num_threads": 1},
    "budget": {"trials": 1},
    "pruner": {"name": "none"},
    "confirm": {"seeds": 2, "test": "t"},
    "resume": {"heartbeat_s": 1, "grace_s": 60, "poll_s": 0.3},
}


def study(tmp_path, **changes: Any) -> Any:
    from harness.study import profiles

    data = profiles.merge(STUDY, changes)
    path = tmp_path / "iso.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def load(path: Any) -> Any:
    from harness.study.schema import load_study_config
    from harness.study.space import load_registry as registry
    from harness.study.space import validate

    cfg = load_study_config(path)
    return validate(cfg, registry(cfg))


def test_a_scaling_study_crosses_candidates_sizes_and_budgets(tmp_path):
    space = load(study(tmp_path))
    names = [c.name for c in space.candidates]
    assert len(names) == 9 and names[0] == "att.s1.c5e8" and names[-1] == "att.s3.c5e9"
    run = space.run_config(space.candidates[3], None, seed=0)
    assert run["train"]["max_flops"] == 5e8 and "max_steps" not in run["train"]
    assert run["model"]["params"]["d_model"] == 24
    assert run["train"]["lr"] == pytest.approx(1e-2 * 16 / 24)  # the 1/width rule
    assert not any("fewer than 50 steps" in n for n in space.notes)


@pytest.mark.parametrize(("scaling", "message"), [
    ({"budgets": [1e8, 1e9]}, "at least 3 items"),
    ({"budgets": [1e8, 1e9, 1e9]}, "at least 3 distinct budgets"),
    ({"budgets": [1e8, 2e8, 5e8]}, "span at least 10x"),
    ({"sizes": [{"d_model": 16, "heads": 2}, {"d_model": 32, "heads": 2}]}, "at least 3 items"),
])
def test_a_bad_scaling_grid_is_refused_with_the_field(tmp_path, scaling, message):
    from harness.study.schema import load_study_config

    with pytest.raises(ConfigError, match=message) as err:
        load_study_config(study(tmp_path, scaling=scaling))
    assert "scaling" in str(err.value)


def test_a_size_that_makes_an_invalid_model_is_refused_before_anything_runs(tmp_path):
    sizes = [{"d_model": 16, "heads": 2}, {"d_model": 18, "heads": 4}, {"d_model": 32, "heads": 2}]
    with pytest.raises(ConfigError, match=r"scaling.sizes\[1\].*divisible by heads"):
        load(study(tmp_path, scaling={"sizes": sizes}))


def test_a_study_budget_smaller_than_one_step_is_refused_before_anything_runs(tmp_path):
    path = study(tmp_path, scaling={"budgets": [1e3, 1e5, 1e7]})
    with pytest.raises(ConfigError, match=r"att.s1.c1e3\): scaling.budgets .*smaller than one"):
        load(path)


def plain_study(path: Any, budget: dict[str, Any]) -> Any:
    """STUDY without its scaling section, one size, the given budget, written to ``path``."""
    data = copy.deepcopy(STUDY)
    data.pop("scaling")
    data["candidates"][0]["model"]["params"] |= {"d_model": 16, "heads": 2}
    data["budget"] = {"trials": 1, **budget}
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_plain_study_takes_a_flop_budget(tmp_path):
    path = plain_study(tmp_path / "plain.yaml", {"flops": 1e8})
    space = load(path)
    assert space.run_config(space.candidates[0], None, seed=0)["train"]["max_flops"] == 1e8
    plain_study(path, {"flops": 1e8, "steps": 10})
    with pytest.raises(ConfigError, match="budget.steps and budget.flops each set the length"):
        load(path)


#: The iso-FLOP test's grid at its smallest: sizes close together (the smallest model's steps
#: grow with the largest one's parameters), every cell at least 30 steps (rounding to whole
#: steps under 1/60 < 2%), no attention maps, 20 bootstrap replicates (the fits' intervals
#: coarse; what is checked is that each run lands on its budget and the fits are made).
TINY_ISO = {"scaling": {"sizes": [{"d_model": 16, "heads": 2}, {"d_model": 20, "heads": 2},
                                  {"d_model": 24, "heads": 2}],
                        "budgets": [2e8, 6e8, 2e9], "bootstrap": 20},
            "train": {"log_attention": False}}


@pytest.mark.slow
def test_a_tiny_iso_flop_study_lands_every_run_within_2_percent_and_fits(tmp_path, capsys):
    from harness.cli.main import main

    out = tmp_path / "report"
    assert main(["study", "run", str(study(tmp_path, **TINY_ISO)), "--report", "--out", str(out),
                 "--format", "md,json,csv"]) == 0
    assert "FAILED" not in capsys.readouterr().out
    data = json.loads((out / "scaling.json").read_text())
    runs = data["runs"]["att"]
    assert len(runs) == 18
    for r in runs:
        assert abs(r["realised"] / r["budget"] - 1) <= 0.02, r
    fit = data["fits"][0]
    assert fit["candidate"] == "att" and fit["alpha_low"] <= fit["alpha"] <= fit["alpha_high"]
    assert 10 <= fit["replicates"] <= 20  # scaling.bootstrap: the replicates asked for (those that fit)
    md = (out / "results.md").read_text()
    assert "## Scaling" in md and "Every run is within 2% of its budget" in md
    assert md.startswith("**Shared recipe, not tuned")
    assert (out / "scaling_frontier.png").exists() and (out / "scaling_isoflop.png").exists()
    assert "candidate,budget,params" in (out / "scaling_runs.csv").read_text()
    import harness  # the DataFrame export: the same fits from Python

    from_python = harness.study_summary("iso")["scaling"]
    assert from_python["fits"] == data["fits"] and from_python["crossovers"] == data["crossovers"]


def test_a_seconds_budget_caps_every_run_and_needs_steps(tmp_path):
    path = plain_study(tmp_path / "wall.yaml", {"seconds": 30})
    with pytest.raises(ConfigError, match="budget.seconds needs budget.steps"):
        load(path)
    plain_study(path, {"seconds": 30, "steps": 10_000})
    space = load(path)
    train = space.run_config(space.candidates[0], None, seed=0)["train"]
    assert (train["max_time_s"], train["max_steps"]) == (30, 10_000)
    from harness.report.scaling import compute_blocks

    assert "machine-dependent" in compute_blocks([], space.config)[1][1]


def test_the_scaled_rule_needs_the_width_in_every_size(tmp_path):
    from harness.study.schema import load_study_config

    sizes = [{"d_model": 16, "heads": 2}, {"layers": 2}, {"d_model": 32, "heads": 2}]
    with pytest.raises(ConfigError, match="scaling.transfer.width_param 'd_model', which every size must set"):
        load_study_config(study(tmp_path, scaling={"sizes": sizes}))
