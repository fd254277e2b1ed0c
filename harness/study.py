"""Optuna orchestration of a comparison study: storage, slots, workers, pruning, resumption.

One study definition lives in the Optuna storage as several Optuna studies::

    NAME                 the record: config, fingerprint, parent MLflow run id, tracking URI
    NAME/tune/CAND       per candidate: ``budget.trials`` slots to tune it
    NAME/confirm/CAND    per candidate: one slot per confirmation seed

**One Optuna study per candidate**, not one study with the candidate as a dimension: each
candidate gets exactly its own trial budget (a shared sampler would spend trials on the
candidates that look good early), the sampler models one search space at a time (candidates
have different hyper-parameters), and the median pruner compares a trial only with trials of
the same candidate — in a shared study a weaker architecture would be pruned for being
weaker, not for being badly tuned, and would end up with fewer full-length trials.

**Slots.** Creating a study enqueues every trial it will ever run as a WAITING Optuna trial
(``harness.slot`` user attr). A worker only *claims* a WAITING trial (WAITING -> RUNNING,
a row-locked update on PostgreSQL; serialised by a file lock on SQLite) and never creates
one, so several workers on several machines can neither run a slot twice nor exceed a
budget, and a candidate's budget is exactly its slots. A claimed trial records a heartbeat;
a worker that dies leaves it RUNNING without heartbeat, and after ``resume.grace_s`` the next
worker marks it FAIL and Optuna's ``RetryHeartbeatStaleTrialCallback`` re-enqueues the same
configuration as a new WAITING trial (``retry_history`` links the two), up to
``resume.max_retry`` times. The killed trial's MLflow run is ended KILLED with
``harness.interrupted=true`` (:func:`reconcile`).

Confirmation slots of a candidate are claimed only once its tuning slots are all finished;
they re-run its best configuration with fresh seeds.

The code is in three modules, re-exported here (the public entry point)::

    harness.study_storage   the storage, the record, creating or resuming, claiming, heartbeats
    harness.study_worker    the worker loop: next slot, one trial, pruning callback, failures
    harness.study_progress  slots by state, ``harness study status``, reconciling MLflow runs
"""

from __future__ import annotations

from harness.study_progress import (
    CandidateProgress,
    PhaseProgress,
    StudyProgress,
    best_trial,
    describe,
    fail_stale,
    phase_progress,
    progress,
    reconcile,
    settle_parent,
)
from harness.study_storage import (
    CONFIG_ATTR,
    FAILURE_ATTR,
    INTERRUPTED_TAG,
    PHASES,
    RECORD_ATTR,
    RUN_ATTR,
    SEED_ATTR,
    SLOT_ATTR,
    Log,
    StudyHandle,
    create_or_resume,
    default_storage_url,
    heartbeat,
    open_storage,
    open_study,
    phase_study_name,
    redact,
    study_names,
)
from harness.study_worker import (
    Job,
    WorkerSummary,
    claim_next,
    make_pruner,
    make_sampler,
    objective_values,
    run_job,
    run_worker,
    trial_callback,
)

__all__ = [
    # harness.study_storage
    "CONFIG_ATTR", "FAILURE_ATTR", "INTERRUPTED_TAG", "PHASES", "RECORD_ATTR", "RUN_ATTR",
    "SEED_ATTR", "SLOT_ATTR", "Log", "StudyHandle", "create_or_resume", "default_storage_url",
    "heartbeat", "open_storage", "open_study", "phase_study_name", "redact", "study_names",
    # harness.study_worker
    "Job", "WorkerSummary", "claim_next", "make_pruner", "make_sampler", "objective_values",
    "run_job", "run_worker", "trial_callback",
    # harness.study_progress
    "CandidateProgress", "PhaseProgress", "StudyProgress", "best_trial", "describe",
    "fail_stale", "phase_progress", "progress", "reconcile", "settle_parent",
]
