"""What every benchmark shares: the machine line, a worker subprocess per measurement, timed
passes, peak resident memory, growth extrapolation, log-log slopes and dated records.

Each measurement runs in a fresh subprocess (``python -m harness.bench.<module> '<job json>'``
prints one JSON line), so one measurement's allocations, caches and crashes cannot leak into
the next. CPU memory is the rise of the process's resident set during the measured call:
the high-water mark is reset (``/proc/self/clear_refs``) just before and read (``VmHWM``)
after, minus ``VmRSS`` before; glibc's mmap and trim thresholds are fixed at 128 KiB in the
worker so freed blocks return to the system instead of being silently reused. Timed calls
come after that measurement, with the thresholds a long-running process settles at
(:func:`steady_allocator`): at 128 KiB every large temporary would be a fresh mapping whose
pages fault in on first touch, which can double the time of a layer that allocates much.

Torch is imported only inside functions (``harness --help`` stays fast).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.keys import Tag
from harness.runtime import devices
from harness.runtime.memory import proc_status_kb, reset_peak_rss

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
MAX_PASSES = 50
CPU_MEMORY_METHOD = (
    "rise of the process's resident set during the first full-size pass (VmHWM after "
    "resetting it through /proc/self/clear_refs, minus VmRSS before), in a fresh process "
    "with glibc's mmap/trim thresholds at 128 KiB; it includes inputs, gradients and library "
    "workspaces, so the smallest sizes read within a few MB of noise. The timed passes come "
    "after it, with the thresholds of a long-running process (mmap 32 MiB, trim 64 MiB)"
)


# -- in a worker process -------------------------------------------------------------------
def _status_kb(key: str) -> int:
    value = proc_status_kb(key)
    if value is None:
        raise RuntimeError(f"{key} not in /proc/self/status")
    return value


def peak_rss_mb(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Run ``fn`` and return its result and the rise of the resident set it caused, in MB."""
    before_kb = _status_kb("VmRSS")
    if not reset_peak_rss():
        raise RuntimeError("cannot reset the resident-set high-water mark (/proc/self/clear_refs)")
    result = fn()
    return result, max(0.0, (_status_kb("VmHWM") - before_kb) / 1024)  # counters lag ~256 KB


def steady_allocator() -> bool:
    """Give glibc the mmap/trim thresholds its dynamic adjustment reaches in a long-running
    process (mmap 32 MiB, its 64-bit maximum; trim twice that), after a memory measurement
    made at 128 KiB. False where there is no glibc ``mallopt``."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 * 2**20)) and bool(mallopt(m_trim_threshold, 64 * 2**20))


def peak_cuda_mb(fn: Callable[[], Any], device: Any) -> tuple[Any, float]:
    """Run ``fn``; the CUDA memory it allocated at its peak above what was allocated before."""
    import torch

    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = fn()
    return result, (torch.cuda.max_memory_allocated(device) - before) / 2**20


def peak_mb(fn: Callable[[], Any], device: Any) -> tuple[Any, float]:
    """Peak memory of one call on ``device`` (a torch.device): CUDA allocations or CPU RSS."""
    return peak_cuda_mb(fn, device) if device.type == "cuda" else peak_rss_mb(fn)


def synchronizer(device: Any) -> Callable[[], None]:
    """A function that waits for ``device`` (a no-op on CPU)."""
    import torch

    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def timed(fn: Callable[[], Any], min_time_s: float, sync: Callable[[], None] = lambda: None,
          max_passes: int = MAX_PASSES) -> list[float]:
    """Seconds of repeated calls of ``fn``: until ``min_time_s`` in all, at least one call,
    at most ``max_passes``."""
    times: list[float] = []
    while not times or (sum(times) < min_time_s and len(times) < max_passes):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return times


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def worker_main(measure: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """A worker's entry point: read the job from argv, print the result as one JSON line."""
    print(json.dumps(measure(json.loads(sys.argv[1]))), flush=True)


# -- in the parent process -----------------------------------------------------------------
def run_worker(module: str, job: dict[str, Any], *, threads: int, timeout_s: float,
               env: dict[str, str] | None = None) -> tuple[dict[str, Any] | None, str]:
    """Run ``python -m module '<job>'`` in a fresh process: (its JSON result, "ok"), or
    (None, "failed: <reason>"). Its stderr is passed on to ours line by line as it comes (a
    worker killed by a time limit leaves its trace in the log), and its last line is the
    reason of a failure."""
    import threading

    full_env = {**os.environ, **MALLOC_ENV, "OMP_NUM_THREADS": str(threads),
                "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"), **(env or {})}
    cmd = [sys.executable, "-m", module, json.dumps(job)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
    tail: list[str] = []
    chunks: list[str] = []

    def relay() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            tail[:] = [*tail[-19:], line]

    def collect() -> None:
        assert proc.stdout is not None
        chunks.append(proc.stdout.read())

    readers = [threading.Thread(target=f, daemon=True) for f in (relay, collect)]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None, f"failed: over {timeout_s:.0f} s"
    finally:
        for reader in readers:
            reader.join(timeout=5)
    out = "".join(chunks)
    if proc.returncode != 0:
        lines = ("".join(tail) or out or "").strip().splitlines()
        reason = lines[-1] if lines else f"exit code {proc.returncode}"
        if proc.returncode < 0:
            reason = f"killed by signal {-proc.returncode} (out of memory?)"
        return None, f"failed: {reason[:120]}"
    return json.loads(out.strip().splitlines()[-1]), "ok"


def extrapolate(points: Sequence[tuple[float, float]], x: float, lo: float = 1.0, hi: float = 2.0) -> float | None:
    """``y`` at ``x`` from the growth of the last two positive (x, y) points: the exponent of
    that growth clamped to [lo, hi] (``hi`` from a single point); None without points."""
    pts = [(a, b) for a, b in points if b and b > 0]
    if not pts:
        return None
    exponent = hi
    if len(pts) >= 2:
        (x1, y1), (x2, y2) = pts[-2], pts[-1]
        exponent = min(hi, max(lo, math.log(y2 / y1) / math.log(x2 / x1))) if y2 > y1 else lo
    last_x, last_y = pts[-1]
    return last_y * (x / last_x) ** exponent


def loglog_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of log y against log x (the exponent of a power law y ~ x^s);
    None with fewer than two distinct positive points."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y and y > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def load_line() -> str:
    """The machine's load right now (other processes compete for the cores)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unavailable"
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} (1, 5, 15 min)"


def machine(device: str) -> str:
    """One line describing the machine and software."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    parts = [f"CPU {cpu} ({cores} cores available)"]
    try:
        with open("/proc/meminfo") as f:
            total_kb = int(next(line.split()[1] for line in f if line.startswith("MemTotal")))
        parts.append(f"{total_kb / 2**20:.0f} GiB RAM")
    except (OSError, StopIteration):
        pass
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        facts = devices.device_tags(torch.device("cuda", 0))
        driver = facts.get(Tag.DRIVER_VERSION, "unknown")
        parts.append(f"GPU {props.name} ({props.total_memory / 2**30:.0f} GiB, compute capability "
                     f"{facts[Tag.DEVICE_CAPABILITY]}), CUDA {torch.version.cuda}, driver {driver}")
    parts.append(f"torch {torch.__version__}, Python {platform.python_version()}, {platform.system()}")
    return "; ".join(parts)


def resolve_device(requested: str) -> str:
    """``auto`` -> cuda when torch sees one, else cpu; a clear error for a missing GPU."""
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise HarnessError("--device cuda was requested but torch sees no CUDA device.")
    return requested


def default_budget_gb(device: str) -> float:
    """Half the memory available now (CPU), or 90% of the free GPU memory."""
    if device == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info()
        return 0.9 * free / 2**30
    try:
        with open("/proc/meminfo") as f:
            available_kb = int(next(line.split()[1] for line in f if line.startswith("MemAvailable")))
        return 0.5 * available_kb / 2**20
    except (OSError, StopIteration):
        return 4.0


def record_path(output: str | None, name: str, device: str, started: datetime,
                directory: str = "benchmarks") -> Path | None:
    """Where a benchmark writes its record: ``--output PATH`` (never an existing file), none
    for ``-``, else a new dated file ``benchmarks/<name>_<device>_<date>.md`` (``-2``, ``-3``
    ... when that date already has one): a committed record is never overwritten."""
    from harness.runtime.paths import new_file

    if output == "-":
        return None
    if output:  # checked before any measurement: a refusal after them would lose them
        return new_file(output, "--output")
    stem = f"{name}_{device}_{started:%Y-%m-%d}"
    path, n = Path(directory) / f"{stem}.md", 1
    while path.exists():
        n += 1
        path = Path(directory) / f"{stem}-{n}.md"
    return new_file(path, "the record (--output to choose another)")


def write_record(path: Path | None, text: str) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"\nwritten to {path}")


def append_record(path: str | Path, title: str, command: str, load_before: str, body: list[str]) -> None:
    """Print a dated section (machine, load before and after, command, then ``body``) and
    append it to the record at ``path``: for the scripts in ``benchmarks/`` that keep one
    growing file of measurements."""
    text = "\n".join([f"\n## {datetime.now().astimezone():%Y-%m-%d %H:%M %Z} {title}".rstrip(), "",
                      f"`{command}`", "", f"Machine: {machine('cpu')}; {load_before} at the start, "
                      f"{load_line()} at the end (a shared machine: other users' processes may run).",
                      "", *body, ""])
    print(text)
    with open(path, "a") as f:
        f.write(text)


def command_line() -> str:
    """The command as typed (``harness ...``), for the record."""
    import shlex

    return "harness " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def header(title: str, *, device: str, command: str, started: datetime, seconds: float,
           load_before: str, load_after: str) -> str:
    """The first lines of every record: machine, date, duration, command and machine load."""
    return (f"# {title}\n\n- Machine: {machine(device)}\n"
            f"- Date: {started:%Y-%m-%d %H:%M} UTC; the run took {seconds / 60:.1f} min\n"
            f"- Command: `{command}`\n"
            f"- Machine load: before the run {load_before}; after it {load_after}\n")


#: the environment variable naming the process groups to pause while a measurement times the GPU
#: (the GPU proof's FLA warmers: harness.bench.proof)
QUIET_ENV = "HARNESS_QUIET_PGIDS"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Pause the warmers (SIGSTOP to the groups in ``HARNESS_QUIET_PGIDS``) while a measurement
    times the GPU, so their launches do not share it; SIGCONT after."""
    groups = [int(g) for g in os.environ.get(QUIET_ENV, "").split(",") if g.strip()]
    for sig in (signal.SIGSTOP,):
        for g in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(g, sig)
    try:
        yield
    finally:
        for g in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(g, signal.SIGCONT)
