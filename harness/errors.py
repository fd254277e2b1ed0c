"""User-facing errors.

Every error a user can fix (a bad config, an unknown name, a broken plugin, an incompatible
pairing) is a :class:`HarnessError`. The CLI prints its message as one paragraph and exits
with code 2, without a traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

#: the most characters of a user's value an error message echoes, and of a whole message
MAX_ECHO = 80
MAX_MESSAGE = 3000


def shorten(text: str, limit: int = MAX_ECHO) -> str:
    """``text`` cut to ``limit`` characters (with the count of what was left out): a YAML bomb
    or a list of 200,000 keys must not become millions of lines of error."""
    if len(text) <= limit:
        return text
    return f"{text[: max(limit - 30, 10)]}... ({len(text) - max(limit - 30, 10):,} more characters)"


def short_repr(value: Any, limit: int = MAX_ECHO) -> str:
    """The repr of a user's value for a message, bounded: ``reprlib`` never walks more than a
    few levels and items, so a YAML bomb (a billion aliased items) costs nothing to show."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlong = 3, limit, limit, 40
    r.maxtuple = r.maxlist = r.maxarray = r.maxdict = r.maxset = r.maxfrozenset = r.maxdeque = 6
    try:
        text = r.repr(value)
    except Exception:  # a repr that raises: its type is enough
        text = f"<{type(value).__name__}>"
    return shorten(text, limit)


def short_list(items: Any, limit: int = 12) -> str:
    """Names joined by ', ', at most ``limit`` of them (then how many more)."""
    items = [str(i) for i in items]
    more = len(items) - limit
    return ", ".join(shorten(i) for i in items[:limit]) + (f" and {more:,} more" if more > 0 else "")


#: wrap the CLI's paragraphs at this many columns (0: never); unset: a terminal's width
WRAP_ENV = "HARNESS_WRAP_WIDTH"


def fill(text: str, stream: Any = None, indent: str = "") -> str:
    """``text`` wrapped for where it goes: at a terminal's width (at most 100 columns) when
    ``stream`` (default stderr) is a terminal, never when it is a file or a pipe (a log keeps
    whole lines, ``grep`` finds a phrase). ``$HARNESS_WRAP_WIDTH`` overrides the width (0:
    never); the test suite sets it to 1 so that a test asserting on wrapped text fails every
    time, not by the length of a path. Paths, URLs and names such as UTF-8 are never split
    at a hyphen or inside a word (copy them from the terminal as they are); each line of
    ``text`` is wrapped on its own, later lines of a paragraph indented by ``indent``."""
    import os
    import shutil
    import sys
    import textwrap

    stream = sys.stderr if stream is None else stream
    setting = os.environ.get(WRAP_ENV, "").strip()
    if setting.isdigit():
        width = int(setting)
    else:
        try:
            terminal = stream.isatty()
        except (AttributeError, ValueError):  # a closed or a stand-in stream
            terminal = False
        width = min(shutil.get_terminal_size((100, 24)).columns, 100) if terminal else 0
    if width <= 0:
        return text
    return "\n".join(textwrap.fill(line, width=max(width, len(indent) + 1), subsequent_indent=indent,
                                   break_on_hyphens=False, break_long_words=False)
                     for line in text.split("\n"))


def warning(text: str) -> None:
    """The harness's own warning line on stderr (``warning: ...``), never a raw Python warning
    with a source path."""
    import sys

    print(f"warning: {text}", file=sys.stderr, flush=True)


class HarnessError(Exception):
    """An error the user can fix; its message says what is wrong and how to fix it."""

    exit_code = 2


class ConfigError(HarnessError):
    """A run or study configuration is invalid; the message names the field."""


class MissingDataError(ConfigError):
    """A task reads files the user supplies (a dataset's own release) and they are not where
    its config says; the message names what to download and where to put it. The
    conformance kit reports a task's checks as not applicable when its data is missing."""


class UnknownNameError(HarnessError):
    """A plugin name (attention, position, model, task) is not registered."""


class PluginError(HarnessError):
    """A plugin is broken: it failed to import, registered bad data, or conflicts."""


class IncompatibleError(HarnessError):
    """A combination of components cannot work together (declared by the plugins)."""


class RunFailed(HarnessError):
    """A run (or a study trial) failed while building, training or evaluating: a plugin
    raised, memory ran out, the loss diverged. The run is recorded FAILED with this message;
    the CLI prints it as one paragraph and exits with code 1."""

    exit_code = 1


class OutOfMemory(RunFailed):
    """A run needed more memory than the device has (refused before training, or raised)."""


class Interrupted(SystemExit):
    """The user pressed Ctrl-C. A ``SystemExit`` (code 130, as a shell reports SIGINT), not a
    ``KeyboardInterrupt``: Lightning turns a ``KeyboardInterrupt`` into ``exit(1)`` and ignores
    every later Ctrl-C, while any other exception is torn down and re-raised as it is. Code that
    ends runs and trials treats it like ``KeyboardInterrupt``. ``kept`` and ``resume`` are
    filled in on the way up and printed by the CLI."""

    def __init__(self, kept: str = "", resume: str = "") -> None:
        super().__init__(130)
        self.kept, self.resume = kept, resume


# -- pydantic's errors, stated the harness's way ----------------------------------------------
#: pydantic's framing of a message raised by a validator (a plugin's ``__post_init__``)
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")
#: Error types of a validator's own check: on a whole config, its input is the whole config
WHOLE_CHECKS = ("value_error", "assertion_error")



class HarnessWarning(UserWarning):
    """Something a user should know that does not stop the work (bytes replaced, texts
    truncated, a checkpoint skipped): shown as the harness's own ``warning: ...`` line
    (:mod:`harness.runtime.noise`), never as Python's ``file.py:197: UserWarning``."""


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """An exception and every cause or context behind it, each once (cycles stop)."""
    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        yield node
        node = node.__cause__ or node.__context__

def pydantic_message(err: Mapping[str, Any]) -> str:
    """The message of one pydantic error without pydantic's internals: no "Value error, "
    prefix, no trailing period, and the value given, except where a validator checked a
    whole config (its input is the whole config: that says nothing)."""
    msg = str(err.get("msg", "")).strip()
    for prefix in _PYDANTIC_PREFIXES:
        msg = msg.removeprefix(prefix)
    msg = msg.rstrip(".")
    msg = shorten(msg, 1000)  # the plugin's own words, not the user's value: kept whole
    given = err.get("input")
    if err.get("loc") and not (isinstance(given, Mapping) and err.get("type") in WHOLE_CHECKS):
        msg += f" (got {short_repr(given, 60)})"  # bounded without walking a huge value
    return msg


def pydantic_problem(err: Mapping[str, Any], where: str) -> str:
    """``where.field: message`` for one pydantic error (``where: message`` when the check is
    on the whole config); the one place (with :func:`harness.config.format_validation_error`,
    which uses :func:`pydantic_message`) that turns pydantic's errors into the harness's."""
    loc = ".".join(str(p) for p in err.get("loc", ()))
    place = ".".join(p for p in (where, loc) if p) or "config"
    return f"{place}: {pydantic_message(err)}"
