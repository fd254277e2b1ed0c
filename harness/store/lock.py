"""One lock around opening a database store, so that its schema is created once.

Neither Optuna (``RDBStorage``) nor MLflow (its SQLAlchemy tracking store, which runs its
Alembic migrations when it opens an empty database) creates its tables safely when two
processes open the same empty database at once: one of them dies with ``duplicate column
name`` (SQLite) or a ``UniqueViolation`` (PostgreSQL). Two ``harness train`` commands
started together on a new project, or study workers started together, do exactly that.
Every store the harness opens is therefore opened under :func:`schema_lock`:

- SQLite: an exclusive ``flock`` on ``<database file>.schema-lock`` next to the database
  (the processes that can share a SQLite file are those of one machine);
- PostgreSQL: a session-level advisory lock, one key per kind of store;
- anything else (an MLflow server over HTTP, which creates its own schema): no lock.

The lock is held only while the store is opened (milliseconds once the schema exists).
A SQLite store is checked first (:mod:`harness.store.guard`): one that exists but is empty,
damaged or another program's is refused, never recreated; so is one that cannot be written.

The lock orders harness processes only: a plain ``mlflow ui``, a notebook's ``MlflowClient``
or optuna-dashboard opening the same new database creates its schema without asking.
:func:`open_store` therefore publishes a new SQLite store whole and waits for one that
another program is creating (:mod:`harness.store.creating`); and where a schema is still
created in place (PostgreSQL, whose migrations run in one transaction), an opening that
fails because another program created the schema at the same moment (``already exists``,
``duplicate column``, a locked database, a schema between migrations) is tried again, for
up to :data:`CREATING_WAIT_S`: the other program's store is waited for, never a crash.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: Advisory-lock keys (any 64-bit values no other program uses: "harness!" and "harnessM").
KEYS = {"optuna": int.from_bytes(b"harness!", "big") & (2**63 - 1),
        "mlflow": int.from_bytes(b"harnessM", "big") & (2**63 - 1)}


def sqlite_file(url: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URL (None for anything else or in-memory)."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///"):].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


@contextlib.contextmanager
def schema_lock(url: str, store: str) -> Iterator[None]:
    """Hold the lock of ``store`` ("optuna" or "mlflow") on the database at ``url``."""
    from harness.store import guard as store_guard

    path = sqlite_file(url)
    if path is not None:
        store_guard.check_writable(path, store)
        with _file_lock(path.with_name(path.name + ".schema-lock"), path, store):
            store_guard.check_sqlite(path, store)  # under the lock: another process may be creating it
            yield
    elif url.startswith("postgresql"):
        with _advisory_lock(url, KEYS[store]):
            yield
    else:
        yield


#: how long an opening waits for a schema that another program is creating
CREATING_WAIT_S = 120.0
#: how long a schema that is not the current version may take to become it (another program
#: migrating it); past this it is an old store (``mlflow db upgrade``), refused at once
MIGRATING_WAIT_S = 10.0
#: what SQLite, PostgreSQL and Alembic say when two programs create one schema at once
_CREATING = ("already exists", "duplicate column", "duplicate key", "database is locked",
             "unique constraint failed", "uniqueviolation", "duplicatetable", "duplicatecolumn",
             "online migration expected to match one row")


def being_created(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception behind it) says another program is creating the
    schema at this moment."""
    from harness.errors import exception_chain

    return any(any(words in f"{type(node).__name__} {node}".lower() for words in _CREATING)
               for node in exception_chain(exc))


def _out_of_date(exc: BaseException) -> bool:
    """MLflow's "out-of-date database schema": tables made, the migrations still running."""
    return "out-of-date database schema" in str(exc)


def open_store(url: str, store: str, opener: Callable[[], T], wait_s: float = CREATING_WAIT_S) -> T:
    """``opener()`` under :func:`schema_lock`, a new SQLite store published whole first and one
    another program is creating waited for (:mod:`harness.store.creating`); when the opening
    fails because another program is creating the schema at the same moment, wait and open
    again (its schema then exists and is opened as it is), for up to ``wait_s`` seconds."""
    from harness.errors import HarnessError
    from harness.store import creating

    started = time.monotonic()
    delay = 0.1
    path = sqlite_file(url)
    while True:
        try:
            with schema_lock(url, store):
                if path is not None and not creating.publish_new(path, store):
                    creating.wait_for_creator(path, store, wait_s)  # another program's, maybe half made
                return opener()
        except HarnessError:
            raise
        except Exception as exc:
            waited = time.monotonic() - started
            # a schema between migrations: SQLite stores were waited for above (an old one is not)
            retry = being_created(exc) or (path is None and _out_of_date(exc) and waited < MIGRATING_WAIT_S)
            if not retry or waited > wait_s:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


@contextlib.contextmanager
def _file_lock(path: Path, database: Path | None = None, store: str = "mlflow") -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not a POSIX system: no lock
        yield
        return
    from harness.store.guard import cannot_create

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise cannot_create(path, database or path, store, exc) from None
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def _advisory_lock(url: str, key: int) -> Iterator[None]:
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    engine = sqlalchemy.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": key})
            try:
                yield
            finally:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": key})
    finally:
        engine.dispose()
