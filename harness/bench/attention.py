"""Attention benchmark: forward + backward throughput and peak memory of every variant.

Each (variant, length) is measured in a fresh subprocess (``python -m harness.bench.attention``), so
one measurement's allocations, caches and crashes (out of memory) cannot leak into the
next, next to two PyTorch baselines measured the same way in the same run:

* ``torch.sdpa``: a minimal layer of PyTorch's own: fused q/k/v projection,
  ``F.scaled_dot_product_attention`` (``is_causal``), output projection;
* ``torch.nn.MultiheadAttention``: PyTorch's module (``need_weights=False``).

Throughput is tokens (batch x length) per second of one forward + backward pass, from the
median of repeated passes after a warm-up. Peak memory:

* CUDA: ``torch.cuda.max_memory_allocated`` during the pass minus the memory allocated
  before it (tensors, not the caching allocator's reserve);
* CPU: the rise of the process's resident set during the first full-size pass: the
  high-water mark is reset (``/proc/self/clear_refs``) just before the pass and read
  (``VmHWM``) after it, minus ``VmRSS`` before. It counts every byte the pass touches
  (PyTorch's tensors and library workspaces). glibc's mmap and trim thresholds are fixed
  at 128 KiB so freed blocks return to the system instead of being silently reused.

A length whose memory, extrapolated from the variant's smaller lengths, would exceed the
budget is skipped and reported as ``skipped (est. X GB)``. Torch is imported only inside
functions (``harness --help`` stays fast); the core names no concrete variant.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from harness.memory import proc_status_kb, reset_peak_rss

BASELINES = ("torch.sdpa", "torch.nn.MultiheadAttention")
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


@dataclass
class Settings:
    lengths: tuple[int, ...] = (256, 1024, 4096)
    batch: int = 2
    d_model: int = 64
    heads: int = 4
    device: str = "cpu"
    dtype: str = "float32"
    causal: bool = True
    threads: int = 1
    variants: tuple[str, ...] = ()  # empty: every registered variant
    plugins: tuple[str, ...] = ()  # local plugin files
    max_memory_gb: float = 8.0
    min_time_s: float = 1.0  # time passes until this much, at least 1, at most 50
    timeout_s: float = 600.0


@dataclass
class Measurement:
    variant: str
    length: int
    status: str = "ok"  # or "skipped (...)", "failed: ..."
    heads: int | None = None
    ms: float | None = None  # median forward + backward time
    tokens_per_s: float | None = None
    peak_mb: float | None = None
    passes: int = 0


# -- in the worker process -----------------------------------------------------------------
def _proc_status_kb(key: str) -> int:
    value = proc_status_kb(key)
    if value is None:
        raise RuntimeError(f"{key} not in /proc/self/status")
    return value


def _layer(job: dict[str, Any]) -> tuple[Any, Any]:
    """The module and a function running it causally or not on (B, L, d) inputs."""
    import torch
    import torch.nn.functional as F

    d, h, causal = job["d_model"], job["heads"], job["causal"]
    if job["variant"] == "torch.nn.MultiheadAttention":
        mha = torch.nn.MultiheadAttention(d, h, batch_first=True)

        def run_mha(x: Any) -> Any:
            mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1) if causal else None
            return mha(x, x, x, attn_mask=mask, is_causal=causal, need_weights=False)[0]

        return mha, run_mha
    if job["variant"] == "torch.sdpa":
        qkv, out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

        def run_sdpa(x: Any) -> Any:
            b, n, _ = x.shape
            q, k, v = qkv(x).view(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return out(y.transpose(1, 2).reshape(b, n, d))

        return torch.nn.ModuleList([qkv, out]), run_sdpa
    from harness.loader import load

    spec = load(job["plugins"]).get("attention", job["variant"])
    layer = spec.build(spec.config(), d_model=d, num_heads=h)
    return layer, lambda x: layer(x, causal=causal)[0]


def measure(job: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in this process (the worker side)."""
    import torch

    torch.set_num_threads(job["threads"])
    device, dtype = torch.device(job["device"]), getattr(torch, job["dtype"])
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    module, run = _layer(job)
    module.to(device=device, dtype=dtype)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def one_pass(length: int) -> None:
        x = torch.randn(job["batch"], length, job["d_model"], device=device, dtype=dtype, requires_grad=True)
        run(x).backward(torch.ones(x.shape, device=device, dtype=dtype))
        module.zero_grad(set_to_none=True)

    one_pass(8)  # initialise kernels and thread pools outside the measurement
    sync()
    length = job["length"]
    if cuda:
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        one_pass(length)
        peak_mb = (torch.cuda.max_memory_allocated(device) - before) / 2**20
    else:
        before_kb = _proc_status_kb("VmRSS")
        if not reset_peak_rss():
            raise RuntimeError("cannot reset the resident-set high-water mark (/proc/self/clear_refs)")
        one_pass(length)
        peak_mb = max(0.0, (_proc_status_kb("VmHWM") - before_kb) / 1024)  # counters lag ~256 KB
    sync()
    times: list[float] = []
    while not times or (sum(times) < job["min_time_s"] and len(times) < 50):
        start = time.perf_counter()
        one_pass(length)
        sync()
        times.append(time.perf_counter() - start)
    heads = getattr(module, "num_heads", job["heads"])
    return {"ms": 1000 * statistics.median(times), "passes": len(times), "peak_mb": peak_mb, "heads": heads}


# -- in the parent process -----------------------------------------------------------------
def run_one(settings: Settings, variant: str, length: int) -> Measurement:
    """Measure one (variant, length) in a fresh subprocess."""
    job = {**asdict(settings), "variant": variant, "length": length}
    env = {**os.environ, **MALLOC_ENV, "OMP_NUM_THREADS": str(settings.threads),
           "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    cmd = [sys.executable, "-m", "harness.bench.attention", json.dumps(job)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=settings.timeout_s)
    except subprocess.TimeoutExpired:
        return Measurement(variant, length, f"failed: over {settings.timeout_s:.0f} s")
    if done.returncode != 0:
        lines = (done.stderr or done.stdout or "").strip().splitlines()
        reason = lines[-1] if lines else f"exit code {done.returncode}"
        if done.returncode < 0:
            reason = f"killed by signal {-done.returncode} (out of memory?)"
        return Measurement(variant, length, f"failed: {reason[:120]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    tokens = settings.batch * length
    return Measurement(variant, length, "ok", result["heads"], result["ms"],
                       tokens / (result["ms"] / 1000), result["peak_mb"], result["passes"])


def estimate_gb(measured: list[Measurement], length: int) -> float | None:
    """Peak memory at ``length`` extrapolated from smaller lengths: the growth exponent
    of the last two measurements (clamped to [1, 2]), or quadratic from a single one."""
    points = [(m.length, m.peak_mb) for m in measured if m.peak_mb and m.peak_mb > 0]
    if not points:
        return None
    exponent = 2.0
    if len(points) >= 2:
        (l1, p1), (l2, p2) = points[-2], points[-1]
        exponent = min(2.0, max(1.0, math.log(p2 / p1) / math.log(l2 / l1))) if p2 > p1 else 1.0
    last_length, last_mb = points[-1]
    return last_mb * (length / last_length) ** exponent / 1024


def benchmark(settings: Settings, names: list[str], progress: Any = print) -> list[Measurement]:
    """Every name (baselines first) at every length, smallest first."""
    results: list[Measurement] = []
    for name in [*BASELINES, *names]:
        done: list[Measurement] = []
        for length in sorted(settings.lengths):
            est = estimate_gb(done, length)
            if done and done[-1].status != "ok" and not done[-1].status.startswith("skipped"):
                m = Measurement(name, length, "skipped (a shorter length failed)")
            elif est is not None and est > settings.max_memory_gb:
                m = Measurement(name, length, f"skipped (est. {est:.1f} GB)")
            else:
                m = run_one(settings, name, length)
            done.append(m)
            results.append(m)
            progress(format_row(m, results))
    return results


# -- reporting -----------------------------------------------------------------------------
def _baseline(results: list[Measurement], name: str, length: int) -> Measurement | None:
    return next((m for m in results if m.variant == name and m.length == length and m.status == "ok"), None)


def _ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}" if value and base else "-"


def format_row(m: Measurement, results: list[Measurement]) -> str:
    if m.status != "ok":
        return f"| {m.variant} | {m.heads or '-'} | {m.length} | {m.status} |" + " |" * 7
    speed, memory = [], []
    for name in BASELINES:
        base = _baseline(results, name, m.length)
        speed.append(_ratio(m.tokens_per_s, base.tokens_per_s if base else None))
        memory.append(_ratio(m.peak_mb, base.peak_mb if base else None))
    return (
        f"| {m.variant} | {m.heads} | {m.length} | {m.ms:.1f} | {m.passes} | {m.tokens_per_s:,.0f} "
        f"| {' | '.join(speed)} | {m.peak_mb:,.1f} | {' | '.join(memory)} |"
    )


MEMORY_METHOD = {
    "cuda": "`torch.cuda.max_memory_allocated` during the pass minus the memory allocated before it",
    "cpu": "rise of the process's resident set during the first full-size pass (VmHWM after "
           "resetting it through /proc/self/clear_refs, minus VmRSS before), in a fresh process "
           "with glibc's mmap/trim thresholds at 128 KiB; it includes inputs, gradients and library "
           "workspaces, so the smallest sizes read within a few MB of noise",
}
HEADER = (
    "| variant | heads | L | fwd+bwd ms | passes | tokens/s | speed × SDPA | speed × MHA "
    "| peak MB | memory × SDPA | memory × MHA |\n" + "|---" * 11 + "|"
)


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
        parts.append(f"GPU {props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}")
    parts.append(f"torch {torch.__version__}, Python {platform.python_version()}, {platform.system()}")
    return "; ".join(parts)


def markdown(settings: Settings, results: list[Measurement], machine_line: str, command: str,
             started: datetime, seconds: float) -> str:
    mode = "causal self-attention" if settings.causal else "bidirectional self-attention"
    rows = "\n".join(format_row(m, results) for m in results)
    return f"""# Attention benchmark ({settings.device})

- Machine: {machine_line}
- Date: {started:%Y-%m-%d %H:%M} UTC; the run took {seconds / 60:.1f} min
- Command: `{command}`
- Workload: {mode}, batch {settings.batch}, d_model {settings.d_model}, {settings.heads} model heads,
  {settings.dtype}, {settings.threads} torch thread(s); every variant at its default hyper-parameters
  (`heads` is the head count the layer runs: the single-head classics ignore the model's).
- Throughput: tokens (batch x length) per second of one forward + backward pass: the median
  of the timed passes (repeated for {settings.min_time_s:g} s, at least 1, at most 50; column
  `passes`) after one untimed full-size pass; each (variant, length) runs in a fresh subprocess.
- Peak memory: {MEMORY_METHOD[settings.device]}.
- Baselines, same run and settings: `torch.sdpa` = fused q/k/v projection +
  `F.scaled_dot_product_attention` + output projection; `torch.nn.MultiheadAttention` =
  PyTorch's module with `need_weights=False`. Ratios: speed × = variant tokens/s ÷ baseline
  tokens/s (above 1 is faster); memory × = variant peak ÷ baseline peak (below 1 is smaller).
- Skipped sizes: peak memory extrapolated from the variant's shorter lengths would exceed
  {settings.max_memory_gb:.1f} GB.

{HEADER}
{rows}
"""


def main() -> None:
    """Worker entry point: ``python -m harness.bench.attention '<job json>'`` prints one JSON line."""
    print(json.dumps(measure(json.loads(sys.argv[1]))))


if __name__ == "__main__":
    main()

