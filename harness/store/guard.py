"""A store that exists is never silently replaced: checks made before a database is opened.

MLflow and Optuna create their schema in any SQLite file that has none, so a store left empty
(0 bytes, by a crash or a full disk), truncated or overwritten would be recreated without a
word and the runs and studies it held would be gone. Before the harness opens a SQLite store
(:func:`harness.store.lock.schema_lock`, and the read-only opening of ``study status``)
:func:`check_sqlite` refuses a file that exists but cannot be that store:

- not a regular file, 0 bytes, no SQLite header, shorter than its header says (truncated);
- unreadable by SQLite, or failing ``PRAGMA quick_check`` (run on files up to
  :data:`QUICK_CHECK_MAX_BYTES`; larger ones get the header and schema checks only);
- tables of some other program (an MLflow store given as the Optuna storage, or the reverse).

:func:`check_writable` refuses a read-only store, a folder that is not a folder and a disk
without room, before anything is written. Each error is one paragraph naming the file, saying
that nothing was written and how to recover. :func:`explain` turns the same failures raised
later by SQLite (a disk that filled during a run) into such a paragraph.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from harness.errors import HarnessError, exception_chain

MAGIC = b"SQLite format 3\x00"
#: the tables that say which store a SQLite file holds (any one of them is enough)
SIGNATURE = {"mlflow": {"experiments", "runs", "alembic_version"},
             "optuna": {"studies", "trials", "version_info"}}
WHAT = {"mlflow": "MLflow tracking store", "optuna": "Optuna study storage"}
HELD = {"mlflow": "runs", "optuna": "studies"}
#: quick_check reads every page: about 0.1 s per 10 MB on a laptop disk
QUICK_CHECK_MAX_BYTES = 64 * 2**20
#: a store is not opened for writing on a disk with less room than this
MIN_FREE_BYTES = 4 * 2**20
#: an empty file is given this long to grow before it is called damaged: SQLite makes the
#: file when another program (mlflow ui, a notebook's MlflowClient) connects, and writes it
#: when that program creates the schema, moments later
EMPTY_WAIT_S = 2.0


class StoreError(HarnessError):
    """A store cannot be used as it is; nothing was written to it."""


def _recover(path: Path, store: str) -> str:
    return (f"Nothing was written to it. Restore it from a backup if you have one; otherwise "
            f"move it aside (`mv {path} {path}.damaged`) and the next command starts a new, "
            f"empty store (the {HELD[store]} it held are not in it; `sqlite3 {path}.damaged "
            f".recover` may salvage what is still readable).")


def damaged(path: Path, store: str, problem: str) -> StoreError:
    return StoreError(f"the {WHAT[store]} {path} {problem}, so it was not opened: the harness "
                      f"never replaces a store that exists. {_recover(path, store)}")


def check_sqlite(path: Path, store: str) -> None:
    """Refuse ``path`` if it exists but is not a readable ``store`` ("mlflow" or "optuna")."""
    import sqlite3
    from urllib.parse import quote

    if not os.path.lexists(path):
        return
    if not path.is_file():
        raise StoreError(f"the {WHAT[store]} {path} is not a file (a folder or something else "
                         f"has its name), so it was not opened and nothing was written. Move it "
                         f"aside or point the store elsewhere (HARNESS_HOME, --storage, "
                         f"--tracking-uri).")
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            header = fh.read(100)
    except OSError as exc:
        raise StoreError(f"the {WHAT[store]} {path} cannot be read ({exc.strerror}); nothing was "
                         f"written. Check its permissions.") from None
    if size == 0:  # or just made by another program's connection, its schema moments away
        size = _grown(path, EMPTY_WAIT_S)
        if size == 0:
            raise damaged(path, store, "is empty (0 bytes: a crash or a full disk can leave one)")
        with open(path, "rb") as fh:
            header = fh.read(100)
    if len(header) < 100 or not header.startswith(MAGIC):
        raise damaged(path, store, "is not a SQLite database (it was overwritten or is another "
                                   "kind of file)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    if header[24:28] == header[92:96] and pages and size < pages * page_size:
        raise damaged(path, store, f"is truncated ({size:,} bytes of the {pages * page_size:,} "
                                   f"its header records)")
    # a hot journal (a process killed inside a write) is rolled back by the first connection
    # that may write: SQLite's own crash recovery, back to the last committed state
    hot = path.with_name(path.name + "-journal")
    mode = "rw" if hot.is_file() and hot.stat().st_size > 0 else "ro"
    try:
        con = sqlite3.connect(f"file:{quote(str(path))}?mode={mode}", uri=True, timeout=60)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if size <= QUICK_CHECK_MAX_BYTES:
                result = [r[0] for r in con.execute("PRAGMA quick_check(3)")]
                if result != ["ok"]:
                    raise damaged(path, store, "is damaged (SQLite's quick_check: "
                                               f"{'; '.join(' '.join(str(r).split())[:80] for r in result)})")
        finally:
            con.close()
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # a name that is not text: damaged
        raise damaged(path, store, f"cannot be read by SQLite ({' '.join(str(exc).split())[:120]})") from None
    if tables and not tables & SIGNATURE[store]:
        other = next((k for k, sig in SIGNATURE.items() if tables & sig), None)
        kind = f"an {WHAT[other]}" if other else "another program's database"
        listed = ", ".join(sorted(tables)[:8]) + (" ..." if len(tables) > 8 else "")
        raise StoreError(f"the {WHAT[store]} {path} holds {kind} (tables: {listed}), so it was "
                         f"not opened and nothing was written. Give the right file (--storage "
                         f"for Optuna, --tracking-uri for MLflow).")


def _grown(path: Path, wait_s: float) -> int:
    """The size of ``path`` once it is no longer empty, or 0 after ``wait_s`` seconds."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        try:
            size = path.stat().st_size
        except OSError:
            return 0
        if size or time.monotonic() > deadline:
            return size
        time.sleep(0.05)


def check_writable(path: Path, store: str) -> None:
    """Refuse to open ``path`` for writing where nothing could be written: a parent that is not
    a folder, a read-only file, folder or disk, a disk without room. Creates nothing (a
    command that fails later on bad input leaves no folder behind); what only an attempt can
    tell is told by :func:`cannot_create` when the store's lock file is made."""
    existing = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
    if existing is None:
        return
    if not existing.is_dir():
        raise StoreError(f"the {WHAT[store]} {path} cannot be created: {existing} is a file, "
                         f"not a folder. Nothing was written. Point HARNESS_HOME (or --storage / "
                         f"--tracking-uri) at a folder.")
    if pseudo_fs(existing):
        raise StoreError(f"the {WHAT[store]} {path} cannot be created: {existing} is a kernel "
                         f"file system that takes no files. Nothing was written. Point "
                         f"HARNESS_HOME (or --storage / --tracking-uri) at an ordinary folder.")
    for target in (path, existing):
        if target.exists() and not os.access(target, os.W_OK) or _read_only_mount(target):
            raise StoreError(f"the {WHAT[store]} {path} is read-only ({target} cannot be "
                             f"written), so nothing was written. Make it writable (chmod u+w, "
                             f"or remount), or point HARNESS_HOME (or --storage / --tracking-uri) "
                             f"at a writable store; `harness study status` and `list` read a "
                             f"read-only store.")
    free = _free_bytes(existing)
    if free is not None and free < MIN_FREE_BYTES:
        raise StoreError(f"the disk holding the {WHAT[store]} {path} is full ({free:,} bytes "
                         f"free), so nothing was written. Free some space (or point HARNESS_HOME "
                         f"at another disk) and run the command again.")


def cannot_create(what: Path, path: Path, store: str, exc: OSError) -> StoreError:
    """The error for a file or folder next to a store (its lock file, its folder) that could not
    be created: full, read-only, or a place that takes no files (``/proc``)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        why = "the disk is full: free some space (or point HARNESS_HOME at another disk)"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        why = ("it is read-only: make it writable, or point HARNESS_HOME (or --storage / "
               "--tracking-uri) at a writable store")
    else:
        why = ("point HARNESS_HOME (or --storage / --tracking-uri) at a folder on an ordinary, "
               "writable disk")
    return StoreError(f"the {WHAT[store]} {path} cannot be used: {what} cannot be created "
                      f"({exc.strerror}), so nothing was written; {why}.")


def pseudo_fs(folder: Path) -> bool:
    """A kernel file system (``/proc``, ``/sys``) that takes no files, whatever its mode says."""
    try:
        return os.statvfs(folder).f_blocks == 0
    except (OSError, AttributeError):
        return False


def _read_only_mount(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def _free_bytes(folder: Path) -> int | None:
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


# -- failures raised later ------------------------------------------------------------------------
#: SQLite's and the OS's words for a store that cannot be written or read, and what to do
_KNOWN = (
    ("database or disk is full", "the disk holding the store is full: free some space and run "
                                 "the command again"),
    ("disk i/o error", "the disk reported an I/O error: check it and the store"),
    ("database disk image is malformed", "the store is damaged: restore it from a backup, or "
                                         "move it aside to start a new one"),
    ("file is not a database", "the store is not a SQLite database: restore it from a backup, or "
                               "move it aside to start a new one"),
    ("attempt to write a readonly database", "the store is read-only: make it writable, or "
                                             "point HARNESS_HOME (or --storage / --tracking-uri) "
                                             "at a writable store"),
    ("unable to open database file", "the store's file or folder cannot be opened: check the "
                                     "path and its permissions"),
)
_ERRNOS = {errno.ENOSPC: _KNOWN[0][1], errno.EROFS: _KNOWN[4][1], errno.EDQUOT: _KNOWN[0][1]}


def explain(exc: BaseException) -> StoreError | None:
    """A one-paragraph error for an exception (or any exception in its chain) that says a
    store could not be written or read; None for anything else."""
    for node in exception_chain(exc):
        if isinstance(node, OSError) and node.errno in _ERRNOS:
            where = f" ({node.filename})" if node.filename else ""
            return StoreError(f"a store could not be written{where}: {node.strerror}; "
                              f"{_ERRNOS[node.errno]}. What was recorded before this is kept.")
        text = str(node).lower()
        for words, fix in _KNOWN:
            if words in text:
                return StoreError(f"a store could not be used (SQLite: {words}); {fix}. What was "
                                  f"recorded before this is kept.")
    return None
