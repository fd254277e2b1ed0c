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
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import tracking
from harness.errors import ConfigError, HarnessError
from harness.study_config import COSTS, CandidateSpace, StudyConfig, StudySpace, parse_study_config

RECORD_ATTR = "harness.record"
SLOT_ATTR = "harness.slot"
SEED_ATTR = "harness.seed"
RUN_ATTR = "harness.mlflow_run_id"
CONFIG_ATTR = "harness.run_config"
FAILURE_ATTR = "harness.failure"
INTERRUPTED_TAG = "harness.interrupted"
PHASES = ("tune", "confirm")

Log = Callable[[str], None]


def phase_study_name(name: str, phase: str, candidate: str) -> str:
    return f"{name}/{phase}/{candidate}"


def default_storage_url() -> str:
    path = tracking.home()
    path.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path / 'optuna.db'}"


def redact(url: str) -> str:
    """A storage URL without its password (for messages and tags)."""
    try:
        from sqlalchemy.engine import make_url

        return str(make_url(url).render_as_string(hide_password=True))
    except Exception:
        return url.split("@")[-1] if "@" in url else url


@contextlib.contextmanager
def _quiet_experimental() -> Iterator[None]:
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", ".*Heartbeat of storage.*")
        yield


def open_storage(url: str | None, heartbeat_s: int | None = None, grace_s: int | None = None,
                 max_retry: int = 2, must_exist: bool = False) -> Any:
    """An Optuna RDB storage (SQLite by default). With ``heartbeat_s``, running trials record
    heartbeats and stale ones are re-enqueued up to ``max_retry`` times."""
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    url = url or default_storage_url()
    if must_exist and url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
        raise HarnessError(
            f"there is no study storage at {url}. Run `harness study run FILE` first, or pass "
            f"--storage with the URL the study was created in."
        )
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    try:
        with _quiet_experimental():
            retry = RetryHeartbeatStaleTrialCallback(max_retry=max_retry) if heartbeat_s else None
            return RDBStorage(url, engine_kwargs=engine, heartbeat_interval=heartbeat_s,
                              grace_period=grace_s, heartbeat_stale_trial_callback=retry)
    except Exception as exc:  # sqlalchemy connection/URL errors, a missing driver
        raise HarnessError(
            f"cannot open the Optuna storage {redact(url)} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}). Check --storage (for example "
            f"postgresql+psycopg://user@host:5432/db) and that the database server is running."
        ) from None


def make_sampler(config: StudyConfig, seed: int | None) -> Any:
    import optuna

    classes = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler,
               "nsgaii": optuna.samplers.NSGAIISampler}
    try:
        return classes[config.sampler.name](seed=seed, **config.sampler.options)
    except TypeError as exc:
        raise ConfigError(f"sampler.options: {exc}.") from None


def make_pruner(config: StudyConfig) -> Any:
    import optuna

    p = config.pruner
    if config.multi_objective or p.name == "none":
        return optuna.pruners.NopPruner()
    if p.name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials,
                                           n_warmup_steps=p.warmup_steps)
    val_every = min(int(config.train.get("val_every", 250)), config.budget.steps)
    return optuna.pruners.HyperbandPruner(min_resource=val_every, max_resource=config.budget.steps,
                                          reduction_factor=p.reduction_factor)


# -- the study handle ------------------------------------------------------------------------
@dataclass
class StudyHandle:
    """An existing study: its record, storage and tracking store."""

    name: str
    storage: Any
    storage_url: str
    record: dict[str, Any]
    config: StudyConfig
    tracker: tracking.Tracker

    @property
    def parent_run_id(self) -> str:
        return str(self.record["parent_run_id"])

    def load(self, phase: str, candidate: str, sampler: Any = None, pruner: Any = None) -> Any:
        import optuna

        return optuna.load_study(study_name=phase_study_name(self.name, phase, candidate),
                                 storage=self.storage,
                                 sampler=sampler or optuna.samplers.RandomSampler(),
                                 pruner=pruner or optuna.pruners.NopPruner())

    def experiment_id(self) -> str:
        return str(self.tracker.client.get_run(self.parent_run_id).info.experiment_id)


def _read_record(storage: Any, name: str) -> dict[str, Any] | None:
    from optuna.exceptions import OptunaError

    try:
        study_id = storage.get_study_id_from_name(name)
    except (KeyError, OptunaError):
        return None
    record = storage.get_study_user_attrs(study_id).get(RECORD_ATTR)
    return dict(record) if record else {}


def study_names(storage: Any) -> list[str]:
    return sorted(s.study_name for s in storage.get_all_studies()
                  if RECORD_ATTR in s.user_attrs)


def open_study(name: str, storage: Any, storage_url: str, tracking_uri: str | None = None) -> StudyHandle:
    """An existing study by name, or a HarnessError listing the studies in the storage."""
    import difflib

    record = _read_record(storage, name)
    if not record:
        names = study_names(storage)
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise HarnessError(
            f"no study named '{name}' in {redact(storage_url)}.{hint} Studies there: "
            f"{', '.join(names) or 'none'}. Pass --storage if it lives elsewhere."
        )
    config = parse_study_config(record["config"], f"the record of study '{name}'")
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or record.get("tracking_uri")
    handle = StudyHandle(name, storage, storage_url, record, config, tracking.Tracker(uri))
    if record.get("ready"):
        _check_parent(handle)
    return handle


def _check_parent(handle: StudyHandle) -> None:
    """Runs must nest under the study's parent run: it has to be in this tracking store."""
    try:
        handle.tracker.client.get_run(handle.parent_run_id)
    except Exception as exc:  # MlflowException (not found) or a connection error
        raise HarnessError(
            f"the MLflow parent run {handle.parent_run_id} of study '{handle.name}' is not in "
            f"the tracking store {handle.tracker.uri} ({type(exc).__name__}). Pass the "
            f"--tracking-uri the study was created with ({handle.record.get('tracking_uri')})."
        ) from None


def create_or_resume(space: StudySpace, storage: Any, storage_url: str,
                     tracking_uri: str | None = None, log: Log = print) -> StudyHandle:
    """Create the study (record, parent MLflow run, candidate studies, slots) once; a second
    call, or a concurrent one in another process, resumes it. A changed definition is an
    error: resuming would mix two protocols in one result."""
    import optuna

    config = space.config
    name = str(config.name)
    if _read_record(storage, name) is None:
        try:
            with _quiet_experimental():
                optuna.create_study(study_name=name, storage=storage)  # the creation lock
        except optuna.exceptions.DuplicatedStudyError:
            pass
        else:
            return _create(space, storage, storage_url, tracking_uri, log)
    record = _wait_until_ready(storage, name)
    handle = open_study(name, storage, storage_url, tracking_uri)
    if record["fingerprint"] != config.fingerprint():
        old, new = handle.config.protocol_dict(), config.protocol_dict()
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise ConfigError(
            f"study '{name}' already exists in {redact(storage_url)} with a different definition "
            f"(changed: {', '.join(changed)}). Resuming would mix two protocols in one result: "
            f"restore the file, or pass --study-name NEW to start a new study."
        )
    return handle


def _wait_until_ready(storage: Any, name: str, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        record = _read_record(storage, name)
        if record and record.get("ready"):
            return record
        if time.monotonic() > deadline:
            raise HarnessError(
                f"study '{name}' exists but was never fully created (its creator was "
                f"interrupted). Start it under a new name with --study-name."
            )
        time.sleep(0.5)


def _create(space: StudySpace, storage: Any, storage_url: str, tracking_uri: str | None,
            log: Log) -> StudyHandle:
    import optuna

    config = space.config
    name = str(config.name)
    tracker = tracking.Tracker(tracking_uri)
    experiment = config.tracking.experiment or name
    parent = tracker.start_run(experiment, run_name=name, tags={
        "harness.study": name, "harness.kind": "study", "harness.storage": redact(storage_url),
        "harness.fingerprint": config.fingerprint(), "harness.notes": "; ".join(space.notes),
    })
    tracker.log_params(parent, {"study": config.protocol_dict()})
    tracker.log_dict(parent, config.model_dump(mode="json"), "study.yaml")
    tracker.client.update_run(parent, status="SCHEDULED")
    with _quiet_experimental():
        for cand in space.candidates:
            for phase, seeds in (("tune", [None] * config.budget.trials),
                                 ("confirm", config.confirm_seeds())):
                study = optuna.create_study(study_name=phase_study_name(name, phase, cand.name),
                                            storage=storage,
                                            directions=config.directions())  # type: ignore[arg-type]
                study.set_user_attr("harness.candidate", cand.name)
                for slot, seed in enumerate(seeds):
                    attrs = {SLOT_ATTR: slot} | ({SEED_ATTR: seed} if seed is not None else {})
                    study.enqueue_trial({}, user_attrs=attrs)
    record = {
        "name": name, "config": config.model_dump(mode="json"), "fingerprint": config.fingerprint(),
        "parent_run_id": parent, "tracking_uri": tracker.uri, "experiment": experiment,
        "notes": space.notes, "train_length": space.train_length,
        "eval_lengths": list(space.eval_lengths), "created": time.time(), "ready": True,
    }
    storage.set_study_user_attr(storage.get_study_id_from_name(name), RECORD_ATTR, record)
    log(f"created study '{name}' in {redact(storage_url)}; MLflow parent run {parent}")
    return StudyHandle(name, storage, storage_url, record, config, tracker)


# -- progress ----------------------------------------------------------------------------------
@dataclass
class PhaseProgress:
    """The slots of one candidate in one phase, by state."""

    slots: int
    complete: int = 0
    pruned: int = 0
    failed: int = 0  # finally failed (not retried)
    retried: int = 0  # failed and re-enqueued (interrupted)
    running: int = 0
    waiting: int = 0

    @property
    def done(self) -> int:
        return self.complete + self.pruned + self.failed

    @property
    def finished(self) -> bool:
        return self.running == 0 and self.waiting == 0


@dataclass
class CandidateProgress:
    name: str
    tune: PhaseProgress
    confirm: PhaseProgress
    best_value: float | None = None
    best_trial: int | None = None
    confirm_values: dict[int, float] = field(default_factory=dict)  # seed -> objective


@dataclass
class StudyProgress:
    name: str
    candidates: list[CandidateProgress]
    parent_status: str

    @property
    def complete(self) -> bool:
        return all(c.tune.finished and c.confirm.finished for c in self.candidates)

    @property
    def running(self) -> int:
        return sum(c.tune.running + c.confirm.running for c in self.candidates)


def _retried_numbers(trials: list[Any]) -> set[int]:
    return {n for t in trials for n in t.system_attrs.get("retry_history", [])}


def phase_progress(trials: list[Any], slots: int) -> PhaseProgress:
    from optuna.trial import TrialState

    retried = _retried_numbers(trials)
    prog = PhaseProgress(slots)
    for t in trials:
        if t.state == TrialState.COMPLETE:
            prog.complete += 1
        elif t.state == TrialState.PRUNED:
            prog.pruned += 1
        elif t.state == TrialState.FAIL:
            if t.number in retried:
                prog.retried += 1
            else:
                prog.failed += 1
        elif t.state == TrialState.RUNNING:
            prog.running += 1
        else:
            prog.waiting += 1
    return prog


def best_trial(study: Any, config: StudyConfig) -> Any | None:
    """The best COMPLETE tuning trial: best objective; in a multi-objective study, the
    quality-best trial of the Pareto front."""
    from optuna.trial import TrialState

    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    if not config.multi_objective:
        return study.best_trial
    sign = 1 if config.objective.direction == "maximize" else -1
    return max(study.best_trials, key=lambda t: (sign * t.values[0], -t.number))


def progress(handle: StudyHandle) -> StudyProgress:
    from optuna.trial import TrialState

    config = handle.config
    out = []
    for cand in config.candidates:
        tune = handle.load("tune", cand.name)
        confirm = handle.load("confirm", cand.name)
        cp = CandidateProgress(cand.name, phase_progress(tune.get_trials(deepcopy=False), config.budget.trials),
                               phase_progress(confirm.get_trials(deepcopy=False), config.confirm.seeds))
        best = best_trial(tune, config)
        if best is not None:
            cp.best_value, cp.best_trial = best.values[0], best.number
        for t in confirm.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            cp.confirm_values[int(t.user_attrs[SEED_ATTR])] = t.values[0]
        out.append(cp)
    status = handle.tracker.client.get_run(handle.parent_run_id).info.status
    return StudyProgress(handle.name, out, status)


def describe(handle: StudyHandle, prog: StudyProgress) -> str:
    """The text of ``harness study status``."""
    cfg = handle.config
    obj = cfg.objective
    length = f"length {obj.length}" if obj.length else "the training length"
    lines = [
        f"study {handle.name}: {'complete' if prog.complete else 'in progress'}"
        f" ({prog.running} trial(s) running now)",
        f"  storage {redact(handle.storage_url)}; MLflow {handle.tracker.uri}, parent run "
        f"{handle.parent_run_id} ({prog.parent_status})",
        f"  objective: {obj.direction} val/{obj.metric} at {length}"
        + (f"; cost: {cfg.cost.metric}" if cfg.cost else "")
        + f"; sampler {cfg.sampler.name}; pruner {cfg.pruner.name}",
    ]
    lines += [f"  note: {n}" for n in handle.record.get("notes", [])]
    lines.append(f"  {'candidate':<24} {'tuning (done/budget)':<38} {'best':>8}   "
                 f"{'confirmation':<14} {'mean':>8}")
    for c in prog.candidates:
        t = c.tune
        detail = f"{t.complete} complete, {t.pruned} pruned, {t.failed} failed"
        if t.running or t.retried:
            detail += f", {t.running} running, {t.retried} interrupted"
        best = f"{c.best_value:.4g}" if c.best_value is not None else "-"
        mean = (f"{sum(c.confirm_values.values()) / len(c.confirm_values):.4g}"
                if c.confirm_values else "-")
        lines.append(f"  {c.name:<24} {f'{t.done}/{t.slots} ({detail})':<38} {best:>8}   "
                     f"{f'{c.confirm.done}/{c.confirm.slots} seeds':<14} {mean:>8}")
    if not prog.complete and prog.running == 0:
        lines.append("  no trial is running: resume with `harness study run FILE`.")
    return "\n".join(lines)


# -- reconciliation -----------------------------------------------------------------------------
def _trial_state(storage: Any, key: str) -> Any | None:
    from optuna.exceptions import OptunaError

    study_name, _, number = key.rpartition("#")
    try:
        study_id = storage.get_study_id_from_name(study_name)
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, int(number))
        return storage.get_trial(trial_id).state
    except (KeyError, ValueError, OptunaError):
        return None


def reconcile(handle: StudyHandle) -> list[str]:
    """End every child MLflow run still RUNNING whose Optuna trial is no longer running (its
    worker died): KILLED, tagged ``harness.interrupted=true``. Returns the run ids ended."""
    from optuna.trial import TrialState

    client = handle.tracker.client
    runs = client.search_runs(
        [handle.experiment_id()],
        f"tags.mlflow.parentRunId = '{handle.parent_run_id}' and attributes.status = 'RUNNING'",
    )
    ended = []
    for run in runs:
        state = _trial_state(handle.storage, run.data.tags.get("harness.trial", ""))
        if state in (TrialState.RUNNING, TrialState.WAITING):
            continue
        handle.tracker.set_tags(run.info.run_id, {INTERRUPTED_TAG: "true"})
        handle.tracker.end_run(run.info.run_id, "KILLED")
        ended.append(run.info.run_id)
    return ended


def settle_parent(handle: StudyHandle, prog: StudyProgress) -> None:
    """A complete study's parent run ends FINISHED (whoever notices first)."""
    if prog.complete and prog.parent_status != "FINISHED":
        handle.tracker.set_tags(handle.parent_run_id, {"harness.study_state": "complete"})
        handle.tracker.end_run(handle.parent_run_id, "FINISHED")


def fail_stale(handle: StudyHandle) -> None:
    """Mark trials whose worker stopped beating as FAIL; the storage's retry callback
    re-enqueues them (see :func:`open_storage`)."""
    import optuna

    with _quiet_experimental():
        for cand in handle.config.candidates:
            for phase in PHASES:
                optuna.storages.fail_stale_trials(handle.load(phase, cand.name))


# -- claiming and heartbeats ---------------------------------------------------------------------
@contextlib.contextmanager
def _claim_lock(storage_url: str) -> Iterator[None]:
    """SQLite has no row locks: serialise claims of processes on this machine with a file
    lock next to the database. PostgreSQL locks the row (SELECT ... FOR UPDATE)."""
    if not storage_url.startswith("sqlite:///"):
        yield
        return
    import fcntl

    with open(storage_url[len("sqlite:///"):] + ".claim-lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _claim(handle: StudyHandle, phase: str, candidate: str) -> Any | None:
    """Atomically move one WAITING slot of a candidate to RUNNING; its FrozenTrial or None."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    storage = handle.storage
    study_id = storage.get_study_id_from_name(phase_study_name(handle.name, phase, candidate))
    with _claim_lock(handle.storage_url):
        for t in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.WAITING,)):
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
            try:
                if storage.set_trial_state_values(trial_id, TrialState.RUNNING):
                    storage.record_heartbeat(trial_id)
                    return storage.get_trial(trial_id)
            except UpdateFinishedTrialError:
                continue
    return None


@contextlib.contextmanager
def heartbeat(storage: Any, trial_id: int, interval_s: float) -> Iterator[None]:
    """Record the trial's heartbeat every ``interval_s`` while the block runs."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval_s):
            with contextlib.suppress(Exception):  # a missed beat is retried next interval
                storage.record_heartbeat(trial_id)

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@dataclass
class Job:
    phase: str
    cand: CandidateSpace
    trial: Any  # FrozenTrial as claimed


def claim_next(handle: StudyHandle, space: StudySpace, prog: StudyProgress) -> Job | None:
    """Tuning first, the candidate with the fewest slots started (so an interrupted study has
    tuned every candidate about equally); then confirmation of candidates whose tuning ended."""
    by_name = {c.name: c for c in prog.candidates}
    fewest_started = sorted(space.candidates, key=lambda c: (-by_name[c.name].tune.waiting, c.index))
    for cand in fewest_started:
        if by_name[cand.name].tune.waiting:
            trial = _claim(handle, "tune", cand.name)
            if trial is not None:
                return Job("tune", cand, trial)
    for cand in space.candidates:
        if by_name[cand.name].tune.finished and by_name[cand.name].confirm.waiting:
            trial = _claim(handle, "confirm", cand.name)
            if trial is not None:
                return Job("confirm", cand, trial)
    return None


# -- running one job -----------------------------------------------------------------------------
def trial_callback(trial: Any, monitor: str, *, report: bool, prune: bool, max_steps: int) -> Any:
    """A Lightning callback that links the trial to its MLflow run and reports ``monitor``
    to Optuna at ``trainer.global_step`` after every validation, pruning when told to.

    Not ``optuna_integration.PyTorchLightningPruningCallback``: it reports at
    ``current_epoch``, but our runs validate every ``val_every`` optimizer steps inside one
    epoch, so all its reports would land on step 0 (Optuna keeps the first value of a step)
    and the pruner would compare first validations only. Only rank zero talks to Optuna; the
    decision is broadcast so every rank stops together under multi-device strategies.
    """
    import lightning as L
    import optuna

    class OptunaTrialCallback(L.Callback):
        def on_fit_start(self, trainer: Any, module: Any) -> None:
            run_id = getattr(trainer.logger, "run_id", None)
            if run_id and trainer.is_global_zero:
                trial.set_user_attr(RUN_ATTR, run_id)

        def on_validation_end(self, trainer: Any, module: Any) -> None:
            if trainer.sanity_checking or trainer.state.fn != "fit" or not report:
                return
            value = trainer.callback_metrics.get(monitor)
            if value is None:
                return
            step, value = trainer.global_step, float(value)
            stop = False
            if trainer.is_global_zero and math.isfinite(value):
                trial.report(value, step)
                stop = prune and step < max_steps and trial.should_prune()
            if trainer.strategy.broadcast(stop):
                raise optuna.TrialPruned(f"pruned at step {step} ({monitor} = {value:.4g})")

    return OptunaTrialCallback()


def objective_values(config: StudyConfig, space: StudySpace, result: Any) -> list[float]:
    from harness.system import metric_key

    key = metric_key(config.objective.metric, space.objective_length)
    if key not in result.metrics:
        na = f" It cannot run at lengths {result.not_applicable}." if result.not_applicable else ""
        raise HarnessError(
            f"the objective metric {key} was not logged.{na} Logged: "
            f"{', '.join(sorted(k for k in result.metrics if k.startswith('val/')))}."
        )
    values = [float(result.metrics[key])]
    if config.cost is not None:
        keys = COSTS[config.cost.metric][0]
        found = next((k for k in keys if k in result.metrics), None)
        if found is None:
            raise HarnessError(f"the cost metric ({' or '.join(keys)}) was not logged.")
        values.append(float(result.metrics[found]))
    if not all(math.isfinite(v) for v in values):
        raise HarnessError(f"the objective is not finite ({values}); the run diverged.")
    return values


def _find_run(handle: StudyHandle, key: str) -> str | None:
    runs = handle.tracker.client.search_runs(
        [handle.experiment_id()], f"tags.`harness.trial` = '{key}'", max_results=1)
    return runs[0].info.run_id if runs else None


def run_job(handle: StudyHandle, space: StudySpace, job: Job, worker: str, log: Log) -> str:
    """Run one claimed slot to a final Optuna state; returns that state's name."""
    import optuna
    from optuna.trial import TrialState

    from harness.run import train

    cfg = handle.config
    number = job.trial.number
    slot = int(job.trial.user_attrs[SLOT_ATTR])
    seed_base = cfg.sampler.seed
    sampler = make_sampler(cfg, None if seed_base is None else seed_base + 7919 * job.cand.index + slot)
    study = handle.load(job.phase, job.cand.name, sampler, make_pruner(cfg) if job.phase == "tune" else None)
    study_id = handle.storage.get_study_id_from_name(study.study_name)
    trial_id = handle.storage.get_trial_id_from_study_id_trial_number(study_id, number)
    key = f"{study.study_name}#{number}"
    tags = {"harness.study": handle.name, "harness.phase": job.phase, "harness.candidate": job.cand.name,
            "harness.trial": key, "harness.trial_number": str(number), "harness.slot": str(slot),
            "harness.worker": worker}
    label = f"[{job.phase} {job.cand.name} #{number}]"
    started = time.monotonic()
    with heartbeat(handle.storage, trial_id, cfg.resume.heartbeat_s):
        study.get_trials(deepcopy=False)  # like ask(): the study's storage now knows the trial
        trial = optuna.trial.Trial(study, trial_id)
        try:
            run = _job_run_config(handle, space, job, trial)
            tags["harness.seed"] = str(run["train"]["seed"])
            run["tracking"] = {"uri": handle.tracker.uri, "experiment": handle.record["experiment"],
                               "run_name": f"{job.cand.name} {job.phase} #{number}"}
            trial.set_user_attr(CONFIG_ATTR, run)
            callback = trial_callback(
                trial, f"val/{cfg.objective.metric}", report=not cfg.multi_objective,
                prune=job.phase == "tune" and not cfg.multi_objective, max_steps=cfg.budget.steps)
            result = train(run, registry=space.registry, parent_run_id=handle.parent_run_id,
                           callbacks=[callback], extra_tags=tags)
            trial.set_user_attr(RUN_ATTR, result.run_id)
            values = objective_values(cfg, space, result)
            study.tell(trial, values, skip_if_finished=True)
            log(f"{label} {' / '.join(f'{v:.4g}' for v in values)} ({time.monotonic() - started:.1f} s)")
            return "COMPLETE"
        except optuna.TrialPruned as exc:
            study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)
            log(f"{label} {exc}")
            return "PRUNED"
        except KeyboardInterrupt:
            _fail(handle, study, trial, key, tags, "interrupted (Ctrl-C)")
            retry = handle.storage.get_heartbeat_stale_trial_callback()
            if retry is not None:  # re-enqueue it like a trial whose worker died
                retry(study, handle.storage.get_trial(trial_id))
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            _fail(handle, study, trial, key, tags, reason)
            log(f"{label} FAILED: {reason}")
            return "FAIL"


def _job_run_config(handle: StudyHandle, space: StudySpace, job: Job, trial: Any) -> dict[str, Any]:
    cfg = handle.config
    if job.phase == "tune":
        return space.run_config(job.cand, trial, seed=cfg.seed)
    best = best_trial(handle.load("tune", job.cand.name), cfg)
    if best is None:
        raise HarnessError(
            f"candidate '{job.cand.name}' has no completed tuning trial (all failed or were "
            f"pruned), so there is no configuration to confirm; see `harness study status`."
        )
    run = copy.deepcopy(best.user_attrs[CONFIG_ATTR])
    run["train"]["seed"] = int(job.trial.user_attrs[SEED_ATTR])
    trial.set_user_attr("harness.tuning_trial", best.number)
    return dict(run)


def _fail(handle: StudyHandle, study: Any, trial: Any, key: str, tags: dict[str, str], reason: str) -> None:
    """FAIL the trial with its reason; make sure it has a (FAILED) MLflow run to show it."""
    from optuna.trial import TrialState

    trial.set_user_attr(FAILURE_ATTR, reason[:2000])
    run_id = _find_run(handle, key)
    if run_id is None:
        run_id = handle.tracker.start_run(handle.record["experiment"], parent_run_id=handle.parent_run_id,
                                          run_name=f"{tags['harness.candidate']} {tags['harness.phase']} "
                                                   f"#{tags['harness.trial_number']}",
                                          tags={**tags, "harness.failure": reason})
        handle.tracker.end_run(run_id, "FAILED")
    trial.set_user_attr(RUN_ATTR, run_id)
    study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)


# -- the worker ---------------------------------------------------------------------------------
@dataclass
class WorkerSummary:
    jobs: dict[str, int] = field(default_factory=dict)  # final state -> count
    complete: bool = False


def run_worker(handle: StudyHandle, space: StudySpace, log: Log = print) -> WorkerSummary:
    """Claim and run slots until the study is complete (or ``budget.time_total_s`` passed):
    retry interrupted trials, end orphaned runs, wait while other workers hold the last
    slots, and end the parent run FINISHED when everything is done."""
    cfg = handle.config
    worker = f"{socket.gethostname()}:{os.getpid()}"
    started = time.monotonic()
    summary = WorkerSummary()
    parent_running = False
    try:
        while True:
            fail_stale(handle)
            reconcile(handle)
            prog = progress(handle)
            if prog.complete:
                settle_parent(handle, prog)
                summary.complete = True
                return summary
            if cfg.budget.time_total_s and time.monotonic() - started > cfg.budget.time_total_s:
                log(f"budget.time_total_s ({cfg.budget.time_total_s:g} s) reached; stopping this worker")
                return summary
            job = claim_next(handle, space, prog)
            if job is None:
                time.sleep(cfg.resume.poll_s)  # other workers hold the remaining slots
                continue
            if not parent_running:
                handle.tracker.client.update_run(handle.parent_run_id, status="RUNNING")
                parent_running = True
            state = run_job(handle, space, job, worker, log)
            summary.jobs[state] = summary.jobs.get(state, 0) + 1
    finally:
        if not summary.complete and parent_running:
            _leave_parent(handle)


def _leave_parent(handle: StudyHandle) -> None:
    """An incomplete study's parent run stays RUNNING only while some trial runs."""
    with contextlib.suppress(Exception):
        prog = progress(handle)
        if prog.complete:
            settle_parent(handle, prog)
        elif prog.running == 0:
            handle.tracker.set_tags(handle.parent_run_id, {"harness.study_state": "incomplete"})
            handle.tracker.end_run(handle.parent_run_id, "KILLED")
