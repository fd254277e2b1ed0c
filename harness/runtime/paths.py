"""Temporary paths the harness makes beside what it writes: the one place that names them.

A prepared corpus is written into a folder beside ``--out`` and renamed into place, an export
likewise, a checkpoint or weights file through a temporary file. Every such path is

* **unique to the process and the call**: ``.<target>.harness-<kind>-<pid>-<random>``, so two
  processes (or two calls in one) never share one, and it never equals a name a user chose
  (``.out.partial-notes/`` or ``.keep.tmp/`` are the user's and are never touched);
* **owned**: a temporary folder holds a marker file (:data:`MARK`) written when it was made,
  and only a folder whose name matches the pattern *and* holds the marker is ever removed,
  by the call that made it (on failure) or, once its process is dead, by a later call
  (:func:`remove_stale`);
* **created exclusively** (``mkdir`` / ``O_EXCL``): an existing path is never reused.

Files the harness publishes get the permissions a plain ``open()`` would give them
(``0o666`` less the umask, :func:`publish_mode`), whatever the library that wrote them chose.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

#: The file inside a temporary folder that says the harness made it (and which process).
MARK = ".harness-temporary"


def _pattern(target: Path, kind: str) -> re.Pattern[str]:
    return re.compile(rf"^\.{re.escape(target.name)}\.harness-{re.escape(kind)}-(\d+)-[0-9a-f]{{8}}$")


def temp_name(target: Path, kind: str) -> Path:
    """A fresh path beside ``target`` for a temporary ``kind`` (``partial``, ``tmp``...)."""
    return target.parent / f".{target.name}.harness-{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def make_temp_folder(target: Path, kind: str) -> Path:
    """A new, empty temporary folder beside ``target``, marked as the harness's."""
    while True:
        path = temp_name(target, kind)
        try:
            path.mkdir()
        except FileExistsError:  # pragma: no cover - 32 random bits collided
            continue
        (path / MARK).write_text(f"{os.getpid()}\n")
        return path


def is_ours(path: Path, target: Path, kind: str) -> bool:
    """Whether ``path`` is a temporary ``kind`` folder of ``target`` the harness made."""
    return bool(_pattern(target, kind).match(path.name)) and path.is_dir() \
        and not path.is_symlink() and (path / MARK).is_file()


def remove_temp_folder(path: Path, target: Path, kind: str) -> None:
    """Remove ``path`` if it is one of ours (see the module); anything else is left alone."""
    if is_ours(path, target, kind):
        shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def remove_stale(target: Path, kind: str) -> None:
    """Remove the temporary ``kind`` folders of ``target`` left by processes that died
    (SIGKILL, power loss): ours by name and marker, their process gone."""
    pattern = _pattern(target, kind)
    with contextlib.suppress(OSError):
        for entry in os.scandir(target.parent):
            m = pattern.match(entry.name)
            if m and not _alive(int(m[1])):
                remove_temp_folder(Path(entry.path), target, kind)


@contextlib.contextmanager
def temp_folder(target: Path, kind: str) -> Iterator[Path]:
    """A temporary folder beside ``target``, removed if the block raises (the block renames
    it into place on success)."""
    path = make_temp_folder(target, kind)
    try:
        yield path
    except BaseException:
        remove_temp_folder(path, target, kind)
        raise


def publish_mode() -> int:
    """The mode a new file gets from a plain ``open()``: ``0o666`` less the umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_atomic(path: Path, data: bytes | memoryview, *, fsync: bool = True) -> None:
    """``data`` into ``path`` through a temporary file of our own beside it (created
    exclusively, flushed, renamed): a reader sees the old file or the new one, never half."""
    tmp = temp_name(path, "tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def atomic_target(path: Path) -> Iterator[Path]:
    """A fresh temporary file name beside ``path`` for a library that writes a file by name;
    renamed onto ``path`` (with :func:`publish_mode`) when the block succeeds, removed when
    it raises."""
    tmp = temp_name(path, "tmp")
    try:
        yield tmp
        os.chmod(tmp, publish_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def new_folder(path: str | os.PathLike[str], flag: str) -> Path:
    """``path`` as a folder a command will create: it must not exist (nothing is overwritten)
    and its parent must be a folder this user can write in; a ConfigError naming ``flag``
    otherwise. Cheap: commands call it before their heavy imports."""
    from harness.errors import ConfigError, shorten

    target = Path(path)
    try:
        exists = target.exists() or target.is_symlink()
    except OSError as exc:  # a name too long, a loop of links
        raise ConfigError(f"{flag} {shorten(str(target), 120)}: not a usable path "
                          f"({exc.strerror or exc}).") from None
    if exists:
        raise ConfigError(f"{flag} {target} already exists; a new folder is written and none is "
                          f"ever overwritten. Pick another path or remove it first.")
    parent = target.parent
    try:  # a real try, not os.access: root, read-only mounts and /proc answer it truly
        probe = make_temp_folder(target, "probe")
    except OSError as exc:
        raise ConfigError(f"{flag} {target}: a folder cannot be made in {parent} ({exc.strerror or exc}). "
                          f"Pick a folder in a place you can write.") from None
    remove_temp_folder(probe, target, "probe")
    return target


def _writable_place(path: Path, flag: str, shown: Path | None = None) -> None:
    """Refuse (ConfigError naming ``flag``) unless ``path``'s nearest existing folder (itself,
    or the first parent that exists) is a folder this user can make things in: a real try."""
    from harness.errors import ConfigError, shorten

    shown = path if shown is None else shown
    try:
        existing = next(p for p in (path, *path.parents) if p.exists() or p.is_symlink())
    except OSError as exc:  # a name too long, a loop of links
        raise ConfigError(f"{flag} {shorten(str(shown), 120)}: not a usable path ({exc.strerror or exc}).") from None
    if not existing.is_dir():
        raise ConfigError(f"{flag} {shown}: {existing} is a file, not a folder, so nothing can be "
                          f"written there. Pick a path in a folder.")
    target = existing / ".write-probe"
    try:
        probe = make_temp_folder(target, "probe")
    except OSError as exc:
        raise ConfigError(f"{flag} {shown}: nothing can be written in {existing} ({exc.strerror or exc}). "
                          f"Pick a path in a place you can write.") from None
    remove_temp_folder(probe, target, "probe")


def new_file(path: str | os.PathLike[str], flag: str) -> Path:
    """``path`` as a file a command will write when it ends: it must not exist (a record is
    never overwritten) and must be writable where it is; a ConfigError naming ``flag``
    otherwise, before any work (a refusal after the work would lose it)."""
    from harness.errors import ConfigError

    target = Path(path)
    if target.exists() or target.is_symlink():
        what = "a folder" if target.is_dir() else "a file"
        raise ConfigError(f"{flag} {target} already exists ({what}); the harness never overwrites a record: "
                          f"choose a new path, or move the old one first.")
    _writable_place(target.parent, flag, target)
    return target


def writable_folder(path: str | os.PathLike[str], flag: str) -> Path:
    """``path`` as a folder a command writes files into: an existing folder or a new one, in a
    place this user can write; a ConfigError naming ``flag`` otherwise, before any work."""
    target = Path(path)
    _writable_place(target, flag)
    return target
