"""Attention benchmark: forward + backward throughput and peak memory of every variant.

Each (variant, length) is measured in a fresh subprocess (``python -m harness.bench.attention``,
see :mod:`harness.bench.common`), next to two PyTorch baselines measured the same way in the
same run:

* ``torch.sdpa``: a minimal layer of PyTorch's own: fused q/k/v projection,
  ``F.scaled_dot_product_attention`` (``is_causal``), output projection;
* ``torch.nn.MultiheadAttention``: PyTorch's module (``need_weights=False``).

Throughput is tokens (batch x length) per second of one forward + backward pass, from the
median of repeated passes after a warm-up. Peak memory:

* CUDA: ``torch.cuda.max_memory_allocated`` during the pass minus the memory allocated
  before it (tensors, not the caching allocator's reserve);
* CPU: the rise of the process's resident set during the first full-size pass.

A length whose memory (or time), extrapolated from the variant's smaller lengths, would
exceed the budget is skipped and reported as ``skipped (est. X GB)``. The same measurement
serves ``harness bench mixer``: a name ``mixer:<name>`` builds a sequence mixer instead of
an attention variant. The core names no concrete variant.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

from harness.bench import common

BASELINES = ("torch.sdpa", "torch.nn.MultiheadAttention")


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
    max_pass_s: float = 0.0  # skip a length whose pass would take longer (estimated); 0: never
    either_direction: bool = False  # run a layer that cannot run causally (or not) the other way
    baselines: tuple[str, ...] = BASELINES


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
    causal: bool | None = None  # the direction it ran


# -- in the worker process -----------------------------------------------------------------
def _baseline_layer(job: dict[str, Any]) -> tuple[Any, Any]:
    """One of PyTorch's own layers and a function running it on (B, L, d) inputs."""
    import torch
    import torch.nn.functional as F

    d, h, causal = job["d_model"], job["heads"], job["causal"]
    if job["variant"] == "torch.nn.MultiheadAttention":
        mha = torch.nn.MultiheadAttention(d, h, batch_first=True)

        def run_mha(x: Any) -> Any:
            mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1) if causal else None
            return mha(x, x, x, attn_mask=mask, is_causal=causal, need_weights=False)[0]

        return mha, run_mha
    qkv, out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def run_sdpa(x: Any) -> Any:
        b, n, _ = x.shape
        q, k, v = qkv(x).view(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return out(y.transpose(1, 2).reshape(b, n, d))

    return torch.nn.ModuleList([qkv, out]), run_sdpa


def split_name(name: str) -> tuple[str, str]:
    """``mixer:mamba`` -> (mixer, mamba); a bare name is an attention variant."""
    kind, _, plain = name.rpartition(":")
    return kind or "attention", plain


def _layer(job: dict[str, Any]) -> tuple[Any, Any]:
    """The module and a function running it causally or not on (B, L, d) inputs."""
    if job["variant"] in BASELINES:
        return _baseline_layer(job)
    from harness.registry.loader import load

    kind, name = split_name(job["variant"])
    spec = load(job["plugins"]).get(kind, name)
    config = spec.config()
    if getattr(config, "max_length", job["length"]) < job["length"]:  # a fixed-length layer (Linformer)
        config = dataclasses.replace(config, max_length=job["length"])
    layer = spec.build(config, d_model=job["d_model"], num_heads=job["heads"])
    causal = job["causal"]
    if job.get("either_direction") and ("causal" if causal else "bidirectional") not in layer.directions:
        causal = not causal
    job["ran_causal"] = causal
    return layer, lambda x: layer(x, causal=causal)[0]


def measure(job: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in this process (the worker side)."""
    import torch

    torch.set_num_threads(job["threads"])
    device, dtype = torch.device(job["device"]), getattr(torch, job["dtype"])
    sync = common.synchronizer(device)
    torch.manual_seed(0)
    module, run = _layer(job)
    module.to(device=device, dtype=dtype)

    def one_pass(length: int) -> None:
        x = torch.randn(job["batch"], length, job["d_model"], device=device, dtype=dtype, requires_grad=True)
        run(x).backward(torch.ones(x.shape, device=device, dtype=dtype))
        module.zero_grad(set_to_none=True)

    one_pass(8)  # initialise kernels and thread pools outside the measurement
    sync()
    length = job["length"]
    _, peak_mb = common.peak_mb(lambda: one_pass(length), device)
    sync()
    common.steady_allocator()
    times = common.timed(lambda: one_pass(length), job["min_time_s"], sync)
    heads = getattr(module, "num_heads", job["heads"])
    return {"ms": 1000 * common.median(times), "passes": len(times), "peak_mb": peak_mb, "heads": heads,
            "causal": job.get("ran_causal", job["causal"])}


# -- in the parent process -----------------------------------------------------------------
def run_one(settings: Settings, variant: str, length: int) -> Measurement:
    """Measure one (variant, length) in a fresh subprocess."""
    job = {**asdict(settings), "variant": variant, "length": length}
    result, status = common.run_worker("harness.bench.attention", job, threads=settings.threads,
                                       timeout_s=settings.timeout_s)
    if result is None:
        return Measurement(variant, length, status)
    tokens = settings.batch * length
    return Measurement(variant, length, "ok", result["heads"], result["ms"],
                       tokens / (result["ms"] / 1000), result["peak_mb"], result["passes"], result["causal"])


def estimate_gb(measured: list[Measurement], length: int) -> float | None:
    """Peak memory at ``length`` extrapolated from smaller lengths: the growth exponent
    of the last two measurements (clamped to [1, 2]), or quadratic from a single one."""
    mb = common.extrapolate([(m.length, m.peak_mb or 0.0) for m in measured], length)
    return None if mb is None else mb / 1024


def estimate_s(measured: list[Measurement], length: int) -> float | None:
    """Seconds of one pass at ``length``, extrapolated the same way (exponent in [1, 3])."""
    ms = common.extrapolate([(m.length, m.ms or 0.0) for m in measured], length, hi=3.0)
    return None if ms is None else ms / 1000


def skip_reason(settings: Settings, done: list[Measurement], length: int) -> str | None:
    """Why ``length`` is not measured after the shorter ones in ``done``, or None."""
    if done and done[-1].status.startswith(("failed", "skipped (a shorter")):
        return "skipped (a shorter length failed)"
    est = estimate_gb(done, length)
    if est is not None and est > settings.max_memory_gb:
        return f"skipped (est. {est:.1f} GB)"
    secs = estimate_s(done, length) if done else None
    if settings.max_pass_s and secs is not None and secs > settings.max_pass_s:
        return f"skipped (est. {secs:.0f} s a pass)"
    return None


def benchmark(settings: Settings, names: list[str], progress: Any = print) -> list[Measurement]:
    """Every name (baselines first) at every length, smallest first."""
    results: list[Measurement] = []
    for name in [*settings.baselines, *names]:
        done: list[Measurement] = []
        for length in sorted(settings.lengths):
            reason = skip_reason(settings, done, length)
            m = Measurement(name, length, reason) if reason else run_one(settings, name, length)
            done.append(m)
            results.append(m)
            progress(format_row(m, results, settings.baselines))
    return results


# -- reporting -----------------------------------------------------------------------------
def _baseline(results: list[Measurement], name: str, length: int) -> Measurement | None:
    return next((m for m in results if m.variant == name and m.length == length and m.status == "ok"), None)


def _ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}" if value and base else "-"


def format_row(m: Measurement, results: list[Measurement], baselines: tuple[str, ...] = BASELINES) -> str:
    if m.status != "ok":
        return f"| {m.variant} | {m.heads or '-'} | {m.length} | {m.status} |" + " |" * (3 + 2 * len(baselines))
    speed, memory = [], []
    for name in baselines:
        base = _baseline(results, name, m.length)
        speed.append(_ratio(m.tokens_per_s, base.tokens_per_s if base else None))
        memory.append(_ratio(m.peak_mb, base.peak_mb if base else None))
    return (
        f"| {m.variant} | {m.heads} | {m.length} | {m.ms:.1f} | {m.passes} | {m.tokens_per_s:,.0f} "
        f"| {' | '.join(speed)} | {m.peak_mb:,.1f} | {' | '.join(memory)} |"
    )


MEMORY_METHOD = {
    "cuda": "`torch.cuda.max_memory_allocated` during the pass minus the memory allocated before it",
    "cpu": common.CPU_MEMORY_METHOD,
}
SHORT = {"torch.sdpa": "SDPA", "torch.nn.MultiheadAttention": "MHA"}


def header(baselines: tuple[str, ...] = BASELINES) -> str:
    """The table's header row for these baselines."""
    speed = "".join(f" speed × {SHORT[b]} |" for b in baselines)
    memory = "".join(f" memory × {SHORT[b]} |" for b in baselines)
    return (f"| variant | heads | L | fwd+bwd ms | passes | tokens/s |{speed} peak MB |{memory}\n"
            + "|---" * (7 + 2 * len(baselines)) + "|")


HEADER = header()


def workload(settings: Settings) -> str:
    """The settings and the measurement method, as Markdown bullets."""
    mode = "causal" if settings.causal else "bidirectional"
    skip = f"{settings.max_memory_gb:.1f} GB"
    if settings.max_pass_s:
        skip += f" or one pass would take over {settings.max_pass_s:g} s"
    return f"""- Workload: {mode} self-mixing, batch {settings.batch}, d_model {settings.d_model}, {settings.heads} model heads,
  {settings.dtype}, {settings.threads} torch thread(s); every layer at its default hyper-parameters
  (`heads` is the head count the layer runs: the single-head classics ignore the model's), but
  a layer built for a maximum length (Linformer's `max_length`) is built for the length measured.
- Throughput: tokens (batch x length) per second of one forward + backward pass: the median
  of the timed passes (repeated for {settings.min_time_s:g} s, at least 1, at most {common.MAX_PASSES}; column
  `passes`) after one untimed full-size pass; each (layer, length) runs in a fresh subprocess.
- Peak memory: {MEMORY_METHOD[settings.device]}.
- Skipped sizes: extrapolated from the layer's shorter lengths, peak memory would exceed {skip}."""


def markdown(settings: Settings, results: list[Measurement], head: str) -> str:
    """The record: ``head`` (machine, date, command: :func:`common.header`) and the table."""
    rows = "\n".join(format_row(m, results, settings.baselines) for m in results)
    return f"""{head}{workload(settings)}
- Baselines, same run and settings: `torch.sdpa` = fused q/k/v projection +
  `F.scaled_dot_product_attention` + output projection; `torch.nn.MultiheadAttention` =
  PyTorch's module with `need_weights=False`. Ratios: speed × = variant tokens/s ÷ baseline
  tokens/s (above 1 is faster); memory × = variant peak ÷ baseline peak (below 1 is smaller).

{HEADER}
{rows}
"""


if __name__ == "__main__":
    common.worker_main(measure)
