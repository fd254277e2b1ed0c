"""Where a study lives: the Optuna storage, the study's record, and its slots.

Owns opening the storage (SQLite by default; with heartbeats, so that the trials of a worker
that died are re-enqueued), the names of a study's Optuna studies, the record study
``NAME/_record`` and the :class:`StudyHandle` built from it, creating a study exactly once (parent MLflow run, one Optuna study per candidate and
phase, every slot enqueued as a WAITING trial) or resuming it, and the two operations through
which workers share the storage: claiming a slot atomically and beating a claimed slot's
heartbeat. The design is described in :mod:`harness.study`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, HarnessError
from harness.keys import Attr, Phase, Tag, val_key
from harness.store import tracking
from harness.store.guard import check_sqlite
from harness.store.lock import open_store, sqlite_file
from harness.store.masking import mask_url
from harness.study.schema import COSTS, NAME_PATTERN, StudyConfig, parse_study_config
from harness.study.space import StudySpace

Log = Callable[[str], None]


# -- names: what optuna-dashboard lists --------------------------------------------------------
#: The bookkeeping study of study NAME is ``NAME/_record`` (its definition, fingerprint and
#: MLflow parent run as user attributes; it holds no trials). Candidate names start with a
#: letter or digit, so no candidate study can take this name.
RECORD_SUFFIX = "_record"


def record_study_name(name: str) -> str:
    return f"{name}/{RECORD_SUFFIX}"


def phase_study_name(name: str, phase: str, candidate: str) -> str:
    """``NAME/CAND`` holds a candidate's tuning trials, ``NAME/CAND/confirm`` its
    confirmation runs (one trial per seed)."""
    return f"{name}/{candidate}" if phase == Phase.TUNE else f"{name}/{candidate}/{phase}"


def objective_names(space: StudySpace) -> list[str]:
    """The names of a candidate study's objective values (the MLflow metric keys)."""
    cfg = space.config
    names = [val_key(cfg.objective.name) if cfg.objective.over != "length"
             else val_key(cfg.objective.metric, space.objective_length)]
    if cfg.cost is not None:
        keys = COSTS[cfg.cost.metric][0]
        names.append(keys[0] if len(keys) == 1 else f"cost/{cfg.cost.metric}")
    return names


#: the Optuna storage URL when no --storage is given (a password kept off command lines)
ENV_STORAGE = "HARNESS_STORAGE"


def storage_url(explicit: str | None = None) -> str:
    """``--storage``, else ``$HARNESS_STORAGE``, else SQLite in the project's store."""
    return explicit or os.environ.get(ENV_STORAGE) or default_storage_url()


def default_storage_url() -> str:
    return f"sqlite:///{tracking.ensure_home() / 'optuna.db'}"


#: A storage URL without its password (for messages and tags): :func:`harness.store.masking.mask_url`.
redact = mask_url


#: Optuna's experimental features the harness itself chose (heartbeats, their retry callback,
#: failing stale trials, the names of a study's objectives): Optuna's warnings about them would
#: reach every user at every start
HARNESS_CHOSEN = ("RetryHeartbeatStaleTrialCallback", "heartbeat_interval", "fail_stale_trials",
                  "set_metric_names")


@contextlib.contextmanager
def quiet_experimental() -> Iterator[None]:
    """Optuna's warnings about the experimental features in :data:`HARNESS_CHOSEN` silenced
    (only those: a user's own experimental call still warns)."""
    import optuna

    with warnings.catch_warnings():
        for name in HARNESS_CHOSEN:
            warnings.filterwarnings("ignore", f".*{name}.* experimental",
                                    optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", ".*Heartbeat of storage.*")
        yield


def retry_callback(max_retry: int | None) -> Any:
    """Optuna's callback that re-enqueues a trial whose worker stopped (died, or was stopped
    by a signal), keeping its reports: the one place the harness makes it."""
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    with quiet_experimental():
        return RetryHeartbeatStaleTrialCallback(max_retry=max_retry, inherit_intermediate_values=True)


def open_storage(url: str | None, heartbeat_s: int | None = None, grace_s: int | None = None,
                 max_retry: int = 2, must_exist: bool = False, read_only: bool = False) -> Any:
    """An Optuna RDB storage (SQLite by default). With ``heartbeat_s``, running trials record
    heartbeats and stale ones are re-enqueued up to ``max_retry`` times. ``read_only``: no
    schema check or creation, and a SQLite file opened read-only (for status and listings)."""
    from optuna.storages import RDBStorage

    url = url or storage_url()
    if (must_exist or read_only) and url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
        raise HarnessError(
            f"there is no study storage at {url}. Run `harness study run FILE` first, or pass "
            f"--storage with the URL the study was created in."
        )
    engine: dict[str, Any] = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    if url.startswith("postgresql"):  # a server that does not answer: seconds, not minutes
        engine["connect_args"] = {"connect_timeout": 10}
    path = sqlite_file(url)
    if path is not None and read_only:  # a writer checks under the schema lock
        check_sqlite(path, "optuna")
    try:
        if read_only:
            with _no_schema_versioning():
                storage = RDBStorage(_read_only_url(url), engine_kwargs=engine,
                                     skip_table_creation=True, skip_compatibility_check=True)
            with storage.engine.connect():  # a wrong password or a closed port: here, not later
                pass
            return storage
        with quiet_experimental():
            # a retried trial keeps its reports (pruning decisions stay) and resumes from its
            # checkpoint when it has one (harness.study.worker)
            retry = retry_callback(max_retry) if heartbeat_s else None
            # a schema another Optuna client (optuna-dashboard) creates at the same moment: waited for
            return open_store(url, "optuna", lambda: RDBStorage(
                url, engine_kwargs=engine, heartbeat_interval=heartbeat_s, grace_period=grace_s,
                heartbeat_stale_trial_callback=retry))
    except HarnessError:
        raise
    except Exception as exc:  # sqlalchemy connection/URL errors, a missing driver
        raise HarnessError(
            f"cannot open the Optuna storage {redact(url)} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}). Check --storage (for example "
            f"postgresql+psycopg://user@host:5432/db) and that the database server is running."
        ) from None

@contextlib.contextmanager
def _no_schema_versioning() -> Iterator[None]:
    """Reading trials needs no schema-version bookkeeping; Optuna's imports alembic (0.6 s,
    and it may stamp a version: a write). Skipped where Optuna's layout is the one known."""
    try:
        from optuna.storages._rdb import storage as rdb
    except ImportError:  # another layout: construct the storage as usual
        yield
        return
    original = getattr(rdb, "_VersionManager", None)
    if original is None:
        yield
        return
    rdb._VersionManager = lambda *args, **kwargs: None  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        rdb._VersionManager = original  # type: ignore[misc]


def _read_only_url(url: str) -> str:
    """A SQLite database opened read-only (SQLite's URI ``mode=ro``); other URLs as given."""
    if not url.startswith("sqlite:///"):
        return url
    from urllib.parse import quote

    return f"sqlite:///file:{quote(url[len('sqlite:///'):])}?mode=ro&uri=true"


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
        study_id = storage.get_study_id_from_name(record_study_name(name))
    except (KeyError, OptunaError):
        _refuse_old_layout(storage, name)
        return None
    record = storage.get_study_user_attrs(study_id).get(Attr.RECORD)
    return dict(record) if record else {}


def _refuse_old_layout(storage: Any, name: str) -> None:
    """Studies created before the record moved to ``NAME/_record`` (their candidates were
    ``NAME/tune/CAND`` and ``NAME/confirm/CAND``) are not read or resumed."""
    from optuna.exceptions import OptunaError

    with contextlib.suppress(KeyError, OptunaError):
        study_id = storage.get_study_id_from_name(name)
        if Attr.RECORD in storage.get_study_user_attrs(study_id):
            raise HarnessError(
                f"study '{name}' was created by an earlier version of the harness, whose Optuna "
                f"studies are named {name}/tune/CANDIDATE; this version names them {name}/CANDIDATE "
                f"and cannot read or resume it. Run it under a new name (--study-name NEW), or "
                f"read the old one with the harness version that created it."
            )


def study_names(storage: Any, old_layout: bool = False) -> list[str]:
    """The studies in a storage (``old_layout``: those of an earlier version instead)."""
    suffix = "/" + RECORD_SUFFIX
    return sorted(s.study_name.removesuffix(suffix) for s in storage.get_all_studies()
                  if Attr.RECORD in s.user_attrs and s.study_name.endswith(suffix) != old_layout)


def resolve_name(storage: Any, name: str) -> str:
    """The study a user means by ``name``: the study of that name, else the one study named
    ``name-PROFILE`` that ran a profile of the file ``name`` (``quickstart`` is
    ``quickstart-cpu`` where only the CPU profile ran). Several such studies: an error naming
    them. Every command that takes a study name resolves it here (through :func:`open_study`)."""
    suffix = "/" + RECORD_SUFFIX
    profiled = []
    for s in storage.get_all_studies():
        record = s.user_attrs.get(Attr.RECORD)
        if not record or not s.study_name.endswith(suffix):
            continue
        full = s.study_name.removesuffix(suffix)
        if full == name:
            return name
        profile = (record.get("config") or {}).get("profile")
        if profile and full == f"{name}-{profile}":
            profiled.append(full)
    if len(profiled) > 1:
        raise HarnessError(
            f"study '{name}' ran with several profiles: {', '.join(sorted(profiled))}. Name the "
            f"one you mean."
        )
    return profiled[0] if profiled else name


def open_study(name: str, storage: Any, storage_url: str, tracking_uri: str | None = None,
               check_tracking: bool = True) -> StudyHandle:
    """An existing study by name (or by the name of its file without the profile suffix:
    :func:`resolve_name`), or a HarnessError listing the studies in the storage.
    ``check_tracking=False``: do not look for the parent run in MLflow (nor import it)."""
    import difflib
    import re

    name = resolve_name(storage, name)
    record = _read_record(storage, name) if re.match(NAME_PATTERN, name) else None
    if not record:
        names = study_names(storage)
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise HarnessError(
            f"no study named '{name}' in {redact(storage_url)}.{hint} Studies there: "
            f"{', '.join(names) or 'none'}. Pass --storage if it lives elsewhere."
        )
    config = parse_study_config(record["config"], f"the record of study '{name}'")
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or moved_with_storage(
        record.get("tracking_uri"), storage_url)
    handle = StudyHandle(name, storage, storage_url, record, config, tracking.Tracker(uri))
    if record.get("ready") and check_tracking:
        _check_parent(handle)
    return handle


def moved_with_storage(recorded: str | None, storage_url: str) -> str | None:
    """The recorded SQLite tracking URI of a study whose SQLite stores were copied or moved
    together (a project folder, ``.harness``): the ``mlflow.db`` next to the ``optuna.db`` in
    use now, not the original's absolute path (which would write into the original store)."""
    old, here = sqlite_file(recorded or ""), sqlite_file(storage_url)
    if old is None or here is None or old.parent == here.parent:
        return recorded
    candidate = here.parent / old.name
    return f"sqlite:///{candidate}" if candidate.exists() else recorded


def _check_parent(handle: StudyHandle) -> None:
    """Runs must nest under the study's parent run: it has to be in this tracking store."""
    try:
        handle.tracker.client.get_run(handle.parent_run_id)
    except Exception as exc:  # MlflowException (not found) or a connection error
        raise HarnessError(
            f"the MLflow parent run {handle.parent_run_id} of study '{handle.name}' is not in "
            f"the tracking store {redact(handle.tracker.uri)} ({type(exc).__name__}). Pass the "
            f"--tracking-uri the study was created with ({redact(str(handle.record.get('tracking_uri')))})."
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
            with quiet_experimental():
                optuna.create_study(study_name=record_study_name(name), storage=storage)  # the creation lock
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


#: The parent run's ``harness.candidate``: the name of its group in the grouped runs table.
SUMMARY_GROUP = "(study summary)"


def _create(space: StudySpace, storage: Any, storage_url: str, tracking_uri: str | None,
            log: Log) -> StudyHandle:
    import optuna

    from harness.study import grid
    from harness.study.schema import protocol_params

    config = space.config
    points = grid.points(config)  # sampler grid: tuning slot i tries point i
    name = str(config.name)
    tracker = tracking.Tracker(tracking_uri)
    experiment = config.tracking.experiment or name
    parent = tracker.start_run(experiment, run_name=name, tags={
        Tag.STUDY: name, Tag.KIND: "study", Tag.STORAGE: redact(storage_url),
        Tag.FINGERPRINT: config.fingerprint(), Tag.NOTES: "; ".join(space.notes),
        # the runs table grouped by candidate shows the parent as its own group under this
        # name (a run without the tag would be listed under "Additional runs")
        Tag.CANDIDATE: SUMMARY_GROUP,
    })
    tracker.log_params(parent, protocol_params(config))
    tracker.log_dict(parent, config.model_dump(mode="json"), "study.yaml")
    tracker.client.update_run(parent, status="SCHEDULED")
    with quiet_experimental():
        for cand in space.candidates:
            for phase, seeds in ((Phase.TUNE, [None] * config.budget.trials),
                                 (Phase.CONFIRM, config.confirm_seeds())):
                study = optuna.create_study(study_name=phase_study_name(name, phase, cand.name),
                                            storage=storage,
                                            directions=config.directions())  # type: ignore[arg-type]
                study.set_user_attr(Attr.CANDIDATE, cand.name)
                study.set_metric_names(objective_names(space))
                for slot, seed in enumerate(seeds):
                    attrs: dict[str, Any] = {Attr.SLOT: slot}
                    if seed is not None:
                        attrs[Attr.SEED] = seed
                    fixed = points[slot] if points and phase == Phase.TUNE else {}
                    study.enqueue_trial(fixed, user_attrs=attrs)
    from harness.run.plan import documents_of

    record = {
        "name": name, "config": config.model_dump(mode="json"), "fingerprint": config.fingerprint(),
        "parent_run_id": parent, "tracking_uri": tracker.uri, "experiment": experiment,
        "notes": space.notes, "train_length": space.train_length,
        "eval_lengths": list(space.eval_lengths), "created": time.time(), "ready": True,
        "documents": documents_of(space.task.config),
    }
    record_id = storage.get_study_id_from_name(record_study_name(name))
    storage.set_study_user_attr(record_id, "about", "the harness's bookkeeping for study "
                                f"'{name}' (no trials): its candidates are {name}/CANDIDATE")
    storage.set_study_user_attr(record_id, Attr.RECORD, record)
    log(f"created study '{name}' in {redact(storage_url)}; MLflow parent run {parent}")
    return StudyHandle(name, storage, storage_url, record, config, tracker)

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


def claim_slot(handle: StudyHandle, phase: str, candidate: str) -> Any | None:
    """Atomically move one WAITING slot of a candidate to RUNNING; its FrozenTrial or None."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    from harness.study.counts import waiting_trial_ids

    storage = handle.storage
    study_id = storage.get_study_id_from_name(phase_study_name(handle.name, phase, candidate))
    with _claim_lock(handle.storage_url):
        while ids := waiting_trial_ids(storage, study_id):  # other workers may take these first
            for trial_id in ids:
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
