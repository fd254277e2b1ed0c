"""The worker loop's cheap storage queries (harness.study.counts) give the answers of Optuna's
public API (loading every trial) on a real SQLite storage, in-memory storages fall back to
that API, and a claimed trial cached alone records parameters like one from ``ask``."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from harness.study.counts import best_values, cache_trial, state_counts, waiting_trial_ids

optuna.logging.set_verbosity(optuna.logging.WARNING)
FINAL = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)


def shuffled_studies(storage: optuna.storages.BaseStorage, names: list[str], seed: int) -> None:
    """Each study gets a random number of enqueued slots; a random subset runs, some finish."""
    rng = random.Random(seed)
    for name in names:
        study = optuna.create_study(study_name=name, storage=storage)
        for _ in range(rng.randint(0, 12)):
            study.enqueue_trial({"x": rng.random()})
        for t in study.get_trials(deepcopy=False):
            if rng.random() < 0.5:
                tid = t._trial_id
                storage.set_trial_state_values(tid, TrialState.RUNNING)
                end = rng.choice((None, *FINAL))
                if end is not None:
                    storage.set_trial_state_values(tid, end, [rng.uniform(-5, 5)] if end == TrialState.COMPLETE else None)


def public_counts(storage: optuna.storages.BaseStorage, names: list[str]) -> dict[str, Counter[str]]:
    return {n: Counter(t.state.name for t in storage.get_all_trials(storage.get_study_id_from_name(n)))
            for n in names}


def public_waiting(storage: optuna.storages.BaseStorage, study_id: int, limit: int) -> list[int]:
    waiting = sorted(storage.get_all_trials(study_id, states=(TrialState.WAITING,)), key=lambda t: t.number)
    return [t._trial_id for t in waiting[:limit]]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_counts_and_waiting_ids_equal_the_public_api(tmp_path: Path, kind: str, seed: int) -> None:
    storage = (optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}") if kind == "sqlite"
               else optuna.storages.InMemoryStorage())
    names = ["a", "b", "c"]
    shuffled_studies(storage, names, seed)
    counts = state_counts(storage, names)
    assert counts == public_counts(storage, names)
    for name in names:
        study_id = storage.get_study_id_from_name(name)
        for limit in (1, 3, 100):
            assert waiting_trial_ids(storage, study_id, limit) == public_waiting(storage, study_id, limit)


def test_a_study_without_trials_counts_nothing(tmp_path: Path) -> None:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}")
    optuna.create_study(study_name="empty", storage=storage)
    assert state_counts(storage, ["empty"]) == {"empty": Counter()}
    assert waiting_trial_ids(storage, storage.get_study_id_from_name("empty")) == []


def test_a_claimed_trial_cached_alone_records_its_parameters(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}"
    storage = optuna.storages.RDBStorage(url)
    first = optuna.create_study(study_name="s", storage=storage)
    for x in (0.25, 0.75):
        first.enqueue_trial({"x": x})
    tid = waiting_trial_ids(storage, first._study_id, 1)[0]
    assert storage.set_trial_state_values(tid, TrialState.RUNNING)
    study = optuna.load_study(study_name="s", storage=url)  # a fresh object, like a worker's
    cache_trial(study, tid)
    trial = optuna.trial.Trial(study, tid)
    x = trial.suggest_float("x", 0.0, 1.0)
    study.tell(trial, x * 2)
    done = storage.get_trial(tid)
    assert done.state == TrialState.COMPLETE and done.params == {"x": 0.25} and done.values == [0.5]
    assert [t.state for t in storage.get_all_trials(first._study_id)] == [TrialState.COMPLETE, TrialState.WAITING]


def test_the_worker_loop_counts_and_claims_without_loading_every_trial(tmp_path: Path, monkeypatch) -> None:
    """What keeps a study's bookkeeping linear in its size (benchmarks/study_scale.md): the
    loop's progress equals the full progress (every trial loaded), and neither it nor claiming
    a slot loads all of a study's trials (``get_all_trials``, whose cost grows per trial)."""
    import yaml

    from harness.cli.main import main
    from harness.keys import Phase
    from harness.study.progress import progress, slot_progress
    from harness.study.storage import claim_slot, open_storage, open_study

    data = {"name": "counted", "task": {"name": "copy", "params": {"length": 4, "vocab": 4}},
            "candidates": [{"name": n, "model": {"name": "transformer", "search_declared": False,
                                                 "params": {"layers": 1, "heads": 2, "d_model": 8},
                                                 "attention": {"name": "multi_head", "search_declared": False},
                                                 "position": {"name": p, "search_declared": False}}}
                           for n, p in (("sin", "sinusoidal"), ("nope", "none"))],
            "search": {"lr": {"low": 1.0e-3, "high": 1.0e-2, "log": True}},
            "budget": {"trials": 6, "steps": 5}, "confirm": {"seeds": 2}}
    path = tmp_path / "counted.yaml"
    path.write_text(yaml.safe_dump(data))
    storage_url, uri = f"sqlite:///{tmp_path / 'o.db'}", f"sqlite:///{tmp_path / 'm.db'}"
    assert main(["study", "create", str(path), "--storage", storage_url, "--tracking-uri", uri]) == 0
    handle = open_study("counted", open_storage(storage_url), storage_url, uri)
    claimed = [claim_slot(handle, Phase.TUNE, "sin") for _ in range(3)]
    handle.storage.set_trial_state_values(claimed[0]._trial_id, TrialState.COMPLETE, [0.5])
    full = progress(handle)

    def loads_everything(*args, **kwargs):
        raise AssertionError("get_all_trials called by the worker loop")

    monkeypatch.setattr(type(handle.storage), "get_all_trials", loads_everything)
    counted = slot_progress(handle)
    assert [(c.name, c.tune, c.confirm) for c in counted.candidates] == \
        [(c.name, c.tune, c.confirm) for c in full.candidates]
    assert [c.best_value for c in counted.candidates] == [c.best_value for c in full.candidates]
    again = claim_slot(handle, Phase.TUNE, "sin")
    assert again is not None and again.number == 3  # the lowest waiting number
    assert slot_progress(handle).candidates[0].tune.running == 3


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_best_values_equal_the_public_api(tmp_path: Path, kind: str, seed: int) -> None:
    """The live display's best-so-far per candidate: one aggregate query on SQLite."""
    storage = (optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'o.db'}") if kind == "sqlite"
               else optuna.storages.InMemoryStorage())
    names = ["a", "b", "c", "d"]
    shuffled_studies(storage, names, seed)
    for maximize in (True, False):
        expected = {}
        for n in names:
            values = [t.values[0] for t in storage.get_all_trials(storage.get_study_id_from_name(n),
                                                                  states=(TrialState.COMPLETE,))]
            if values:
                expected[n] = max(values) if maximize else min(values)
        assert best_values(storage, names, maximize) == pytest.approx(expected)
