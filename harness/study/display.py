"""What ``harness study run`` shows while it works: trials done out of the total, per
candidate the best objective so far, the elapsed time and an ETA.

On a terminal the last line is a live status line, redrawn every second and kept below the
one-line-per-trial log; elsewhere (a file, a pipe, a batch job's log) a plain progress line
follows each finished trial. Imports nothing heavy: the worker feeds it
:class:`~harness.study.progress.StudyProgress` snapshots.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.study.progress import StudyProgress


def clock(seconds: float) -> str:
    """``0:07``, ``12:30``, ``1:02:03``."""
    s = int(round(max(0.0, seconds)))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


class StudyDisplay:
    """The worker's view of the study. ``live``: a status line redrawn in place (default:
    when ``stream`` is a terminal)."""

    def __init__(self, stream: IO[str] | None = None, live: bool | None = None,
                 metric: str = "objective", now: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream or sys.stdout
        isatty = getattr(self.stream, "isatty", None)
        self.live = bool(isatty and isatty()) if live is None else live
        self.metric, self.now = metric, now
        self.started = now()
        self.first: tuple[float, int] | None = None  # (time, slots done) at the first snapshot
        self.last: StudyProgress | None = None
        self.job: tuple[str, float] | None = None  # (label, started)
        self._shown = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the worker calls ----------------------------------------------------------------
    def log(self, line: str) -> None:
        """A line of the log (a finished trial, a note), above the status line; passwords
        in it (a failure naming a storage URL) are masked."""
        from harness.store.masking import mask_text

        with self._lock:
            self._clear()
            self.stream.write(mask_text(line) + "\n")
            self._draw()

    def update(self, prog: StudyProgress) -> None:
        """A new snapshot of the study (after every trial and while waiting)."""
        with self._lock:
            before = self.last.done if self.last else None
            if self.first is None:
                self.first = (self.now(), prog.done)
            self.last = prog
            if self.live:
                self._clear()
                self._draw()
            elif before is not None and prog.done != before:
                self.stream.write(f"progress: {self.status()}\n")
                self.stream.flush()
        if self.live and self._thread is None:
            self._thread = threading.Thread(target=self._tick, name="study-display", daemon=True)
            self._thread.start()

    def job_started(self, label: str | None) -> None:
        with self._lock:
            self.job = (label, self.now()) if label else None
            if self.live:
                self._clear()
                self._draw()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._clear()

    # -- the text -----------------------------------------------------------------------------
    def eta(self) -> float | None:
        """Seconds left at the rate slots finished since this worker started (every worker's
        slots count); None before the first one finished."""
        if self.first is None or self.last is None:
            return None
        t0, done0 = self.first
        finished = self.last.done - done0
        if finished <= 0:
            return None
        return (self.now() - t0) / finished * (self.last.total - self.last.done)

    def status(self) -> str:
        prog = self.last
        if prog is None:
            return f"starting ({clock(self.now() - self.started)})"
        eta = self.eta()
        parts = [f"{prog.done}/{prog.total} trials", f"{clock(self.now() - self.started)} elapsed",
                 "ETA " + (clock(eta) if eta is not None else "after the first trial")]
        if prog.complete:
            parts[2] = "done"
        best = ", ".join(f"{c.name} {c.best_value:.4g}" for c in prog.candidates if c.best_value is not None)
        if best:
            parts.append(f"best {self.metric}: {best}")
        if self.job is not None:
            parts.append(f"running {self.job[0]} ({clock(self.now() - self.job[1])})")
        others = prog.running - (1 if self.job else 0)
        if others > 0:
            parts.append(f"{others} more running elsewhere")
        return " · ".join(parts)

    # -- drawing ------------------------------------------------------------------------------
    def _draw(self) -> None:
        if self.live:
            width = shutil.get_terminal_size((100, 24)).columns - 1
            line = self.status()
            self._shown = line if len(line) <= width else line[: max(0, width - 1)] + "…"
            self.stream.write(self._shown)
        self.stream.flush()

    def _clear(self) -> None:
        if self.live and self._shown:
            self.stream.write("\r\x1b[2K")
            self._shown = ""

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                self._clear()
                self._draw()

    def __enter__(self) -> StudyDisplay:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
