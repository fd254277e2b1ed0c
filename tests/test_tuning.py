"""Tuning every profile can afford: the successive-halving pruner as a study configures it,
and every shipped CPU profile either tunes at least 6 configurations per candidate with the
same budget or is a shared recipe (which its report's first line then says)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from harness.study.schema import load_study_config, parse_study_config
from harness.study.worker import make_pruner

ROOT = Path(__file__).resolve().parents[1]
STUDIES = [p for p in sorted((ROOT / "studies").glob("*.yaml"))
           if "candidates" in yaml.safe_load(p.read_text())
           and yaml.safe_load(p.read_text()).get("kind", "study") == "study"]  # MAD suites: test_mad
BASE = {"task": {"name": "copy"}, "candidates": [{"name": "a", "model": {"name": "transformer"}}],
        "budget": {"trials": 6, "steps": 600}, "train": {"val_every": 100}}


def test_successive_halving_starts_at_val_every_or_min_resource():
    pruner = make_pruner(parse_study_config(BASE | {"pruner": {"name": "successive_halving"}}))
    assert isinstance(pruner, optuna.pruners.SuccessiveHalvingPruner)
    assert (pruner._min_resource, pruner._reduction_factor) == (100, 3)
    pruner = make_pruner(parse_study_config(
        BASE | {"pruner": {"name": "successive_halving", "min_resource": 300, "reduction_factor": 4}}))
    assert (pruner._min_resource, pruner._reduction_factor) == (300, 4)


def test_successive_halving_lets_only_the_best_past_a_rung():
    """With one worker, Optuna's asynchronous successive halving promotes the first trial and
    then only trials among the best third at the rung: most configurations cost one rung."""
    study = optuna.create_study(direction="minimize", pruner=make_pruner(parse_study_config(
        BASE | {"pruner": {"name": "successive_halving"}})))
    pruned = []
    for value in (1.0, 2.0, 0.5, 3.0, 4.0, 0.4):
        trial = study.ask()
        trial.report(value, 100)
        pruned.append(trial.should_prune())
        study.tell(trial, state=optuna.trial.TrialState.PRUNED if pruned[-1] else None,
                   values=None if pruned[-1] else [value])
    assert pruned == [False, True, False, True, True, False]


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_every_shipped_cpu_profile_tunes_six_configurations_or_is_a_shared_recipe(path):
    cfg = load_study_config(path, profile="cpu")
    if cfg.budget.trials == 1:
        return  # a shared recipe: the report's first line says "Shared recipe, not tuned"
    searched = {k: v for k, v in cfg.search.items() if not (isinstance(v, list) and len(v) == 1)}
    assert cfg.budget.trials >= 6 and "lr" in searched, path.name


@pytest.mark.slow
def test_a_real_study_tunes_under_successive_halving_and_confirms_the_best(tmp_path):
    """Six learning rates, a rung every 5 of 20 steps: the worse configurations stop at a rung
    (PRUNED), the best completes, and its configuration is the one confirmed."""
    from harness.cli.main import main
    from harness.keys import Phase
    from harness.study.storage import phase_study_name

    data = {"name": "sha", "task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 128,
                                                               "num_val": 32}},
            "candidates": [{"name": "mha", "model": {
                "name": "transformer", "params": {"layers": 1, "heads": 2, "d_model": 16, "ffn_mult": 2},
                "search_declared": False, "attention": {"name": "multi_head", "search_declared": False},
                "position": {"name": "sinusoidal", "search_declared": False}}}],
            "objective": {"metric": "acc"}, "search": {"lr": {"low": 1e-4, "high": 3e-2, "log": True}},
            "train": {"batch_size": 16, "val_every": 5, "warmup_steps": 2, "num_threads": 1},
            "budget": {"trials": 6, "steps": 20}, "confirm": {"seeds": 2},
            "sampler": {"name": "random", "seed": 3},
            "pruner": {"name": "successive_halving", "reduction_factor": 3},
            "resume": {"heartbeat_s": 1, "grace_s": 60, "poll_s": 0.3}}
    path = tmp_path / "sha.yaml"
    path.write_text(yaml.safe_dump(data))
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    assert main(["study", "run", str(path), "--storage", storage]) == 0
    def trials(phase: str) -> list[Any]:
        return optuna.load_study(study_name=phase_study_name("sha", phase, "mha"),
                                 storage=storage).get_trials(deepcopy=False)

    states = [t.state.name for t in trials(Phase.TUNE)]
    assert len(states) == 6 and "PRUNED" in states and "COMPLETE" in states
    assert [t.state.name for t in trials(Phase.CONFIRM)] == ["COMPLETE", "COMPLETE"]


def test_the_report_states_where_the_rungs_are():
    from harness.study.rungs import rungs_in_words

    def words(pruner: dict[str, Any], steps: int = 600) -> str:
        return rungs_in_words(parse_study_config(BASE | {"budget": {"trials": 6, "steps": steps},
                                                         "pruner": pruner}))

    assert words({"name": "successive_halving"}) == (
        "successive_halving pruner, rungs at 100 and 300 of 600 steps (factor 3)")
    assert words({"name": "successive_halving", "min_resource": 300}) == (
        "successive_halving pruner, rung at 300 of 600 steps (factor 3)")
    assert words({"name": "successive_halving", "reduction_factor": 2}, steps=800) == (
        "successive_halving pruner, rungs at 100, 200 and 400 of 800 steps (factor 2)")
    assert words({"name": "successive_halving", "min_resource": 600}) == (
        "successive_halving pruner, no rung before the last step (nothing is pruned)")
    assert words({"name": "none"}) == "no pruner"
    assert words({"name": "median", "startup_trials": 1, "warmup_steps": 50}) == (
        "median pruner from step 50, once 1 trial completed")


def test_the_recall_profiles_put_their_rung_past_the_short_horizon():
    """benchmarks/rung_fidelity.md: on MQAR a rung at 100 of 600 steps ranks learning rates
    by how fast they leave chance (Spearman rho 0.09-0.20 with the final ranking) and keeps one
    that never makes the late jump; from 300 on it ranks as the end does (0.83-0.89)."""
    for name in ("attention_variants", "recall_baselines"):
        from harness.study.rungs import first_rung

        cfg = load_study_config(ROOT / "studies" / f"{name}.yaml", profile="cpu")
        assert first_rung(cfg) >= 300, name
