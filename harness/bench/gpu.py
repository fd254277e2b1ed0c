"""``harness bench gpu``: the GPU session's questions, at the shapes people use, in one record.

1. **transformer**: a GPT-2-small-shaped Transformer (d_model 768, 12 layers, 12 heads,
   L 1024, bf16-mixed, ``torch.compile``) trained through ``harness.train`` next to a
   plain-PyTorch reference of the same shapes, also bf16 and compiled, in the same processes
   (:mod:`harness.bench.model`), with tokens/s and MFU (:data:`harness.runtime.devices.PEAKS`).
   The vocabulary is ``char_lm``'s (characters), so the embedding and head are small: the
   body's FLOPs are GPT-2 small's, the 38M-parameter embedding is not.
2. **mixers**: forward + backward of one layer (d_model 768, 12 heads, batch 1, L 2048 and
   8192, bf16 autocast with float32 parameters, as a bf16-mixed run) for every mixer, each
   with the reference implementation, the fast path (FLA's kernels,
   :mod:`harness.nn.fast_path`) where it has one, and FLA's own layer (``fla.layers``, the
   ``flash-linear-attention`` package) of the same shapes where one exists: tokens/s and
   peak allocated memory side by side.
3. **attention**: the harness's ``multi_head`` layer and a bare ``F.scaled_dot_product_attention``
   (flash on a GPU that has it), causal, bf16, L 1024 to 32768.
4. **decode**: time per generated token after a prompt (:mod:`harness.bench.decode`), each
   in a fresh process, for attention and the mixers with a fast path.
5. **small**: a tiny Transformer (:data:`SMALL`), whose step is launches and host code,
   trained by the harness eager and with ``train.cuda_graphs`` (the step captured), beside
   the plain-PyTorch reference.

Every row of the JSON record beside the Markdown one carries the GPU's name, CUDA and
driver versions. Without CUDA the command refuses (exit 2) unless ``--dry-run``, which runs
every section at tiny shapes on the CPU so the code paths are exercised (FLA columns read
"n/a: no CUDA").
"""

from __future__ import annotations

import copy
import gc
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.bench import attention, common, decode
from harness.errors import HarnessError

NO_CUDA = "n/a: no CUDA"

#: GPT-2 small's body on the built-in character corpus (see the module documentation)
GPT2_SMALL: dict[str, Any] = {
    "task": {"name": "char_lm", "params": {"length": 1024, "num_train": 512, "num_val": 2}},
    "model": {"name": "transformer", "params": {"d_model": 768, "layers": 12, "heads": 12},
              "attention": {"name": "multi_head"}, "position": {"name": "sinusoidal"}},
    "train": {"batch_size": 16, "lr": 6e-4, "warmup_steps": 10, "precision": "bf16-mixed",
              "compile": True, "log_attention": False, "save_model": False},
}

#: issue 51's tiny shape (width 32, 2 layers, 2 heads, length 32, batch 8): a step of launches
#: and host code, which ``train.cuda_graphs`` is for; the ``small`` section trains it eager and
#: captured (on CUDA)
SMALL: dict[str, Any] = {
    "task": {"name": "char_lm", "params": {"length": 32, "num_train": 2000, "num_val": 2}},
    "model": {"name": "transformer", "params": {"d_model": 32, "layers": 2, "heads": 2},
              "attention": {"name": "multi_head"}, "position": {"name": "sinusoidal"}},
    "train": {"batch_size": 8, "lr": 1e-3, "warmup_steps": 10, "precision": "bf16-mixed",
              "log_attention": False, "save_model": False},
}
SMALL_STEPS, SMALL_WARMUP = 300, 50

#: FLA's own layer for a mixer, built with the shapes of the harness's defaults at (d, h):
#: (class in fla.layers, keyword arguments)
FLA_LAYERS: dict[str, Callable[[int, int], tuple[str, dict[str, Any]]]] = {
    "gla": lambda d, h: ("GatedLinearAttention", {"hidden_size": d, "num_heads": h, "expand_k": 0.5,
                                                  "expand_v": 1.0}),
    "retnet": lambda d, h: ("MultiScaleRetention", {"hidden_size": d, "num_heads": h, "expand_k": 1.0,
                                                    "expand_v": 2.0}),
    "deltanet": lambda d, h: ("DeltaNet", {"hidden_size": d, "num_heads": h, "expand_k": 1.0,
                                           "expand_v": 1.0}),
    "gated_deltanet": lambda d, h: ("GatedDeltaNet", {"hidden_size": d, "num_heads": h,
                                                      "head_dim": round(0.75 * d / h), "expand_v": 2}),
    "rwkv6": lambda d, h: ("RWKV6Attention", {"hidden_size": d, "num_heads": h, "expand_k": 1.0,
                                              "expand_v": 1.0}),
    "mamba2": lambda d, h: ("Mamba2", {"hidden_size": d, "num_heads": 2 * d // 32, "head_dim": 32,
                                       "state_size": 64, "expand": 2, "chunk_size": 64}),
}


@dataclass
class Settings:
    device: str = "cuda"
    d_model: int = 768
    heads: int = 12
    batch: int = 1
    mixer_lengths: tuple[int, ...] = (2048, 8192)
    attention_lengths: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768)
    contexts: tuple[int, ...] = (1024, 8192)
    new_tokens: int = 32
    decode_layers: int = 2
    min_time_s: float = 1.0
    transformer: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(GPT2_SMALL))
    steps: int = 30
    warmup: int = 10
    repeats: int = 1
    sections: tuple[str, ...] = ("ceiling", "transformer", "mixers", "attention", "decode", "small")
    ceiling_size: int = 8192
    mixers: tuple[str, ...] = ()  # empty: every registered mixer
    timeout_s: float = 1800.0
    early_path: str | None = None  # the proof's JSON lines: the Transformer's warm-up row goes there at once

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


SECTIONS = ("ceiling", "transformer", "mixers", "attention", "decode", "small")


def dry_run_settings(sections: tuple[str, ...] = SECTIONS, mixers: tuple[str, ...] = ()) -> Settings:
    """Tiny shapes on the CPU: every code path, no figure worth reading."""
    tiny = copy.deepcopy(GPT2_SMALL)
    tiny["task"]["params"].update(length=32, num_train=32)
    tiny["model"]["params"].update(d_model=32, layers=1, heads=2)
    tiny["train"].update(batch_size=4, precision="32-true", compile=False, warmup_steps=1)
    return Settings(device="cpu", d_model=32, heads=2, mixer_lengths=(64,), ceiling_size=256, attention_lengths=(64, 128),
                    contexts=(16,), new_tokens=2, decode_layers=1, min_time_s=0.0, transformer=tiny,
                    steps=3, warmup=1, sections=sections, mixers=mixers or ("gla", "mamba"),
                    timeout_s=600.0)


@dataclass
class Row:
    """One measurement: a layer (or model) in one implementation at one length."""

    section: str
    name: str
    implementation: str
    length: int
    status: str = "ok"
    tokens_per_s: float | None = None
    ms: float | None = None
    peak_mb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# -- the device -----------------------------------------------------------------------------
def device_tags(device: str) -> dict[str, str]:
    """GPU name, CUDA (torch's build) and driver version: every record row carries them."""
    import torch

    if device != "cuda":
        return {"gpu": "none (CPU dry run)", "cuda": str(torch.version.cuda), "driver": "-"}
    return {"gpu": torch.cuda.get_device_name(0), "cuda": str(torch.version.cuda), "driver": driver_version()}


def driver_version() -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "unknown (no nvidia-smi)"
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({type(exc).__name__})"
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "unknown"


def require_cuda(dry_run: bool) -> str:
    """The device: cuda, or cpu for a dry run; refuse a real run without CUDA (exit 2)."""
    import torch

    if dry_run:
        return "cpu"
    if not torch.cuda.is_available():
        raise HarnessError("harness bench gpu needs a CUDA device, and torch sees none here (torch "
                           f"{torch.__version__}). Run it on a GPU machine (`nox -s gpu`), or add "
                           "--dry-run to exercise its code paths at tiny shapes on the CPU.")
    return "cuda"


# -- one layer, forward + backward, in this process -------------------------------------------
def time_layer(settings: Settings, run: Callable[[Any], Any], module: Any, length: int) -> Row:
    """tokens/s and peak allocated MB of ``run`` (forward + backward) at ``length``."""
    import torch


    device = torch.device(settings.device)
    sync = common.synchronizer(device)
    module.to(device)

    def one_pass() -> None:
        x = torch.randn(settings.batch, length, settings.d_model, device=device, requires_grad=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=settings.cuda):
            y = run(x)
        y.float().square().mean().backward()
        module.zero_grad(set_to_none=True)

    row = Row("", "", "", length)
    try:
        one_pass()  # compile / autotune / initialise outside the measurement
        sync()
        with common.quiet():  # the proof's warmers leave the GPU to the measurement
            _, row.peak_mb = common.peak_mb(one_pass, device)
            sync()
            times = common.timed(one_pass, settings.min_time_s, sync, max_passes=20)
    except torch.cuda.OutOfMemoryError:
        row.status = "out of memory"
    except Exception as exc:  # a failing layer is a row, not the end of the session
        row.status = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    else:
        row.ms = 1000 * common.median(times)
        row.tokens_per_s = settings.batch * length / (row.ms / 1000)
    finally:
        module.to("cpu")
        gc.collect()
        if settings.cuda:
            torch.cuda.empty_cache()
    return row


def harness_layer(settings: Settings, variant: str, kernel: str | None, length: int) -> Row:
    """A registered layer (``mixer:gla``, ``attention:multi_head``), its mixer set to ``kernel``."""
    from harness.nn import fast_path

    job = {"variant": variant, "d_model": settings.d_model, "heads": settings.heads, "causal": True,
           "plugins": [], "length": length, "either_direction": True}
    layer, run = attention._layer(job)
    if kernel is not None:
        fast_path.select(layer, kernel)
    return _named(time_layer(settings, run, layer, length), variant, kernel or "pytorch")


def fla_layer(settings: Settings, mixer: str, length: int) -> Row:
    """FLA's own layer of the same shapes, or why there is none."""
    if mixer not in FLA_LAYERS:
        return Row("mixers", f"mixer:{mixer}", "fla layer", length, "n/a: no FLA layer")
    if not settings.cuda:
        return Row("mixers", f"mixer:{mixer}", "fla layer", length, NO_CUDA)
    import importlib
    import importlib.util

    cls, kwargs = FLA_LAYERS[mixer](settings.d_model, settings.heads)
    try:
        layer = getattr(importlib.import_module("fla.layers"), cls)(**kwargs)
    except Exception as exc:  # not installed (flash-linear-attention), or the signature moved
        return Row("mixers", f"mixer:{mixer}", "fla layer", length,
                   f"n/a: fla.layers.{cls} ({type(exc).__name__}: {str(exc)[:80]})")
    row = time_layer(settings, lambda x: layer(x)[0], layer, length)
    # FLA's Mamba2 layer runs mamba-ssm's kernels when that package is installed, else PyTorch
    how = " without mamba-ssm: PyTorch" if mixer == "mamba2" and importlib.util.find_spec("mamba_ssm") is None else ""
    return _named(row, f"mixer:{mixer}", f"fla layer ({cls}{how})")


def _named(row: Row, name: str, implementation: str) -> Row:
    row.name, row.implementation = name, implementation
    return row


def mixer_rows(settings: Settings, registry: Any, progress: Callable[[Row], None]) -> list[Row]:
    """Every mixer at the first length before any at the next; each of a mixer's measurements
    (reference, fast path, FLA's layer) passed to ``progress`` the moment it is taken."""
    from harness.nn import fast_path

    rows = []

    def seen(row: Row) -> None:
        row.section = "mixers"
        progress(row)
        rows.append(row)

    names = settings.mixers or tuple(registry.names("mixer"))
    for length in settings.mixer_lengths:
        for name in names:
            has_fast = bool(getattr(registry.get("mixer", name).build, "fast_path_ops", ()))
            reference = harness_layer(settings, f"mixer:{name}", "reference", length)
            if not has_fast:
                reference.implementation = "reference implementation (no kernel here)"
            seen(reference)
            if has_fast and not settings.cuda:
                seen(Row("mixers", f"mixer:{name}", "fla", length, NO_CUDA))
            elif has_fast and not fast_path.fla_importable():
                seen(Row("mixers", f"mixer:{name}", "fla", length, "n/a: fla-core/triton not installed"))
            elif has_fast:
                seen(harness_layer(settings, f"mixer:{name}", "fla", length))
            seen(fla_layer(settings, name, length))
    return rows


def ceiling_rows(settings: Settings, progress: Callable[[Row], None]) -> list[Row]:
    """The device's measured matrix-product rate: ``n^3`` bf16 (fp32 on a dry run) products,
    the best of the timed ones after warm-ups (the ceiling MFU is read against)."""
    import torch


    n = settings.ceiling_size
    dtype = torch.bfloat16 if settings.cuda else torch.float32
    a = torch.randn(n, n, device=settings.device, dtype=dtype)
    b = torch.randn(n, n, device=settings.device, dtype=dtype)
    sync = common.synchronizer(torch.device(settings.device))
    for _ in range(3):
        a @ b
    sync()
    with common.quiet():
        times = common.timed(lambda: a @ b, max(settings.min_time_s, 0.2), sync, max_passes=50)
    best = min(times)
    row = Row("ceiling", f"matmul {n}^3", f"torch.mm {str(dtype).removeprefix('torch.')}", n, "ok",
              None, 1000 * best, None, {"flops_per_s": 2 * n**3 / best, "tflops": 2 * n**3 / best / 1e12,
                                        "passes": len(times)})
    progress(row)
    return [row]


def attention_rows(settings: Settings, progress: Callable[[Row], None]) -> list[Row]:
    rows = []
    for variant in ("torch.sdpa", "attention:multi_head"):
        for length in settings.attention_lengths:
            row = harness_layer(settings, variant, None, length)
            row.section, row.implementation = "attention", "PyTorch SDPA" if variant == "torch.sdpa" else "harness"
            progress(row)
            rows.append(row)
            if row.status != "ok":
                break  # longer ones will not fit either
    return rows


def decode_rows(settings: Settings, registry: Any, progress: Callable[[Row], None]) -> list[Row]:
    names = ["attention:multi_head"] + [f"mixer:{n}" for n in settings.mixers or registry.names("mixer")
                                        if getattr(registry.get("mixer", n).build, "fast_path_ops", ())]
    decode_settings = decode.Settings(contexts=settings.contexts, new_tokens=settings.new_tokens,
                                      d_model=settings.d_model, layers=settings.decode_layers,
                                      heads=settings.heads, device=settings.device,
                                      max_memory_gb=common.default_budget_gb(settings.device),
                                      timeout_s=settings.timeout_s)
    rows = []
    for p in decode.benchmark(decode_settings, names, progress=lambda _line: None):
        row = Row("decode", p.arch, "auto", p.context, p.status, p.tokens_per_s, p.ms_per_token, p.peak_mb,
                  {"prefill_s": p.prefill_s, "state_mb": p.state_mb})
        progress(row)
        rows.append(row)
    return rows


def transformer_rows(settings: Settings, home: str, progress: Callable[[Row], None]) -> list[Row]:
    from harness.bench import model

    name = "transformer d768 x 12 (GPT-2 small body)" if settings.cuda else "transformer (tiny)"
    length = settings.transformer["task"]["params"]["length"]
    early = None
    if settings.early_path:  # the warm-up run's row, written by the worker before its measured run
        early = {"path": settings.early_path, "row": {**asdict(Row("transformer", name, "harness", length)),
                                                        "implementation": "harness (first step)",
                                                        **device_tags(settings.device)}}
    ms = model.Settings(config=copy.deepcopy(settings.transformer), steps=settings.steps,
                        warmup=settings.warmup, repeats=settings.repeats, device=settings.device,
                        timeout_s=settings.timeout_s, early=early)
    peak, source = model.peak_flops(ms)
    harness_runs, reference_runs, shapes = model.benchmark(ms, home, progress=lambda _line: None)
    summary = model.summarise(harness_runs, reference_runs, peak)
    rows = []
    for system, runs, rate, mfu in (("harness", harness_runs, summary.harness_tokens_per_s, summary.mfu_harness),
                                  ("plain PyTorch", reference_runs, summary.reference_tokens_per_s,
                                   summary.mfu_reference)):
        status = "ok" if rate else (runs[0].status if runs else "not run")
        if isinstance(shapes, str) and system != "harness":
            status = f"n/a: {shapes}"
        extra = runs[0].extra if runs else {}
        row = Row("transformer", name, system, length, status, rate, runs[0].step_ms if runs else None, None,
                  {"mfu": mfu, "peak_source": source, "flops_per_token": runs[0].flops_per_token if runs else None,
                   **{k: extra[k] for k in ("graphs_after_first_step", "fixed_s", "first_fixed_s") if k in extra}})
        progress(row)
        rows.append(row)
    return rows


def small_rows(settings: Settings, home: str, progress: Callable[[Row], None]) -> list[Row]:
    """:data:`SMALL` trained by the harness eager and with ``train.cuda_graphs`` (the step
    captured: CUDA only, else the row says so), each beside the plain-PyTorch reference."""
    from harness.bench import model

    small = copy.deepcopy(SMALL)
    if not settings.cuda:
        small["train"].update(precision="32-true")
    length = small["task"]["params"]["length"]
    name = "transformer d32 x 2 (tiny: launches and host code)"
    rows = []
    for graphs in (False, True):
        label = "harness, train.cuda_graphs" if graphs else "harness"
        if graphs and not settings.cuda:
            rows.append(Row("small", name, label, length, NO_CUDA))
            progress(rows[-1])
            continue
        small["train"]["cuda_graphs"] = graphs
        ms = model.Settings(config=copy.deepcopy(small), steps=min(settings.steps * 10, SMALL_STEPS),
                            warmup=min(settings.warmup * 5, SMALL_WARMUP), repeats=1, device=settings.device,
                            timeout_s=settings.timeout_s)
        harness_runs, reference_runs, _ = model.benchmark(ms, home, progress=lambda _line: None)
        pairs = [(label, harness_runs)] + ([] if graphs else [("plain PyTorch", reference_runs)])
        for system, runs in pairs:
            side = runs[0] if runs else model.Side(status="not run")
            extra: dict[str, Any] = {k: side.extra[k] for k in ("graphs_after_first_step", "fixed_s")
                                     if k in side.extra}
            if runs and reference_runs and system != "plain PyTorch":  # against its own run's reference
                extra["of the reference"] = model.ratio_of(runs[0], reference_runs[0])
            rows.append(Row("small", name, system, length, side.status, side.tokens_per_s, side.step_ms,
                             None, extra))
            progress(rows[-1])
    return rows


def benchmark(settings: Settings, home: str, progress: Callable[[Row], None]) -> list[Row]:
    from harness.registry.loader import load

    registry = load([])
    rows: list[Row] = []
    if "ceiling" in settings.sections:
        rows += ceiling_rows(settings, progress)
    if "transformer" in settings.sections:
        rows += transformer_rows(settings, home, progress)
    if "mixers" in settings.sections:
        rows += mixer_rows(settings, registry, progress)
    if "attention" in settings.sections:
        rows += attention_rows(settings, progress)
    if "decode" in settings.sections:
        rows += decode_rows(settings, registry, progress)
    if "small" in settings.sections:
        rows += small_rows(settings, home, progress)
    return rows


# -- the record -------------------------------------------------------------------------------
HEADER = ("| section | layer / model | implementation | L | tokens/s | ms | peak MB | notes |\n"
          + "|---" * 8 + "|")


def format_row(r: Row) -> str:
    if r.status != "ok":
        return f"| {r.section} | {r.name} | {r.implementation} | {r.length} | {r.status} | | | |"
    e, notes = r.extra, []
    if e.get("tflops") is not None:
        notes.append(f"{e['tflops']:,.0f} TFLOP/s")
    if e.get("mfu") is not None:
        notes.append(f"MFU {e['mfu']:.1%}")
    if e.get("run"):
        notes.append(str(e["run"]))
    if e.get("graphs_after_first_step") is not None:
        notes.append(f"{e['graphs_after_first_step']} graphs compiled after the first step")
    if e.get("prefill_s") is not None:
        notes.append(f"prefill {e['prefill_s']:.2f} s")
    rate = "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}"
    peak = "-" if r.peak_mb is None else f"{r.peak_mb:,.0f}"
    ms = "-" if r.ms is None else f"{r.ms:.2f}"
    return (f"| {r.section} | {r.name} | {r.implementation} | {r.length} | {rate} | {ms} "
            f"| {peak} | {'; '.join(notes)} |")


def records(rows: list[Row], tags: dict[str, str]) -> list[dict[str, Any]]:
    """The rows as JSON records, each tagged with the device."""
    return [{**asdict(r), **tags} for r in rows]


def markdown(settings: Settings, rows: list[Row], tags: dict[str, str], head: str) -> str:
    return f"""{head}- Device: GPU {tags['gpu']}; CUDA {tags['cuda']}; driver {tags['driver']}
- Shapes: mixers and attention d_model {settings.d_model}, {settings.heads} heads, batch {settings.batch};
  mixers at L {', '.join(map(str, settings.mixer_lengths))}, attention up to L {max(settings.attention_lengths)};
  {'bf16 autocast, float32 parameters' if settings.cuda else 'float32 (dry run on the CPU)'}.
- transformer: `harness.train` against the plain-PyTorch reference (harness/bench/reference_models.py),
  same shapes, precision and compilation, interleaved step by step ({settings.steps} steps,
  the first {settings.warmup} not timed); MFU against the dense bf16 peak.
- mixers: forward + backward of one layer; `reference` is the pure-PyTorch implementation,
  `fla` the same layer with its recurrence on FLA's kernels (harness.nn.fast_path), `fla layer`
  FLA's own layer of the same shapes. Peak MB: allocated above the inputs, one pass.
- decode: {settings.new_tokens} greedy tokens after a prompt of each context (a {settings.decode_layers}-layer
  transformer of each layer), train.kernels auto.

{HEADER}
{chr(10).join(format_row(r) for r in rows)}
"""


def appender(path: str) -> Callable[[Row, dict[str, str]], None]:
    """Append each row, as it is measured, to a JSON-lines file (the proof's record)."""
    import json

    def append(row: Row, tags: dict[str, str]) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(records([row], tags)[0]) + "\n")

    return append


def run(settings: Settings, home: str, progress: Callable[[str], None] = print,
        rows_to: Callable[[Row, dict[str, str]], None] | None = None) -> tuple[list[Row], dict[str, str]]:
    tags = device_tags(settings.device)
    progress(f"{common.machine(settings.device)}\nGPU {tags['gpu']}; CUDA {tags['cuda']}; "
             f"driver {tags['driver']}\n\n{HEADER}")
    started = time.perf_counter()

    def seen(row: Row) -> None:
        progress(format_row(row))
        if rows_to is not None:
            rows_to(row, tags)

    rows = benchmark(settings, home, seen)
    progress(f"\n{len(rows)} rows in {time.perf_counter() - started:.0f} s")
    return rows, tags
