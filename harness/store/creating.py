"""A new SQLite store appears whole, and one another program is creating is waited for.

MLflow creates its schema in steps that each commit on their own (tables, then some fifty
Alembic migrations that add columns and rebuild tables), and so does Optuna (tables, a
version row, an Alembic stamp). Two programs that create one new SQLite store at the same
moment interleave those steps: one of them dies with ``table ... already exists`` or
``duplicate column name``, and the store can be left half-migrated for good (leftover
``_alembic_tmp_*`` tables that every later opening trips on). The harness's own lock
(:mod:`harness.store.lock`) orders harness processes only; a plain ``mlflow ui``, a
notebook's ``MlflowClient`` or optuna-dashboard does not take it. So the harness never
creates a schema in place:

- :func:`publish_new`: a store that does not exist is built whole in a temporary file next
  to it and published with ``link()``, which fails if the name was taken meanwhile; another
  program that opens the store afterwards finds a complete schema and creates nothing;
- :func:`wait_for_creator`: a store that exists but whose schema is not complete (another
  program is creating it, or took the name first) is waited for while it keeps changing,
  then opened as it is; one that stopped changing incomplete (an old store that needs
  ``mlflow db upgrade``, or one another program abandoned) is left to the usual opening.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import time
from pathlib import Path
from urllib.parse import quote

#: a store whose schema is incomplete and has not changed for this long is no longer being
#: created (the longest pause of MLflow's own creation: importing Alembic and its scripts)
QUIET_S = 5.0


def publish_new(path: Path, store: str) -> bool:
    """Build the schema of ``store`` ("mlflow" or "optuna") in a temporary file and publish it
    as ``path``; False when ``path`` exists (already, or taken by another program meanwhile)
    or this file system cannot link (then the store is created in place, as before)."""
    if os.path.lexists(path):
        return False
    temporary = path.with_name(f".{path.name}.creating-{os.getpid()}-{time.monotonic_ns()}")
    try:
        try:
            _make_schema(f"sqlite:///{temporary}", store)
        except (ImportError, AttributeError):  # another MLflow's or Optuna's layout: in place
            return False
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        except OSError:  # no hard links here (some network or FAT file systems)
            return False
        return True
    finally:
        for leftover in (temporary, temporary.with_name(temporary.name + "-journal")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()


def _make_schema(url: str, store: str) -> None:
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    if store == "optuna":
        from optuna.storages import RDBStorage

        RDBStorage(url, engine_kwargs={"poolclass": NullPool}).engine.dispose()
        return
    from mlflow.store.db import utils

    engine = sqlalchemy.create_engine(url, poolclass=NullPool)
    try:
        utils._initialize_tables(engine)
    finally:
        engine.dispose()


def complete(path: Path, store: str) -> bool:
    """Whether the SQLite store at ``path`` holds ``store``'s whole current schema, so that
    opening it writes nothing to the schema: every table, and MLflow's Alembic revision at
    its head (Optuna's: its version row and Alembic stamp)."""
    try:
        con = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=10)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if not _tables(store) <= tables or "alembic_version" not in tables:
                return False
            revisions = {r[0] for r in con.execute("SELECT version_num FROM alembic_version")}
            if store == "optuna":
                return bool(revisions) and con.execute("SELECT count(*) FROM version_info").fetchone()[0] > 0
        finally:
            con.close()
    except sqlite3.Error:  # being written, or unreadable: the usual opening says which
        return False
    return revisions == {_mlflow_head()}


def _tables(store: str) -> set[str]:
    if store == "optuna":
        from optuna.storages._rdb import models

        return set(models.BaseModel.metadata.tables)
    from mlflow.store.db import utils

    return set(utils.Base.metadata.tables)


@functools.cache
def _mlflow_head() -> str:
    from mlflow.store.db import utils

    return str(utils._get_latest_schema_revision())


def _state(path: Path) -> tuple[tuple[int, int] | None, ...]:
    """What changes while a program writes a SQLite store: its file's and journals' size and
    modification time."""
    out: list[tuple[int, int] | None] = []
    for name in (path.name, path.name + "-journal", path.name + "-wal"):
        try:
            st = os.stat(path.with_name(name))
            out.append((st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def _quiet_since(state: tuple[tuple[int, int] | None, ...]) -> float:
    """Seconds since the newest modification in ``state``, by the file system's clock."""
    newest = max((entry[1] for entry in state if entry is not None), default=0)
    return time.time() - newest / 1e9


def wait_for_creator(path: Path, store: str, wait_s: float) -> None:
    """Return once the store at ``path`` is complete, or has not changed for :data:`QUIET_S`
    seconds (by its modification time, or as watched here), or ``wait_s`` seconds have passed;
    the opening that follows then says what is wrong, if anything (an old store: at once)."""
    started = time.monotonic()
    state, changed = _state(path), time.monotonic()
    while not complete(path, store):
        now = time.monotonic()
        if _quiet_since(state) > QUIET_S or now - changed > QUIET_S or now - started > wait_s:
            return
        time.sleep(0.1)
        if (new := _state(path)) != state:
            state, changed = new, time.monotonic()
