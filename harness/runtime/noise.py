"""Keep other libraries' chatter off the terminal (``harness --verbose`` lets it through).

What a user cannot act on: Lightning's "GPU available: False" lines, its tips and "Trainer.fit
stopped" notices, MLflow's "Creating initial MLflow database tables" and alembic migration
lines, Optuna's "A new study created" lines, and warnings raised inside those libraries about
their own internals. What stays: the harness's own output, every error, and warnings logged
at WARNING or above. Imports nothing heavy: it runs before the libraries are imported, so
most of it is environment variables and logging configuration they pick up when they load.

The CLI quiets the whole process (:func:`quiet`); the Python API (``harness.train`` and the
study functions) quiets the libraries for the length of the call and restores the logging and
warning settings after it (:func:`quieted`), so a notebook sees what the CLI shows.
``verbose=True`` or ``HARNESS_VERBOSE=1`` lets the libraries' output through.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from harness.errors import HarnessWarning

#: Warnings about a library's own internals (module regexes of where they are raised).
INTERNAL_WARNINGS = (r"(lightning|lightning_fabric|pytorch_lightning|torch|mlflow|optuna|"
                     r"optuna_integration|pydantic|sqlalchemy|alembic|matplotlib)(\..*)?$")


#: the harness's own modules: a warning raised there is the harness's
_HARNESS = str(Path(__file__).resolve().parent.parent) + os.sep


def _show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
          file: TextIO | None = None, line: str | None = None) -> None:
    """``warnings.showwarning`` that prints the harness's warnings (a
    :class:`~harness.errors.HarnessWarning`, or one raised in a harness module) as its own
    line, ``warning: TEXT``, and leaves any other to Python's format."""
    # a caller recording warnings (catch_warnings(record=True), pytest.warns) gets them all
    recording = isinstance(getattr(getattr(warnings, "_showwarnmsg_impl", None), "__self__", None), list)
    if not recording and (issubclass(category, HarnessWarning)
                          or os.path.abspath(filename).startswith(_HARNESS)):
        print(f"warning: {message}", file=file or sys.stderr, flush=True)
        return
    _python_show(message, category, filename, lineno, file, line)


_python_show = warnings.showwarning


def own_warning_lines() -> None:
    """Show the harness's warnings as ``warning: ...`` lines from now on (idempotent)."""
    if warnings.showwarning is not _show:
        global _python_show
        _python_show = warnings.showwarning
        warnings.showwarning = _show


def quiet() -> None:
    """Silence the libraries' INFO chatter and internal warnings (idempotent); the harness's
    own warnings become ``warning: ...`` lines."""
    own_warning_lines()
    # Every logger's INFO and DEBUG records, whatever handlers the libraries attach when
    # they are imported later (Lightning puts its own on the "lightning" logger); the
    # harness itself prints, it does not log.
    logging.disable(logging.INFO)
    # mlflow reads this when it configures its loggers at import, and so does the
    # ``mlflow server`` that ``harness ui`` starts (it inherits the environment)
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    warnings.filterwarnings("ignore", module=INTERNAL_WARNINGS)


#: ``HARNESS_VERBOSE=1``: the Python API lets the libraries' output through (``verbose=True``).
ENV_VERBOSE = "HARNESS_VERBOSE"


def verbose_from_env() -> bool:
    return os.environ.get(ENV_VERBOSE, "").lower() in ("1", "true", "yes")


@contextlib.contextmanager
def quieted(verbose: bool | None = None) -> Iterator[None]:
    """The libraries' INFO chatter and internal warnings off for the duration, the logging
    and warning settings restored after it; nothing changes with ``verbose`` (default:
    ``$HARNESS_VERBOSE``)."""
    if verbose if verbose is not None else verbose_from_env():
        yield
        return
    before = logging.root.manager.disable
    with warnings.catch_warnings():  # restores showwarning too
        own_warning_lines()
        warnings.filterwarnings("ignore", module=INTERNAL_WARNINGS)
        logging.disable(max(before, logging.INFO))
        try:
            yield
        finally:
            logging.disable(before)
