"""MLflow tracking: the project-local store, runs with provenance, nesting by explicit id.

Every value logged (params, tags, dict artifacts) has its URL passwords masked
(:mod:`harness.store.masking`); experiment names become artifact folders only through
:func:`safe_folder`, which no name can escape.

Default store (no server, no configuration): ``$HARNESS_HOME`` or ``./.harness`` holding
``mlflow.db`` (SQLite backend) and ``artifacts/``. ``--tracking-uri`` or
``MLFLOW_TRACKING_URI`` switch to a server. Child runs name their parent explicitly
(``mlflow.parentRunId``), so workers in other processes or machines nest correctly.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, HarnessError
from harness.keys import Tag
from harness.store.masking import mask_text, mask_url, split_credentials

ENV_HOME = "HARNESS_HOME"
#: artifacts of every experiment the harness creates go under this URI when set (s3://..., a
#: shared folder): for a database store shared by machines (see the scale-out recipe)
ENV_ARTIFACTS = "HARNESS_ARTIFACT_URI"
MAX_PARAM_LEN = 6000
#: MLflow 3 opens an experiment without this tag in its GenAI view (traces; the runs table
#: hidden): the harness's experiments say they hold model-training runs.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


STORE_DIR = ".harness"


def home() -> Path:
    """The project's folder for stores and artifacts: ``$HARNESS_HOME``, else the nearest
    ``.harness`` folder in the working directory or one of its parents (as git finds its
    repository, so a command run from a sub-folder uses the project's store), else a new
    ``.harness`` in the working directory."""
    explicit = os.environ.get(ENV_HOME)
    if explicit:
        return Path(explicit).resolve()
    cwd = Path.cwd().resolve()
    for folder in (cwd, *cwd.parents):
        if (folder / STORE_DIR).is_dir():
            return folder / STORE_DIR
    return cwd / STORE_DIR


def checked_home() -> Path:
    """:func:`home`, or a clean error when it is a file (nothing is created)."""
    path = home()
    if path.exists() and not path.is_dir():
        raise HarnessError(f"the harness's store folder {path} ($HARNESS_HOME or ./.harness) is a "
                           f"file, not a folder; nothing was written. Point HARNESS_HOME at a "
                           f"folder, or move the file aside.")
    return path


def ensure_home() -> Path:
    """:func:`home`, created if missing; a clean error when it cannot be a folder (a file of
    that name, a read-only parent)."""
    path = checked_home()
    new = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HarnessError(f"the harness's store folder {path} cannot be created ({exc.strerror}); "
                           f"nothing was written. Point HARNESS_HOME at a writable folder.") from None
    if new and not os.environ.get(ENV_HOME):
        import sys

        # a command run outside the project would otherwise record into a store nobody looks at
        print(f"harness: no .harness store in {path.parent} or its parents: created a new one, "
              f"{path} (runs from other folders use theirs; set HARNESS_HOME to pick one, and "
              f"run `harness ui` from this folder to see these runs)", file=sys.stderr, flush=True)
    return path


def tracking_uri(explicit: str | None = None) -> str:
    uri = explicit or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{ensure_home() / 'mlflow.db'}"


#: URI schemes MLflow keeps runs in (a bare path is a file store); ``+driver`` suffixes allowed
SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "file", "http", "https", "databricks")
#: how long a tracking server has to accept a connection before a command gives up
PROBE_TIMEOUT_S = 5.0


def preflight(uri: str | None) -> str:
    """Fail within seconds, before anything is built or recorded, where the tracking store
    cannot be used: a scheme MLflow has no store for, a SQLite store that exists but is damaged
    or cannot be written (:mod:`harness.store.guard`), a file store in a folder that cannot be
    made, a server that does not accept connections (instead of MLflow's minutes of HTTP
    retries). Returns the URI, credentials moved out (:func:`without_credentials`)."""
    from urllib.parse import urlsplit

    from harness.store.guard import check_sqlite, check_writable, pseudo_fs
    from harness.store.lock import sqlite_file

    uri = without_credentials(uri or os.environ.get("MLFLOW_TRACKING_URI")
                              or f"sqlite:///{checked_home() / 'mlflow.db'}")  # nothing created
    shown = bounded(mask_url(uri))
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if "://" in uri or uri.startswith(
        ("sqlite:", "file:")) else ""
    if scheme and scheme not in SCHEMES:
        raise ConfigError(f"tracking URI {shown}: MLflow keeps no runs in a '{scheme}:' store. Use "
                          f"sqlite:///PATH.db, postgresql://HOST/DB, http(s)://SERVER or "
                          f"file:///FOLDER (--tracking-uri, tracking.uri or MLFLOW_TRACKING_URI).")
    path = sqlite_file(uri)
    if path is not None:
        check_writable(path, "mlflow")
        check_sqlite(path, "mlflow")  # again under the schema lock when it is opened
    elif scheme == "sqlite":
        raise ConfigError(f"tracking URI {shown}: a SQLite store needs a file path "
                          f"(sqlite:///relative.db or sqlite:////absolute/path.db).")
    elif scheme in ("file", ""):
        folder = Path(urlsplit(uri).path if scheme else uri)
        existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
        if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK) or pseudo_fs(existing):
            raise ConfigError(f"tracking URI {shown}: the folder {folder} cannot be created or "
                              f"written; nothing was recorded. Give a writable folder.")
    elif scheme in ("http", "https"):
        probe_server(uri)
    return uri


def probe_server(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """A TCP connection to an MLflow server's host and port, or a one-paragraph error."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname or ""
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    raise HarnessError(f"cannot reach the MLflow tracking server {bounded(mask_url(uri))} "
                       f"({reason}, within {timeout_s:g} s); nothing was recorded. Start the "
                       f"server (or `harness ui`), or check --tracking-uri / MLFLOW_TRACKING_URI.")


def bounded(text: str, limit: int = 200) -> str:
    """A value echoed in a message, cut to ``limit`` characters."""
    from harness.errors import shorten

    return shorten(text, limit)


def without_credentials(uri: str) -> str:
    """An HTTP(S) URI's ``user:password@`` moved into MLflow's credential variables for this
    process (and the processes it starts), so that the URI the harness uses, prints and
    records has none. Variables the user set win."""
    bare, user, password = split_credentials(uri)
    if user is not None:
        os.environ.setdefault("MLFLOW_TRACKING_USERNAME", user)
    if password is not None:
        os.environ.setdefault("MLFLOW_TRACKING_PASSWORD", password)
    return bare


def artifact_root() -> Path:
    return home() / "artifacts"


def safe_folder(name: str) -> str:
    """The folder name of a user-given name (an experiment): letters, digits, '_', '-' and
    '.' kept, anything else (separators, spaces, control characters) replaced by '_', never
    '.' or '..' or hidden; a short hash keeps two names that map alike apart."""
    import hashlib
    import re

    folder = re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".")[:100] or "_"
    if folder != name:
        folder += "-" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return folder


def inside(root: Path, name: str) -> Path:
    """``root / safe_folder(name)``, checked to lie inside ``root`` (no escape by any name)."""
    path = (root / safe_folder(name)).resolve()
    if path.parent != root.resolve():
        raise ConfigError(f"the name {name!r} would make a folder outside {root}; rename it.")
    return path


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists are kept as values."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
    else:
        out[prefix[:-1]] = data
    return out


def param_value(value: Any) -> str:
    """A parameter as a value, not a Python repr: strings as they are, everything else as
    JSON (``true``, ``null``, ``[16, 32]``, ``{"name": "rope"}``)."""
    import json

    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


def git_commit(cwd: str | os.PathLike[str] | None = None) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


#: tracking servers this process has reached (each is probed once)
_reachable: set[str] = set()


class Tracker:
    """A thin layer over ``MlflowClient`` (no global active-run state)."""

    def __init__(self, uri: str | None = None) -> None:
        self.uri = without_credentials(tracking_uri(uri))
        self._client: Any = None

    @property
    def client(self) -> Any:
        """The ``MlflowClient``, created (and mlflow imported) on first use."""
        if self._client is None:
            from mlflow.tracking import MlflowClient

            from harness.store.lock import open_store

            if self.uri.startswith(("http://", "https://")) and self.uri not in _reachable:
                probe_server(self.uri)  # seconds, not MLflow's minutes of retries
                _reachable.add(self.uri)
            # an empty database gets its schema once, also when another MLflow client (mlflow
            # ui, a notebook) creates it at the same moment: that one is waited for
            self._client = open_store(self.uri, "mlflow", lambda: MlflowClient(tracking_uri=self.uri))
        return self._client

    def experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        try:
            exp = self.client.get_experiment_by_name(name)
        except MlflowException as exc:
            raise HarnessError(
                f"cannot reach the MLflow tracking store at {bounded(mask_url(self.uri))}: "
                f"{bounded(str(exc.message).strip().splitlines()[0] if str(exc.message).strip() else '', 300)}. Check "
                f"--tracking-uri / MLFLOW_TRACKING_URI, or start the server."
            ) from None
        except Exception as exc:  # connection errors from requests/sqlalchemy
            raise HarnessError(
                f"cannot reach the MLflow tracking store at {bounded(mask_url(self.uri))} ({type(exc).__name__}: "
                f"{bounded(str(exc), 300)}). Check --tracking-uri / MLFLOW_TRACKING_URI, or start the server."
            ) from None
        if exp is not None:
            self._check_location(exp)
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            if EXPERIMENT_KIND[0] not in exp.tags:  # created by an older harness or by hand
                self.client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
            return str(exp.experiment_id)
        location = self.artifact_location(name)
        try:
            return str(self.client.create_experiment(name, artifact_location=location,
                                                     tags=dict([EXPERIMENT_KIND])))
        except MlflowException:  # created concurrently by another worker
            exp = self.client.get_experiment_by_name(name)
            assert exp is not None
            return str(exp.experiment_id)

    def artifact_location(self, name: str) -> str | None:
        """Where a new experiment keeps its artifacts: ``$HARNESS_ARTIFACT_URI/<name>`` when set
        (object storage shared by the workers of a database store on several machines), else a
        folder under the store's ``artifacts/``; None for a tracking server (the server decides,
        ``mlflow-artifacts:``). Never MLflow's default, ``./mlruns`` of whatever folder the
        process started in."""
        if self.uri.startswith(("http://", "https://", "databricks")):
            return None
        shared = os.environ.get(ENV_ARTIFACTS)
        if shared:
            return f"{shared.rstrip('/')}/{safe_folder(name)}"
        return inside(artifact_root(), name).as_uri()

    def _check_location(self, exp: Any) -> None:
        """Refuse an existing experiment whose artifacts would land outside the store: MLflow's
        ``Default`` (its artifacts go to ``mlruns/0`` of the folder the store was created in)
        and, in a local SQLite store, any experiment whose artifact folder is not under the
        store's (made by hand, or a store copied from elsewhere)."""
        location = str(exp.artifact_location or "")
        root = artifact_root().resolve().as_uri()
        shared = os.environ.get(ENV_ARTIFACTS)
        outside = exp.name == "Default" or (
            self.uri.startswith("sqlite:") and not location.startswith(root + "/")
            and not (shared and location.startswith(shared.rstrip("/") + "/")))
        if outside:
            raise ConfigError(
                f"experiment '{bounded(exp.name)}' keeps its artifacts in {bounded(location)}, outside "
                f"this store ({root}): runs logged there would leave their files behind whenever "
                f"the store is moved or shared. Name another experiment (tracking.experiment / "
                f"--experiment); the harness creates it with its artifacts under the store."
            )

    def start_run(
        self,
        experiment: str,
        *,
        run_name: str | None = None,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        all_tags = {k: mask_text(str(v)) for k, v in (tags or {}).items()}
        if parent_run_id:
            all_tags[Tag.PARENT_RUN] = parent_run_id
        run = self.client.create_run(self.experiment_id(experiment), run_name=run_name, tags=all_tags)
        return str(run.info.run_id)

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, mask_text(param_value(v))[:MAX_PARAM_LEN]) for k, v in flatten(params).items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i: i + 100])

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, mask_text(str(v))[:MAX_PARAM_LEN]) for k, v in tags.items() if v is not None]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, tags=items[i: i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(items), 500):
            self.client.log_batch(run_id, metrics=items[i: i + 500])

    def log_series(self, run_id: str, series: dict[str, dict[int, float]]) -> None:
        """Metrics with their own steps (``{key: {step: value}}``), in one batch."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, points in series.items()
                 for step, v in sorted(points.items())]
        for i in range(0, len(items), 500):
            self.client.log_batch(run_id, metrics=items[i: i + 500])

    def log_dict(self, run_id: str, data: dict[str, Any], name: str) -> None:
        """Log ``data`` as an artifact (YAML or JSON by the name's suffix), passwords masked."""
        import json

        self.client.log_dict(run_id, json.loads(mask_text(json.dumps(data))), name)

    def log_artifact(self, run_id: str, path: str | os.PathLike[str], folder: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), folder)

    def rename(self, run_id: str, name: str) -> None:
        self.client.update_run(run_id, name=name)

    def end_run(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status)
