"""Model benchmark: a run config trained through ``harness.train`` next to a plain-PyTorch
reference of the same shapes (``harness/bench/reference_models.py``), in one process at one time.

Each repeat is one fresh process (see :mod:`harness.bench.common`) that trains the harness run
(``harness.train`` with the config, MLflow tracking on, in a store under a temporary
``HARNESS_HOME``) and, after each harness step, one step of the reference (a plain loop:
forward, cross-entropy, backward, gradient clipping, AdamW, LambdaLR, on random batches of the
same shape), timed on its own. Both see the same machine load, second by second, so their
ratio holds on a busy machine where separate runs would not; the median of the per-repeat
ratios is reported. (Alternating steps also makes each model start its step with the other's
data in the caches: both pay that.)

Before the measured run, after the imports and the store's creation, a 2-step warm-up run
pays the process's first-use costs (lazy imports, kernel initialisation). A callback records
when each step starts and ends:

* throughput: input tokens of the steps after the first ``warmup`` divided by the wall time
  from the start of the first of them to the end of the last (data loading, logging and
  everything else between steps included), less the interleaved reference steps; the
  reference's: its tokens over the time of its own steps;
* fixed cost per run: seconds from the ``train()`` call to the start of the first step
  (plan, build, MLflow run, Lightning set-up) plus seconds from the end of the last step to
  the return (final validation, evaluation, recording), minus the time spent in validation
  loops (reported separately: it scales with the task's validation set, not a fixed cost).

Model FLOPs utilisation: FLOPs per token = 6 N + 6 L Σ_attention-layers H (d_k + d_v),
i.e. 6 N + 12 · layers · d_model · L for a standard Transformer (PaLM, Chowdhery et al. 2022,
appendix B): N counts the parameters that enter matrix products (every trainable parameter
except embedding tables that are not also an output head: a lookup multiplies nothing), and
the attention term counts the full L x L score and value products of softmax-attention layers
(a causal kernel that skips the masked half does half of it). Mixers' scans and convolutions
are not counted (their cost beyond 6 N is small at these widths). Achieved FLOP/s =
FLOPs per token x tokens/s; MFU = achieved / the device's peak (:data:`harness.runtime.devices.PEAKS`; on CPU
the fp32 matrix-multiply rate measured in this run).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.bench import common

REFERENCE = Path(__file__).with_name("reference_models.py")  # shipped in the package
CPU_PEAK_SIZE = 2048  # torch.mm of two n x n fp32 matrices


@dataclass
class Settings:
    config: dict[str, Any]  # the run config (data), before the benchmark's overrides
    steps: int = 30
    warmup: int = 5  # steps left out of the throughput
    repeats: int = 3
    threads: int = 1
    device: str = "cpu"
    timeout_s: float = 3600.0
    reference: str = str(REFERENCE)
    peak_flops: float | None = None  # override the table / the measured CPU peak
    early: dict[str, Any] | None = None  # {"path": a JSON-lines file, "row": fields}: the warm-up run's row


@dataclass
class Side:
    """One trained system in one repeat."""

    tokens_per_s: float | None = None
    step_ms: float | None = None
    params: int | None = None
    flops_per_token: float | None = None
    status: str = "ok"
    extra: dict[str, Any] = field(default_factory=dict)  # the harness's fixed costs


# -- in the worker process -----------------------------------------------------------------
def matmul_params(model: Any) -> int:
    """Trainable parameters that enter matrix products: all but embedding tables that are not
    shared with another module (a tied output head multiplies by its table)."""
    import torch

    seen: dict[int, int] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            if param.requires_grad:
                seen[id(param)] = seen.get(id(param), 0) + 1
    lookups = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    return sum(p.numel() for p in model.parameters()
               if p.requires_grad and not (id(p) in lookups and seen[id(p)] == 1))


def attention_flops_per_token(model: Any, length: int) -> float:
    """6 L H (d_k + d_v) summed over the softmax-attention layers (quadratic in L)."""
    import torch

    from harness.nn.attention import Attention

    total = 0.0
    for m in model.modules():
        if isinstance(m, Attention) and m.complexity.exponent("time") == 2:
            total += 6 * length * m.num_heads * (m.qk_dim + m.v_dim)
        elif isinstance(m, torch.nn.MultiheadAttention):
            total += 6 * length * 2 * m.embed_dim
    return total


def flops_per_token(model: Any, length: int) -> float:
    return 6 * matmul_params(model) + attention_flops_per_token(model, length)


def count_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _graphs() -> int:
    """Graphs torch.compile (dynamo) has compiled in this process so far."""
    import sys

    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _clock_class() -> Any:
    import lightning as L

    class StepClock(L.Callback):  # type: ignore[misc]
        """When each training step starts and ends, its tokens, and the validation loops; after
        each step it runs one step of ``between`` (the reference), timed on its own.

        On a GPU the steps are timed by CUDA events, with one synchronisation when training
        ends (a per-step synchronisation would stall the host's queueing and bias the rate
        low); ``host`` keeps the host's clock for the fixed costs. The steps from ``quiet_from``
        on are timed with the proof's warmers paused (:func:`harness.bench.proof.quiet`)."""

        def __init__(self, fmt: Any, between: Any = None, quiet_from: int | None = None,
                     early: dict[str, Any] | None = None) -> None:
            self.fmt, self.between, self.quiet_from, self.early = fmt, between, quiet_from, early
            self.steps: list[tuple[float, float, int]] = []
            self.host: list[tuple[float, float]] = []
            self.between_steps: list[tuple[float, float]] = []
            self.validation: list[tuple[float, float]] = []
            self.model: Any = None
            self.length = 0
            self.graphs: list[int] = []
            self._t = self._v = 0.0
            self._events: list[Any] = []  # (start, end, tokens, between start, between end) on CUDA
            self._quiet: Any = None

        def on_train_start(self, trainer: Any, module: Any) -> None:
            self.model = module.model

        def _mark(self, module: Any) -> Any:
            if module.device.type != "cuda":
                return time.perf_counter()
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, idx: int) -> None:
            if self.quiet_from is not None and len(self.host) == self.quiet_from and self._quiet is None:

                self._quiet = common.quiet()
                self._quiet.__enter__()
            self._t = time.perf_counter()
            self._start = self._mark(module)
            self.length = self.length or max(batch[k].shape[1] for k in self.fmt.input_keys)

        def on_train_batch_end(self, trainer: Any, module: Any, out: Any, batch: Any, idx: int) -> None:
            end = self._mark(module)
            self.host.append((self._t, time.perf_counter()))
            tokens = self.fmt.tokens(batch)
            between: tuple[Any, Any] | None = None
            if self.between is not None:
                b0 = self._mark(module)
                self.between(len(self.host) - 1)
                between = (b0, self._mark(module))
            self.graphs.append(_graphs())  # the harness's and the reference's compilations so far
            if self.early is not None and len(self.host) == 1:
                self._first_row(time.perf_counter() - self.host[0][1])
            if module.device.type == "cuda":
                self._events.append((self._start, end, tokens, between))
            else:
                self.steps.append((self._start, end, tokens))
                if between is not None:
                    self.between_steps.append(between)

        def _first_row(self, reference_s: float) -> None:
            """The first step's row, appended to ``early["path"]`` as it ends (host seconds)."""
            assert self.early is not None
            a, b = self.host[0]
            text = (f"first step {b - a:.1f} s (compilation included)"
                    + (f", the reference's {reference_s:.1f} s" if self.between is not None else "")
                    + f"; {self.graphs[0]} graphs compiled so far")
            row = {**self.early["row"], "ms": 1000 * (b - a), "extra": {"run": text, "first_step_s": b - a,
                                                                          "reference_first_step_s": reference_s}}
            with open(self.early["path"], "a") as f:
                f.write(json.dumps(row) + "\n")

        def on_train_end(self, trainer: Any, module: Any) -> None:
            if self._events:  # one synchronisation: the events' times, relative to the first
                import torch

                torch.cuda.synchronize()
                origin = self._events[0][0]
                seconds = lambda e: origin.elapsed_time(e) / 1000  # noqa: E731
                self.steps = [(seconds(a), seconds(b), n) for a, b, n, _ in self._events]
                self.between_steps = [(seconds(b[0]), seconds(b[1])) for *_, b in self._events if b is not None]
            if self._quiet is not None:
                self._quiet.__exit__(None, None, None)
                self._quiet = None

        def on_validation_start(self, trainer: Any, module: Any) -> None:
            self._v = time.perf_counter()

        def on_validation_end(self, trainer: Any, module: Any) -> None:
            self.validation.append((self._v, time.perf_counter()))

    return StepClock


def throughput(steps: list[tuple[float, float, int]], warmup: int,
               paused: Sequence[tuple[float, float]] = ()) -> tuple[float, float]:
    """(tokens/s, median step ms) over the steps after ``warmup``: their tokens over the wall
    time from the start of the first to the end of the last (whatever ran between steps
    included), less the ``paused`` intervals in that window (the interleaved reference)."""
    timed = steps[warmup:] if len(steps) > warmup else steps[-1:]
    start, end = timed[0][0], timed[-1][1]
    seconds = end - start - sum(b - a for a, b in paused if a >= start and b <= end)
    return sum(t for _, _, t in timed) / seconds, 1000 * common.median([b - a for a, b, _ in timed])


def _harness_run(cfg: Any, steps: int, warmup: int, reference: Any = None, *,
                 early: dict[str, Any] | None = None, clocks: list[Any] | None = None) -> dict[str, Any]:
    """One ``harness.train`` call (as ``harness train`` makes it), timed by a callback that
    runs one ``reference`` step after each of its steps; with ``early`` ({"path", "row"}) the
    first step's row (its seconds: compilation included) is appended to that file at once (the
    callback is appended to ``clocks``: its ``steps`` and ``between_steps`` are each step's times)."""
    from harness.run.pipeline import train
    from harness.run.plan import load_registry, plan

    cfg = cfg.model_copy(deep=True)
    cfg.train.max_steps = cfg.train.val_every = steps
    clock = _clock_class()(plan(cfg, load_registry(cfg, None)).fmt, reference, quiet_from=warmup or None,
                           early=early)
    if clocks is not None:
        clocks.append(clock)
    graphs_before = _graphs()
    start = time.perf_counter()
    train(cfg, callbacks=[clock])
    end = time.perf_counter()
    first, last = clock.host[0][0], clock.host[-1][1]
    validation = sum(b - a for a, b in clock.validation if a >= last)
    after = end - last - (sum(b - a for a, b in clock.between_steps[-1:]) if clock.between_steps else 0.0)
    tokens_per_s, step_ms = throughput(clock.steps, warmup, clock.between_steps)
    result = {"tokens_per_s": tokens_per_s, "step_ms": step_ms, "before_s": first - start, "after_s": after,
              "validation_s": validation, "fixed_s": first - start + after - validation,
              "first_step_s": clock.host[0][1] - clock.host[0][0],
              "graphs_first_step": clock.graphs[0] - graphs_before,
              "graphs_after_first_step": clock.graphs[-1] - clock.graphs[0],
              "params": count_params(clock.model), "flops_per_token": flops_per_token(clock.model, clock.length)}
    if clock.between_steps:
        timed = clock.between_steps[warmup:]
        result["reference_s"] = sum(b - a for a, b in timed)
        result["reference_step_ms"] = 1000 * common.median([b - a for a, b in timed])
    return result


def measure_harness(job: dict[str, Any]) -> dict[str, Any]:
    """The harness run, with the reference's steps interleaved when ``job["shapes"]`` is set."""
    start = time.perf_counter()
    import lightning  # noqa: F401
    import mlflow  # noqa: F401
    import torch

    from harness.config import parse_run_config
    from harness.run import pipeline  # noqa: F401
    from harness.store import tracking

    cfg = parse_run_config(job["config"])
    imports = time.perf_counter() - start
    start = time.perf_counter()
    tracking.Tracker(cfg.tracking.uri).experiment_id(cfg.tracking.experiment)
    store = time.perf_counter() - start
    step, reference = None, {}
    if job["shapes"]:
        shapes = job["shapes"]
        torch.set_num_threads(job["threads"])
        torch.manual_seed(0)
        module = load_reference(job["reference"])
        model = module.build(shapes).to(shapes["device"])
        step = module.trainer(model, shapes)
        tokens = shapes["batch"] * shapes["length"]
        reference = {"params": count_params(model), "flops_per_token": flops_per_token(model, shapes["length"])}
    # a 2-step run first pays the process's first-use costs (the fixed cost's "first run");
    # job["warmup_run"] False (the GPU proof: its compilations are minutes) leaves it out, and
    # the measured run's first steps, left out of the throughput, pay them instead
    early = job.get("early")
    first = _harness_run(cfg, 2, 0, step, early=early) if job.get("warmup_run", True) else None
    result = _harness_run(cfg, job["steps"], job["warmup"], step, early=None if first else early)
    if step is not None:
        timed = job["steps"] - job["warmup"]
        reference.update(tokens_per_s=tokens * timed / result.pop("reference_s"),
                         step_ms=result.pop("reference_step_ms"))
    return {**result, "imports_s": imports, "store_s": store, "first_fixed_s": first and first["fixed_s"],
            "reference": reference}


def load_reference(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("reference_models", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure_peak(job: dict[str, Any]) -> dict[str, Any]:
    """The fp32 ``torch.mm`` rate of this CPU at the benchmark's thread count (best pass)."""
    import torch

    torch.set_num_threads(job["threads"])
    n = job.get("size", CPU_PEAK_SIZE)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = common.timed(lambda: a @ b, job.get("min_time_s", 2.0), max_passes=20)
    return {"flops": 2 * n**3 / min(times), "size": n}


def measure(job: dict[str, Any]) -> dict[str, Any]:
    return measure_peak(job) if job["side"] == "peak" else measure_harness(job)


# -- in the parent process -----------------------------------------------------------------
def run_config(settings: Settings) -> dict[str, Any]:
    """The config the harness side trains: the user's, with the benchmark's train settings."""
    data = copy.deepcopy(settings.config)
    train = data.setdefault("train", {})
    train.update({"max_steps": settings.steps, "val_every": settings.steps, "progress": False,
                  "num_threads": settings.threads,
                  "accelerator": "gpu" if settings.device == "cuda" else "cpu"})
    data.setdefault("tracking", {})["experiment"] = "bench"
    return data


def reference_shapes(settings: Settings) -> dict[str, Any] | str:
    """The reference's shapes for the config, or why there is no reference for it."""
    from harness.config import parse_run_config
    from harness.registry.loader import load
    from harness.run.build import build_task, task_info
    from harness.run.plan import plan
    from harness.runtime import devices

    cfg = parse_run_config(run_config(settings))
    p = plan(cfg, load(cfg.plugins))
    model, params = p.model.name, p.model.as_dict()["params"]
    if str(p.fmt) != "lm":
        return f"no reference for the {p.fmt} format (language modelling only)"
    t = cfg.train
    shapes: dict[str, Any] = {
        "model": model, "batch": t.batch_size, "steps": settings.steps, "lr": t.lr,
        "weight_decay": t.weight_decay, "betas": list(t.betas), "grad_clip": t.grad_clip,
        "warmup": t.warmup_steps, "min_lr_ratio": t.min_lr_ratio, "device": settings.device,
        "tie": params.get("tie_embeddings", False),
        # the same precision and compilation as the harness run (bf16 autocast; torch.compile)
        "bf16": devices.precision(t.precision, devices.run_device(t.accelerator)).startswith("bf16"),
        "compile": t.compile,
    }
    if t.optimizer != "adamw" or t.schedule != "cosine" or t.label_smoothing or t.scheduled_sampling:
        return "the reference trains with AdamW, a cosine schedule, no label smoothing or scheduled sampling"
    if model in ("lstm", "gru"):
        if params["dropout"]:
            return "the reference has no dropout"
        shapes.update(d_model=params["width"], layers=params["layers"])
    elif model == "transformer":
        why = _transformer_mismatch(p, params)
        if why:
            return why
        position = p.position.name if p.position else "none"
        shapes.update(d_model=params["d_model"], layers=params["layers"], heads=params["heads"],
                      ffn=params["ffn_mult"] * params["d_model"], norm_first=params["norm"] == "pre",
                      position=position,
                      base=p.position.as_dict()["params"].get("base", 1e4) if p.position else 1e4)
    else:
        return f"no plain-PyTorch reference for model '{model}' (transformer, lstm, gru)"
    info = task_info(p, build_task(p, seed=t.data_seed))
    shapes.update(vocab=info.vocab_size, length=info.max_length)
    return shapes


def _transformer_mismatch(p: Any, params: dict[str, Any]) -> str | None:
    attention = p.attention.as_dict() if p.attention else None
    wanted = {"norm_layer": "layernorm", "mlp": "gelu", "bias": True, "dropout": 0.0, "pattern": []}
    if p.mixer or attention is None or attention["name"] != "multi_head":
        return "the reference is nn.TransformerEncoderLayer: multi_head attention, no mixer"
    if any(attention["params"].get(k) for k in ("dropout", "tied_qk", "kv_heads")) or not attention["params"]["bias"]:
        return "the reference attention is nn.MultiheadAttention with biases, no dropout, tied_qk or kv_heads"
    if any(params.get(k) != v and not (k == "pattern" and not params.get(k)) for k, v in wanted.items()):
        return f"the reference block is LayerNorm + GELU MLP with biases and no dropout ({wanted})"
    if p.position and p.position.name != "sinusoidal":
        return f"the reference has sinusoidal positions or none, not '{p.position.name}'"
    return None


def peak_flops(settings: Settings) -> tuple[float | None, str]:
    """The device's peak FLOP/s and where it comes from."""
    if settings.peak_flops:
        return settings.peak_flops, "given with --peak-tflops"
    if settings.device == "cuda":
        import torch

        from harness.runtime.devices import peak_for

        name = torch.cuda.get_device_name()
        row = peak_for(name)
        if row is not None:
            return row.bf16_tflops * 1e12, f"{name}: dense bf16 peak of the {row.name} ({row.source})"
        return None, f"{name}: not in the table of peaks (harness.runtime.devices.PEAKS; pass --peak-tflops)"
    result, status = common.run_worker("harness.bench.model", {"side": "peak", "threads": settings.threads},
                                       threads=settings.threads, timeout_s=600)
    if result is None:
        return None, f"CPU peak not measured ({status})"
    return result["flops"], (f"this CPU's fp32 torch.mm rate, measured in this run ({result['size']}^2 "
                             f"matrices, {settings.threads} thread(s), best pass)")


def run_pair(settings: Settings, home: str, shapes: dict[str, Any] | None) -> tuple[Side, Side]:
    """One repeat: the harness run with the reference's steps interleaved, in a fresh process."""
    job = {"side": "harness", "steps": settings.steps, "warmup": settings.warmup, "threads": settings.threads,
           "config": run_config(settings), "shapes": shapes, "reference": settings.reference,
           "early": settings.early, "warmup_run": settings.device != "cuda"}
    result, status = common.run_worker("harness.bench.model", job, threads=settings.threads,
                                       timeout_s=settings.timeout_s, env={"HARNESS_HOME": home})
    if result is None:
        return Side(status=status), Side(status=status)
    reference = result.pop("reference")
    main = {k: result.pop(k) for k in ("tokens_per_s", "step_ms", "params", "flops_per_token")}
    return Side(**main, extra=result), (Side(**reference) if reference else Side(status="-"))


def benchmark(settings: Settings, home: str, progress: Any = print) -> tuple[list[Side], list[Side], Any]:
    """``repeats`` runs (each with the reference interleaved); also the reference's shapes."""
    shapes = reference_shapes(settings)
    harness_runs, reference_runs = [], []
    for i in range(settings.repeats):
        h, r = run_pair(settings, home, shapes if isinstance(shapes, dict) else None)
        harness_runs.append(h)
        if isinstance(shapes, dict):
            reference_runs.append(r)
        progress(f"repeat {i + 1}: harness {_fmt_rate(h)}, reference {_fmt_rate(r)}; "
                 f"ratio {_fmt(ratio_of(h, r), '.3f')}")
    return harness_runs, reference_runs, shapes


def ratio_of(h: Side, r: Side) -> float | None:
    return h.tokens_per_s / r.tokens_per_s if h.tokens_per_s and r.tokens_per_s else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _fmt_rate(side: Side) -> str:
    return f"{side.tokens_per_s:,.0f} tokens/s" if side.tokens_per_s else side.status


@dataclass
class Summary:
    harness_tokens_per_s: float | None
    reference_tokens_per_s: float | None
    ratio: float | None  # median of the per-repeat ratios
    fixed_s: float | None  # median over repeats
    mfu_harness: float | None
    mfu_reference: float | None


def summarise(harness_runs: list[Side], reference_runs: list[Side], peak: float | None) -> Summary:
    def med(values: list[float | None]) -> float | None:
        vals = [v for v in values if v is not None]
        return common.median(vals) if vals else None

    h = med([s.tokens_per_s for s in harness_runs])
    r = med([s.tokens_per_s for s in reference_runs])
    ratio = med([ratio_of(a, b) for a, b in zip(harness_runs, reference_runs, strict=False)])
    fixed = med([s.extra.get("fixed_s") for s in harness_runs])

    def mfu(runs: list[Side], rate: float | None) -> float | None:
        flops = next((s.flops_per_token for s in runs if s.flops_per_token), None)
        return flops * rate / peak if flops and rate and peak else None

    return Summary(h, r, ratio, fixed, mfu(harness_runs, h), mfu(reference_runs, r))


def failures(summary: Summary, min_ratio: float | None, max_fixed_s: float | None) -> list[str]:
    """The gate: what falls short of the thresholds (empty: passed)."""
    out = []
    if min_ratio is not None and (summary.ratio is None or summary.ratio < min_ratio):
        out.append(f"harness / reference tokens/s = {_fmt(summary.ratio, '.3f')} < {min_ratio}")
    if max_fixed_s is not None and (summary.fixed_s is None or summary.fixed_s > max_fixed_s):
        out.append(f"fixed cost per run = {_fmt(summary.fixed_s, '.2f')} s > {max_fixed_s} s")
    return out


def markdown(settings: Settings, harness_runs: list[Side], reference_runs: list[Side], shapes: Any,
             peak: tuple[float | None, str], head: str) -> str:
    s = summarise(harness_runs, reference_runs, peak[0])
    first_h = next((x for x in harness_runs if x.tokens_per_s), Side())
    first_r = next((x for x in reference_runs if x.tokens_per_s), Side())
    reference_line = (f"`harness/bench/reference_models.py` with shapes `{shapes}`" if isinstance(shapes, dict)
                      else f"none: {shapes}")
    rows = [
        f"| harness (`harness.train`) | {_fmt(first_h.params, ',')} | {_fmt(first_h.flops_per_token, ',.0f')} "
        f"| {_fmt(s.harness_tokens_per_s, ',.0f')} | {_fmt(s.ratio, '.3f')} | {_pct(s.mfu_harness)} |",
    ]
    if reference_runs:
        rows.append(f"| plain PyTorch reference | {_fmt(first_r.params, ',')} | {_fmt(first_r.flops_per_token, ',.0f')} "
                    f"| {_fmt(s.reference_tokens_per_s, ',.0f')} | 1 | {_pct(s.mfu_reference)} |")
    repeats = []
    for i, h in enumerate(harness_runs):
        r = reference_runs[i] if i < len(reference_runs) else Side(status="-")
        e = h.extra
        repeats.append(
            f"| {i + 1} | {_fmt_rate(h)} | {_fmt(h.step_ms, '.1f')} | {_fmt_rate(r)} | {_fmt(r.step_ms, '.1f')} "
            f"| {_fmt(ratio_of(h, r), '.3f')} | {_fmt(e.get('before_s'), '.2f')} | {_fmt(e.get('after_s'), '.2f')} "
            f"| {_fmt(e.get('validation_s'), '.2f')} | {_fmt(e.get('fixed_s'), '.2f')} "
            f"| {_fmt(e.get('first_fixed_s'), '.2f')} | {_fmt(e.get('store_s'), '.2f')} | {_fmt(e.get('imports_s'), '.2f')} |"
        )
    config = run_config(settings)
    return f"""{head}- Config (as trained, with the benchmark's overrides): `{config}`
- Steps: {settings.steps} per run, the first {settings.warmup} left out of the throughput; {settings.repeats}
  repeat(s), each a fresh process in which one reference step follows each harness step (same
  machine load for both); {settings.threads} torch thread(s).
- Reference: {reference_line}
- Peak: {_fmt(peak[0] and peak[0] / 1e9, ',.1f')} GFLOP/s ({peak[1]}).
- FLOPs per token = 6 N + 12 · layers · d_model · L (N: parameters in matrix products, the
  input embedding excluded unless tied to the head; the attention term counts the full
  L x L products of softmax layers); MFU = FLOPs per token x tokens/s / peak.
- Fixed cost per run = seconds from the `harness.train` call to the first step + from the
  end of the last step to the return, minus validation loops; medians over repeats.
  `first run` is the same for the first (2-step) run in a fresh process (beyond imports).

| system | params | FLOPs/token | tokens/s (median) | × reference | MFU |
|---|---|---|---|---|---|
{chr(10).join(rows)}

Fixed cost per run (harness, median over repeats): **{_fmt(s.fixed_s, '.2f')} s**;
harness / reference tokens/s (median of the per-repeat ratios): **{_fmt(s.ratio, '.3f')}**.

| repeat | harness | step ms | reference | step ms | ratio | before first step s | after last step s | of which validation s | fixed s | first run fixed s | store open s | imports s |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(repeats)}
"""


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    common.worker_main(measure)
