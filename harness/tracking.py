"""MLflow tracking: the project-local store, runs with provenance, nesting by explicit id.

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

from harness.errors import HarnessError
from harness.keys import Tag

ENV_HOME = "HARNESS_HOME"
MAX_PARAM_LEN = 6000


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


def tracking_uri(explicit: str | None = None) -> str:
    uri = explicit or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    path = home()
    path.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path / 'mlflow.db'}"


def artifact_root() -> Path:
    return home() / "artifacts"


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists are kept as values."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
    else:
        out[prefix[:-1]] = data
    return out


def git_commit(cwd: str | os.PathLike[str] | None = None) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


class Tracker:
    """A thin layer over ``MlflowClient`` (no global active-run state)."""

    def __init__(self, uri: str | None = None) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri(uri)
        self.client = MlflowClient(tracking_uri=self.uri)

    def experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        try:
            exp = self.client.get_experiment_by_name(name)
        except MlflowException as exc:
            raise HarnessError(
                f"cannot reach the MLflow tracking store at {self.uri}: {exc.message}. Check "
                f"--tracking-uri / MLFLOW_TRACKING_URI, or start the server."
            ) from None
        except Exception as exc:  # connection errors from requests/sqlalchemy
            raise HarnessError(
                f"cannot reach the MLflow tracking store at {self.uri} ({type(exc).__name__}: "
                f"{exc}). Check --tracking-uri / MLFLOW_TRACKING_URI, or start the server."
            ) from None
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            return str(exp.experiment_id)
        location = None
        if self.uri.startswith("sqlite:") or self.uri.startswith("file:"):
            location = (artifact_root() / name).as_uri()
        try:
            return str(self.client.create_experiment(name, artifact_location=location))
        except MlflowException:  # created concurrently by another worker
            exp = self.client.get_experiment_by_name(name)
            assert exp is not None
            return str(exp.experiment_id)

    def start_run(
        self,
        experiment: str,
        *,
        run_name: str | None = None,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> str:
        all_tags = dict(tags or {})
        if parent_run_id:
            all_tags[Tag.PARENT_RUN] = parent_run_id
        run = self.client.create_run(self.experiment_id(experiment), run_name=run_name, tags=all_tags)
        return str(run.info.run_id)

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:MAX_PARAM_LEN]) for k, v in flatten(params).items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i: i + 100])

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)[:MAX_PARAM_LEN]) for k, v in tags.items() if v is not None]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, tags=items[i: i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(items), 500):
            self.client.log_batch(run_id, metrics=items[i: i + 500])

    def log_dict(self, run_id: str, data: dict[str, Any], name: str) -> None:
        self.client.log_dict(run_id, data, name)

    def log_artifact(self, run_id: str, path: str | os.PathLike[str], folder: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), folder)

    def end_run(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status)
