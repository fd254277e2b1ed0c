"""Tuning every profile can afford: the successive-halving pruner as a study configures it,
and every shipped CPU profile either tunes at least 6 configurations per candidate with the
same budget or is a shared recipe (which its report's first line then says)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from harness.study.schema import load_study_config, parse_study_config
from harness.study.worker import make_pruner

ROOT = Path(__file__).resolve().parents[1]
STUDIES = [p for p in sorted((ROOT / "studies").glob("*.yaml"))
           if "candidates" in yaml.safe_load(p.read_text())]
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
