"""Opening a file a user gave: the one layer every reader of a user's file goes through.

* **Regular files only.** A FIFO, a device (``/dev/zero``), a socket or a folder where a file
  is expected is refused before it is read (a FIFO would block for ever, a device never ends);
  :func:`open_regular` opens with ``O_NONBLOCK`` and checks the descriptor, so a file swapped
  for a FIFO between the check and the open cannot hang either.
* **Symbolic links resolved and kept inside a folder.** :func:`inside` resolves a path and
  refuses one that leads out of the folder it was found in (``../outside.jsonl`` in a
  dataset's ``state.json``, a link to ``/etc``); :class:`Walk` visits each real folder once,
  so a link loop (``loop -> .``) is not followed twice.
* **Every failure a :class:`~harness.errors.ConfigError`** naming the file: missing, a dangling
  link, not readable (permissions), not a regular file. A folder this user cannot search or
  list makes even asking whether a file exists fail (``PermissionError``):
  :func:`permission_denied` names the folder that blocks the way and the user.

The parsers above this layer (:mod:`harness.data.readers`) turn decompression and parse errors
into ``file F, line N: what is wrong`` with :func:`read_problem`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO

from harness.errors import ConfigError

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words (``a regular file`` for a plain file)."""
    return next((name for test, name in _KINDS if test(mode)), "a regular file")


def check_regular(path: Path, what: str = "file") -> os.stat_result:
    """``path``'s stat (following links), refused unless it is a regular file one can read."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise ConfigError(f"{what} {path} is a symbolic link to {os.readlink(path)}, which does "
                              f"not exist. Fix or remove the link.") from None
        raise ConfigError(f"{what} {path} does not exist. Check the path.") from None
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be read ({exc.strerror or exc}). Check its "
                          f"permissions or the path.") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} {path} is {kind_of(st.st_mode)}, not a regular file; only "
                          f"regular files are read. Name a file.")
    return st


def open_regular(path: Path, what: str = "file") -> IO[bytes]:
    """``path`` opened for reading in binary, refused unless it is a regular file (see the
    module; a FIFO is never waited on)."""
    check_regular(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be opened ({exc.strerror or exc}). Check its "
                          f"permissions.") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ConfigError(f"{what} {path} is {kind_of(st.st_mode)}, not a regular file; only "
                          f"regular files are read.")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bytes(path: Path, what: str = "file") -> bytes:
    with open_regular(path, what) as fh:
        return fh.read()


def read_text(path: Path, what: str = "file") -> str:
    data = read_bytes(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte {exc.start}).") from None


def inside(folder: Path, name: str | os.PathLike[str], what: str = "file") -> Path:
    """``folder / name`` resolved (links followed), refused when it leads outside ``folder``."""
    base = folder.resolve()
    target = (folder / name).resolve()
    if target != base and base not in target.parents:
        raise ConfigError(f"{what} {folder / name} leads outside {folder} (to {target}); a file "
                          f"named inside a folder must stay in it. Name it as a source itself "
                          f"if you mean to read it.")
    return target


class Walk:
    """The real folders already visited while reading one set of sources: a link loop or two
    links to one folder are read once."""

    def __init__(self) -> None:
        self.seen: set[tuple[int, int]] = set()

    def first_visit(self, folder: Path) -> bool:
        try:
            st = os.stat(folder)
        except OSError:
            return False
        key = (st.st_dev, st.st_ino)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def listing(folder: Path) -> list[Path]:
    """A folder's entries, sorted, or a ConfigError naming it when it cannot be listed."""
    try:
        return sorted(folder.iterdir())
    except OSError as exc:
        raise ConfigError(f"folder {folder} cannot be listed ({exc.strerror or exc}). Check its "
                          f"permissions.") from None


def permission_denied(exc: OSError, what: str = "the path") -> ConfigError:
    """The error for a ``PermissionError`` met while reaching ``exc.filename``: the first
    folder on its way that this user cannot search (or the path itself, unreadable), the
    user, and what to do; nothing was written."""
    import getpass

    target = Path(os.fsdecode(exc.filename)) if exc.filename is not None else None
    blocked = target
    if target is not None:
        for folder in reversed(target.absolute().parents):  # from the root down
            if not os.access(folder, os.X_OK):
                blocked = folder
                break
    try:
        user = getpass.getuser()
    except Exception:  # no name for this uid: its number
        user = f"uid {os.getuid()}" if hasattr(os, "getuid") else "this user"
    if target is None:
        problem = f"{what} cannot be reached by user {user} (permission denied)"
        fix = f"Give {user} access"
    elif blocked == target:
        problem = f"{what} {target} cannot be read by user {user} (permission denied)"
        fix = f"Give {user} access (`chmod u+r {target}` if it is yours, or ask its owner)"
    else:
        problem = (f"{what} {target} cannot be reached: user {user} may not search the folder "
                   f"{blocked} (permission denied)")
        fix = f"Give {user} access (`chmod u+rx {blocked}` if it is yours, or ask its owner)"
    return ConfigError(f"{problem}, so nothing was read or written. {fix}, or run the command "
                       f"as a user who has it.")


def read_problem(exc: BaseException) -> str | None:
    """What a decompressor or parser's exception means, in words; None for anything else."""
    import lzma
    import zlib

    if isinstance(exc, EOFError):
        return "the compressed file ends early (truncated)"
    if isinstance(exc, lzma.LZMAError | zlib.error):
        return f"not valid compressed data ({exc})"
    if isinstance(exc, RecursionError):
        return "nested too deeply to read"
    if isinstance(exc, OSError) and exc.errno is None:  # gzip's BadGzipFile, bz2's invalid data
        return f"not valid compressed data ({exc})"
    if isinstance(exc, OSError):
        return f"cannot be read ({exc.strerror or exc})"
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        return "a number with more digits than can be read (over 4,300)"
    return None
