"""Cheap questions to the Optuna storage, asked once per trial by every worker.

A worker's loop asks, before each trial, how many slots of each candidate wait, run and are
done, and then claims one waiting slot. Loading every trial to answer (``get_all_trials``,
what Optuna's own ``ask`` does for enqueued trials) costs time proportional to the study's
size per trial, so a study's bookkeeping grew with the square of its trials
(``benchmarks/study_scale.md``). Here both are single SQL queries on Optuna's tables:
a ``GROUP BY`` count of trial states per candidate study, and the first few waiting trial
ids of one study. Their cost grows with the size of the answer (a few rows), not with the
number of trials. The tables are Optuna's ORM models (``optuna.storages._rdb.models``),
whose schema Optuna migrates with alembic; a storage that is not an ``RDBStorage`` falls
back to Optuna's public API.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def _tables() -> Any | None:
    try:
        from optuna.storages._rdb import models
    except ImportError:  # pragma: no cover - a future Optuna without these models
        return None
    return models


def state_counts(storage: Any, study_names: list[str]) -> dict[str, Counter[str]]:
    """Per study name, the number of its trials in each state (``WAITING``, ``COMPLETE``, ...)."""
    from sqlalchemy import func, select

    models = _tables()
    out: dict[str, Counter[str]] = {name: Counter() for name in study_names}
    if models is None or not hasattr(storage, "engine"):
        for name in study_names:
            study_id = storage.get_study_id_from_name(name)
            out[name].update(t.state.name for t in storage.get_all_trials(study_id, deepcopy=False))
        return out
    study, trial = models.StudyModel, models.TrialModel
    query = (select(study.study_name, trial.state, func.count())
             .join(trial, trial.study_id == study.study_id)
             .where(study.study_name.in_(study_names))
             .group_by(study.study_name, trial.state))
    with storage.engine.connect() as conn:
        for name, state, count in conn.execute(query):
            out[name][getattr(state, "name", str(state))] = int(count)
    return out


def best_values(storage: Any, study_names: list[str], maximize: bool) -> dict[str, float]:
    """Per study name, the best objective value of its COMPLETE trials (studies with none are
    left out): one aggregate query, not a load of every trial."""
    from optuna.trial import TrialState
    from sqlalchemy import func, select

    models = _tables()
    if models is None or not hasattr(storage, "engine"):
        out = {}
        for name in study_names:
            values = [t.values[0] for t in storage.get_all_trials(
                storage.get_study_id_from_name(name), deepcopy=False, states=(TrialState.COMPLETE,))
                if t.values]
            if values:
                out[name] = max(values) if maximize else min(values)
        return out
    study, trial, value = models.StudyModel, models.TrialModel, models.TrialValueModel
    best = func.max(value.value) if maximize else func.min(value.value)
    query = (select(study.study_name, best)
             .join(trial, trial.study_id == study.study_id)
             .join(value, value.trial_id == trial.trial_id)
             .where(study.study_name.in_(study_names), trial.state == TrialState.COMPLETE,
                    value.objective == 0)
             .group_by(study.study_name))
    with storage.engine.connect() as conn:
        return {name: float(v) for name, v in conn.execute(query) if v is not None}


def waiting_trial_ids(storage: Any, study_id: int, limit: int = 8) -> list[int]:
    """The ids of up to ``limit`` WAITING trials of a study, lowest number first."""
    from optuna.trial import TrialState
    from sqlalchemy import select

    models = _tables()
    if models is None or not hasattr(storage, "engine"):
        waiting = storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.WAITING,))
        return [storage.get_trial_id_from_study_id_trial_number(study_id, t.number) for t in waiting[:limit]]
    trial = models.TrialModel
    query = (select(trial.trial_id).where(trial.study_id == study_id, trial.state == TrialState.WAITING)
             .order_by(trial.number).limit(limit))
    with storage.engine.connect() as conn:
        return [int(row[0]) for row in conn.execute(query)]


def cache_trial(study: Any, trial_id: int) -> None:
    """Let ``study``'s storage cache know one claimed trial, which Optuna's ``Trial`` needs to
    record parameters, without loading the study's other trials (``study.get_trials()``
    loads them all, waiting slots included, on every call through a new study object)."""
    cached = getattr(study, "_storage", None)
    add = getattr(cached, "_add_trials_to_cache", None)
    backend = getattr(cached, "_backend", None)
    if add is None or backend is None:  # another storage wrapper: the public, slower way
        study.get_trials(deepcopy=False)
        return
    add(study._study_id, [backend.get_trial(trial_id)])
