"""Decoding benchmark: generated tokens per second and decoding memory against context length,
for every architecture that generates.

Architectures (``kind:name``): ``attention:<variant>`` for every attention variant that runs
causally and ``mixer:<name>`` for every sequence mixer, each in the ``transformer`` model
(every block the same layer; its decoding state is the KV cache of attention, the running
sums of linear attention, the recurrent state of a mixer), and ``model:<name>`` for the
language models that take neither (``lstm``, ``gru``: the recurrent state).

Each (architecture, context) is measured in a fresh subprocess (see :mod:`harness.bench.common`):
the model (evaluation mode, no gradients) reads a random prompt of ``context`` tokens
through its cache in one call (the prefill, timed on its own), then generates ``new_tokens``
tokens greedily, one call per token; the time per generated token is the median of those
calls. Memory: ``state MB`` is the decoding cache the model holds after the generation (every
tensor it keeps, all layers, the whole batch); ``peak MB`` is the rise of resident memory
(CUDA: allocated memory) during the generation, after the prefill.

The growth with context: the log-log slope of the state over the contexts from ``fit_from``
on, and the exponent of the part of the time per token that grows, once the constant cost of
a call is fitted out (:func:`growth_slope`): about 1 for attention (every new token reads the
whole cache), about 0 for recurrent forms (a fixed-size state).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.bench import common

VOCAB = 64


@dataclass
class Settings:
    contexts: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192)
    new_tokens: int = 16
    batch: int = 1
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    device: str = "cpu"
    dtype: str = "float32"
    threads: int = 1
    plugins: tuple[str, ...] = ()
    max_memory_gb: float = 8.0
    max_prefill_s: float = 300.0  # skip a context whose prefill would take longer (estimated)
    timeout_s: float = 900.0
    fit_from: int = 1024


@dataclass
class Point:
    arch: str
    context: int
    status: str = "ok"
    ms_per_token: float | None = None
    tokens_per_s: float | None = None
    state_mb: float | None = None
    peak_mb: float | None = None
    prefill_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def architectures(registry: Any) -> list[str]:
    """Every architecture that generates incrementally, as ``kind:name`` (a language model
    whose class has no ``new_cache`` recomputes the prefix for every token: not listed)."""
    names = [f"attention:{n}" for n in registry.names("attention")
             if "causal" in (registry.get("attention", n).directions or {"causal"})]
    names += [f"mixer:{n}" for n in registry.names("mixer")
              if "causal" in (registry.get("mixer", n).directions or {"causal"})]
    for n in registry.names("model"):
        spec = registry.get("model", n)
        if ("lm" in spec.task_kinds and not spec.uses_attention and not spec.uses_mixer
                and hasattr(spec.build, "new_cache")):
            names.append(f"model:{n}")
    return names


# -- in the worker process -----------------------------------------------------------------
def build(arch: str, *, d_model: int, layers: int, heads: int, vocab: int = VOCAB, max_length: int = 512,
          registry: Any = None) -> Any:
    """The model an architecture name stands for (see the module documentation)."""
    import harness
    from harness.registry.loader import load

    registry = registry or load()
    kind, name = arch.split(":", 1)
    if kind == "model":
        width = registry.get("model", name).width_param or "width"
        params: dict[str, Any] = {width: d_model, "layers": layers}
        return harness.create_model(name, vocab_size=vocab, max_length=max_length, registry=registry, **params)
    attention, mixer = (name, None) if kind == "attention" else (None, name)
    return harness.create_model("transformer", vocab_size=vocab, max_length=max_length, registry=registry,
                                attention=attention, mixer=mixer, d_model=d_model, layers=layers, heads=heads)


def cache_bytes(cache: Any) -> int:
    """Bytes of every tensor a model's decoding cache keeps (nested lists, dicts, caches)."""
    import torch

    seen: set[int] = set()

    def walk(obj: Any) -> int:
        if isinstance(obj, torch.Tensor):
            if id(obj) in seen:
                return 0
            seen.add(id(obj))
            return obj.numel() * obj.element_size()
        if isinstance(obj, dict):
            return sum(walk(v) for v in obj.values())
        if isinstance(obj, list | tuple):
            return sum(walk(v) for v in obj)
        if hasattr(obj, "tensors"):
            return sum(walk(t) for t in obj.tensors())
        if hasattr(obj, "state"):
            return walk(obj.state)
        return 0

    return walk(cache)


def generate(model: Any, prompt: Any, new_tokens: int, *, cached: bool = True,
             on_step: Any = None) -> tuple[Any, list[Any]]:
    """Greedy continuation of ``prompt`` (B, C): the new tokens (B, n) and the logits that
    chose each. Cached: the prompt once, then one position per call; else the whole prefix
    every call. ``on_step(i)`` is called after each generated token (for timing)."""
    import torch

    logits_seen: list[Any] = []
    with torch.no_grad():
        if cached:
            cache = model.new_cache()
            logits = model(prompt, cache=cache)[:, -1]
        else:
            tokens = prompt
            logits = model(tokens)[:, -1]
        out = []
        for i in range(new_tokens):
            logits_seen.append(logits)
            nxt = logits.argmax(-1, keepdim=True)
            out.append(nxt)
            if i == new_tokens - 1:
                break
            if cached:
                logits = model(nxt, cache=cache)[:, -1]
            else:
                tokens = torch.cat([tokens, nxt], dim=1)
                logits = model(tokens)[:, -1]
            if on_step is not None:
                on_step(i)
    return torch.cat(out, dim=1), logits_seen


def measure(job: dict[str, Any]) -> dict[str, Any]:
    """One (architecture, context) point, in this process."""
    import time

    import torch

    from harness.registry.loader import load

    torch.set_num_threads(job["threads"])
    device, dtype = torch.device(job["device"]), getattr(torch, job["dtype"])
    sync = common.synchronizer(device)
    torch.manual_seed(0)
    context, new = job["context"], job["new_tokens"]
    model = build(job["arch"], d_model=job["d_model"], layers=job["layers"], heads=job["heads"],
                  max_length=context + new, registry=load(job["plugins"]))
    model.to(device=device, dtype=dtype).eval()
    prompt = torch.randint(4, VOCAB, (job["batch"], context), device=device)
    with torch.no_grad():
        generate(model, prompt[:, :8], 2)  # initialise kernels outside the measurement
        cache = model.new_cache()
        start = time.perf_counter()
        logits = model(prompt, cache=cache)
        sync()
        prefill = time.perf_counter() - start
        times: list[float] = []

        def run(record: list[float]) -> None:
            nonlocal logits
            for _ in range(new):
                start = time.perf_counter()
                logits = model(logits[:, -1:].argmax(-1), cache=cache)
                sync()
                record.append(time.perf_counter() - start)

        _, peak = common.peak_mb(lambda: run([]), device)  # untimed, small allocator thresholds
        common.steady_allocator()
        run(times)
    ms = 1000 * common.median(times)
    return {"ms_per_token": ms, "tokens_per_s": job["batch"] / (ms / 1000),
            "state_mb": cache_bytes(cache) / 2**20, "peak_mb": peak, "prefill_s": prefill}


# -- in the parent process -----------------------------------------------------------------
def run_one(settings: Settings, arch: str, context: int) -> Point:
    job = {**asdict(settings), "arch": arch, "context": context}
    result, status = common.run_worker("harness.bench.decode", job, threads=settings.threads,
                                       timeout_s=settings.timeout_s)
    if result is None:
        return Point(arch, context, status)
    return Point(arch, context, **result)


def skip_reason(settings: Settings, done: list[Point], context: int) -> str | None:
    if done and done[-1].status != "ok":
        return "skipped (a shorter context failed)"
    mb = common.extrapolate([(p.context, (p.peak_mb or 0) + (p.state_mb or 0)) for p in done], context)
    if mb is not None and mb / 1024 > settings.max_memory_gb:
        return f"skipped (est. {mb / 1024:.1f} GB)"
    secs = common.extrapolate([(p.context, p.prefill_s or 0) for p in done], context, hi=2.0)
    if secs is not None and secs > settings.max_prefill_s:
        return f"skipped (est. prefill {secs:.0f} s)"
    return None


def benchmark(settings: Settings, archs: list[str], progress: Any = print) -> list[Point]:
    results: list[Point] = []
    for arch in archs:
        done: list[Point] = []
        for context in sorted(settings.contexts):
            reason = skip_reason(settings, done, context)
            p = Point(arch, context, reason) if reason else run_one(settings, arch, context)
            done.append(p)
            results.append(p)
            progress(format_row(p))
    return results


#: Growth of the per-token time below this share of the constant cost is no growth (O(1)).
FLAT = 0.15


def growth_slope(points: list[tuple[int, float]], fit_from: int) -> float | None:
    """The exponent p of the part of the per-token time that grows with the context.

    A decoding call costs a constant (projections, MLPs, the call itself) plus what depends on
    the context (attention reads the whole cache); on a CPU at small widths the constant hides
    the growing part until contexts of tens of thousands, so a plain log-log slope of the time
    reads about 0.3 for attention. Fitted instead: time = a + b * context^p. The constant a
    starts as the time at the smallest context (below ``fit_from``); p and b are the
    least-squares fit of log(time - a) on log(context) over the contexts from ``fit_from`` on;
    then a = time at the smallest context - b * its context^p (the smallest context's own
    growing share), repeated until a settles. 0 when the time at the largest context exceeds
    the one at the smallest by less than :data:`FLAT` of it (a fixed-size state). Without a
    context below ``fit_from``: the plain log-log slope over the rest."""
    pts = sorted((c, t) for c, t in points if c > 0 and t > 0)
    fit = [(c, t) for c, t in pts if c >= fit_from]
    if len(fit) < 2 or pts[0][0] >= fit_from:
        return common.loglog_slope(fit)
    c0, t0 = pts[0]
    if pts[-1][1] - t0 < FLAT * t0:
        return 0.0
    a, slope = t0, None
    for _ in range(100):
        growing = [(c, t - a) for c, t in fit if t > a]
        slope = common.loglog_slope(growing)
        if slope is None:
            return None
        log_b = sum(math.log(g) - slope * math.log(c) for c, g in growing) / len(growing)
        settled = max(0.0, t0 - math.exp(log_b) * c0 ** slope)
        if abs(settled - a) <= 1e-9 * t0:
            break
        a = settled
    return slope


def slopes(points: list[Point], fit_from: int) -> dict[str, dict[str, float | None]]:
    """Per architecture: the growth exponent of the time per token (:func:`growth_slope`) and
    the log-log slope of the state size on context."""
    out: dict[str, dict[str, float | None]] = {}
    for arch in dict.fromkeys(p.arch for p in points):
        ok = [p for p in points if p.arch == arch and p.status == "ok"]
        fit = [p for p in ok if p.context >= fit_from]
        out[arch] = {"time": growth_slope([(p.context, p.ms_per_token or 0) for p in ok], fit_from),
                     "state": common.loglog_slope([(p.context, p.state_mb or 0) for p in fit])}
    return out


def declared(registry: Any, arch: str) -> dict[str, str]:
    """The declared decode-time and state growth of an architecture (recurrent models: 1)."""
    kind, name = arch.split(":", 1)
    if kind == "model":
        return {"decode": "1", "state": "1"}
    c = registry.get(kind, name).complexity
    return {"decode": c.decode, "state": c.state} if c else {"decode": "?", "state": "?"}


HEADER = ("| architecture | context | ms / token | tokens/s | state MB | peak MB | prefill s |\n"
          + "|---" * 7 + "|")


def format_row(p: Point) -> str:
    if p.status != "ok":
        return f"| {p.arch} | {p.context} | {p.status} |" + " |" * 4
    return (f"| {p.arch} | {p.context} | {p.ms_per_token:.2f} | {p.tokens_per_s:,.0f} | {p.state_mb:.3f} "
            f"| {p.peak_mb:.1f} | {p.prefill_s:.2f} |")


def _slope(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


SLOPE_HEADER = ("| architecture | declared decode time / token | measured slope | declared state | measured slope |\n"
                + "|---" * 5 + "|")


def slope_rows(points: list[Point], fit_from: int, registry: Any) -> list[str]:
    rows = []
    for arch, s in slopes(points, fit_from).items():
        d = declared(registry, arch)
        rows.append(f"| {arch} | {d['decode']} | {_slope(s['time'])} | {d['state']} | {_slope(s['state'])} |")
    return rows


def method(settings: Settings) -> str:
    return f"""- Models: `transformer` with every block the named layer (d_model {settings.d_model},
  {settings.layers} layers, {settings.heads} heads, sinusoidal positions), or the named recurrent LM
  (width {settings.d_model}, {settings.layers} layers); vocabulary {VOCAB}; {settings.dtype}; batch
  {settings.batch}; {settings.threads} torch thread(s); each point in a fresh process.
- Per point: a random prompt of `context` tokens read through the cache in one call
  (`prefill s`), then {settings.new_tokens} greedy tokens one call each, twice: `peak MB` is
  the rise of memory during the first (CPU: {common.CPU_MEMORY_METHOD.split(";")[0].split("(")[0].strip()},
  glibc thresholds at 128 KiB), `ms / token` the median call of the second (steady-state
  allocator); `tokens/s` = batch / that. `state MB`: every tensor of the decoding cache
  at the end.
- Slopes: of `ms / token`, the exponent p of a fit a + b context^p (a: the constant cost of
  a call, which hides the growing part at small widths, from the smallest context less its
  own growing share; p: least squares of log(ms - a) on log(context) over the contexts >=
  {settings.fit_from}; 0 when the time grows by less than {FLAT:.0%} from the smallest to the
  largest context); of `state MB`, least squares of log(state) on log(context) over the
  contexts >= {settings.fit_from}. About 1 = O(context) per token, about 0 = O(1)."""


def markdown(settings: Settings, points: list[Point], registry: Any, head: str) -> str:
    rows = "\n".join(format_row(p) for p in points)
    return f"""{head}{method(settings)}

{SLOPE_HEADER}
{chr(10).join(slope_rows(points, settings.fit_from, registry))}

{HEADER}
{rows}
"""


if __name__ == "__main__":
    common.worker_main(measure)
