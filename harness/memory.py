"""Peak memory of one run or one measurement, not of the whole process.

On CUDA: ``torch.cuda.max_memory_allocated`` after resetting the peak at the start.
On CPU (Linux): the kernel's resident-set high-water mark (``VmHWM``), reset at the start by
writing 5 to ``/proc/self/clear_refs``. ``ru_maxrss`` is not used where this works: it is
the peak since the process started, so in a study worker it could only grow from one trial
to the next. The CPU figure includes the interpreter and libraries (hundreds of MB);
``cost/peak_rss_increase_mb`` is the rise above the resident size at the start, the part
the run itself added.
"""

from __future__ import annotations

import resource
from types import TracebackType
from typing import Any

from harness.keys import Metric


def proc_status_kb(key: str) -> int | None:
    """A field of /proc/self/status in kB (``VmRSS``, ``VmHWM``), or None without /proc."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset this process's resident-set high-water mark; False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return proc_status_kb("VmHWM") is not None


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.metrics()``."""

    def __init__(self, device: Any) -> None:
        self.cuda = getattr(device, "type", "cpu") == "cuda"
        self.device = device
        self.per_run = False
        self.start_kb = self.peak_kb = 0

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.start_kb = proc_status_kb("VmRSS") or 0
            self.per_run = reset_peak_rss()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.per_run:
            self.peak_kb = max(proc_status_kb("VmHWM") or 0, self.start_kb)

    def metrics(self) -> dict[str, float]:
        if self.cuda:
            import torch

            return {Metric.PEAK_GPU_MB: torch.cuda.max_memory_allocated(self.device) / 2**20}
        if not self.per_run:  # no /proc: the best available is the lifetime peak
            return {Metric.PEAK_RSS_MB: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        return {Metric.PEAK_RSS_MB: self.peak_kb / 1024,
                Metric.PEAK_RSS_INCREASE_MB: (self.peak_kb - self.start_kb) / 1024}
