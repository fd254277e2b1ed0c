"""Peak memory of one run, measured per run (not per process).

On CUDA: ``torch.cuda.max_memory_allocated`` after resetting the peak at the start.
On CPU: the process's resident set size sampled every 10 ms from ``/proc/self/statm``
during the run. ``ru_maxrss`` is not used: it is the peak since the process started, so in
a study worker it could only grow from one trial to the next. The CPU figure includes the
interpreter and libraries (hundreds of MB); ``cost/peak_rss_increase_mb`` is the rise above
the resident size at the start of the run, the part the run itself added.
"""

from __future__ import annotations

import os
import resource
import threading
from types import TracebackType
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_mb() -> float | None:
    """Current resident set size in MiB, or None where /proc is unavailable."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE / 2**20
    except (OSError, IndexError, ValueError):
        return None


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.metrics()``."""

    def __init__(self, device: Any, interval_s: float = 0.01) -> None:
        self.cuda = getattr(device, "type", "cpu") == "cuda"
        self.device = device
        self.interval_s = interval_s
        self.start_mb = self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        now = resident_mb()
        if now is not None:
            self.start_mb = self.peak_mb = now
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            now = resident_mb()
            if now is not None and now > self.peak_mb:
                self.peak_mb = now

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            now = resident_mb()
            self.peak_mb = max(self.peak_mb, now or 0.0)

    def metrics(self) -> dict[str, float]:
        if self.cuda:
            import torch

            return {"cost/peak_gpu_mem_mb": torch.cuda.max_memory_allocated(self.device) / 2**20}
        if self._thread is None:  # no /proc: fall back to the lifetime peak
            return {"cost/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        return {"cost/peak_rss_mb": self.peak_mb,
                "cost/peak_rss_increase_mb": self.peak_mb - self.start_mb}
