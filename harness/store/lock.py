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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

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
