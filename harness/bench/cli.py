"""``harness bench attention``: the command line of :mod:`harness.bench.attention`.

Only argparse at import time (``harness --help`` stays fast); the handler imports torch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.errors import HarnessError


def cmd_bench_attention(args: argparse.Namespace) -> int:
    from harness.bench import attention as bench
    from harness.bench import common
    from harness.registry.loader import load

    device = common.resolve_device(args.device)
    registry = load(args.plugin)
    names = args.variants or registry.names("attention")
    for name in names:
        registry.get("attention", name)  # unknown names fail here, with close matches
    settings = bench.Settings(
        lengths=tuple(args.lengths), batch=args.batch, d_model=args.d_model, heads=args.heads,
        device=device, dtype=args.dtype, causal=not args.bidirectional, threads=args.threads,
        variants=tuple(names), plugins=tuple(os.path.abspath(p) for p in args.plugin),
        max_memory_gb=args.max_memory_gb or common.default_budget_gb(device),
        min_time_s=args.min_time, timeout_s=args.timeout, max_pass_s=args.max_pass_s,
    )
    started, t0, load_before = datetime.now(UTC), time.perf_counter(), common.load_line()
    out = common.record_path(args.output, "attention", device, started)
    print(f"{common.machine(device)}\nbudget {settings.max_memory_gb:.1f} GB; "
          f"one subprocess per measurement\n\n{bench.HEADER}", flush=True)
    results = bench.benchmark(settings, names, progress=lambda row: print(row, flush=True))
    head = common.header(f"Attention benchmark ({device})", device=device, command=common.command_line(),
                         started=started, seconds=time.perf_counter() - t0, load_before=load_before,
                         load_after=common.load_line())
    common.write_record(out, bench.markdown(settings, results, head))
    return 0


def cmd_bench_model(args: argparse.Namespace) -> int:
    import tempfile

    from harness.bench import common
    from harness.bench import model as bench
    from harness.config import load_run_config

    overrides = [f"{key}={value}" for flag, key in MODEL_FLAGS
                 if (value := getattr(args, flag)) is not None] + list(args.set)
    if args.config is None and not any(o.startswith("task.name=") for o in overrides):
        raise HarnessError("harness bench model needs a run config file or --task and --model; try "
                           "`harness bench model benchmarks/configs/transformer_char_lm.yaml`.")
    config = load_run_config(args.config, overrides).model_dump(mode="json", exclude_unset=True)
    device = common.resolve_device(args.device)
    settings = bench.Settings(config=config, steps=args.steps, warmup=args.warmup, repeats=args.repeats,
                              threads=args.threads, device=device, timeout_s=args.timeout,
                              peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None)
    if args.warmup >= args.steps:
        raise HarnessError(f"--warmup ({args.warmup}) must be below --steps ({args.steps}): "
                           f"the throughput is measured over the steps after the warm-up.")
    started, t0, load_before = datetime.now(UTC), time.perf_counter(), common.load_line()
    out = common.record_path(args.output, "model", device, started)
    print(f"{common.machine(device)}\n{load_before}", flush=True)
    peak = bench.peak_flops(settings)
    print(f"peak {peak[0] and peak[0] / 1e9:,.1f} GFLOP/s ({peak[1]})", flush=True)
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as home:
        runs = bench.benchmark(settings, home, progress=lambda line: print(line, flush=True))
    summary = bench.summarise(runs[0], runs[1], peak[0])
    head = common.header(f"Model benchmark ({device}): harness vs plain PyTorch", device=device,
                         command=common.command_line(), started=started, seconds=time.perf_counter() - t0,
                         load_before=load_before, load_after=common.load_line())
    text = bench.markdown(settings, *runs, peak, head)
    print("\n" + text[text.index("| system"):])
    common.write_record(out, text)
    failed = bench.failures(summary, args.min_ratio, args.max_fixed_cost)
    for line in failed:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if failed else 0


def cmd_bench_decode(args: argparse.Namespace) -> int:
    from harness.bench import common
    from harness.bench import decode as bench
    from harness.registry.loader import load

    device = common.resolve_device(args.device)
    registry = load(args.plugin)
    archs = select(decode_names(registry), args.only)
    settings = bench.Settings(
        contexts=tuple(args.contexts), new_tokens=args.new_tokens, batch=args.batch, d_model=args.d_model,
        layers=args.layers, heads=args.heads, device=device, threads=args.threads,
        plugins=tuple(os.path.abspath(p) for p in args.plugin),
        max_memory_gb=args.max_memory_gb or common.default_budget_gb(device), timeout_s=args.timeout,
        fit_from=args.fit_from,
    )
    started, t0, load_before = datetime.now(UTC), time.perf_counter(), common.load_line()
    out = common.record_path(args.output, "decode", device, started)
    print(f"{common.machine(device)}\n{load_before}\n\n{bench.HEADER}", flush=True)
    points = bench.benchmark(settings, archs, progress=lambda row: print(row, flush=True))
    print(f"\n{bench.SLOPE_HEADER}\n" + "\n".join(bench.slope_rows(points, settings.fit_from, registry)))
    head = common.header(f"Decoding benchmark ({device})", device=device, command=common.command_line(),
                         started=started, seconds=time.perf_counter() - t0, load_before=load_before,
                         load_after=common.load_line())
    common.write_record(out, bench.markdown(settings, points, registry, head))
    return 0


def cmd_bench_mixer(args: argparse.Namespace) -> int:
    from harness.bench import attention, common, decode, mixer
    from harness.registry.loader import load

    device = common.resolve_device(args.device)
    registry = load(args.plugin)
    names = select(mixer.names(registry), args.only)
    plugins = tuple(os.path.abspath(p) for p in args.plugin)
    budget = args.max_memory_gb or common.default_budget_gb(device)
    passes_settings = attention.Settings(
        lengths=tuple(args.lengths), batch=args.batch, d_model=args.d_model, heads=args.heads, device=device,
        threads=args.threads, plugins=plugins, max_memory_gb=budget, min_time_s=args.min_time,
        timeout_s=args.timeout, max_pass_s=args.max_pass_s, either_direction=True, baselines=("torch.sdpa",),
    )
    decode_settings = decode.Settings(
        contexts=tuple(args.contexts), new_tokens=args.new_tokens, d_model=args.d_model, heads=args.heads,
        device=device, threads=args.threads, plugins=plugins, max_memory_gb=budget, timeout_s=args.timeout,
        fit_from=args.fit_from,
    )
    started, t0, load_before = datetime.now(UTC), time.perf_counter(), common.load_line()
    out = common.record_path(args.output, "mixers", device, started)
    print(f"{common.machine(device)}\n{load_before}\n\n{attention.header(passes_settings.baselines)}", flush=True)
    passes = attention.benchmark(passes_settings, names, progress=lambda row: print(row, flush=True))
    generating = set(decode.architectures(registry))
    points: list[Any] = []
    if args.contexts:
        print(f"\n{decode.HEADER}", flush=True)
        points = decode.benchmark(decode_settings, [n for n in names if n in generating],
                                  progress=lambda row: print(row, flush=True))
    rows = mixer.compare(registry, passes, points, args.fit_from)
    print(f"\n{mixer.SUMMARY_HEADER}\n" + "\n".join(mixer.summary_rows(rows, args.tolerance)))
    head = common.header(f"Mixer benchmark ({device}): declared against measured growth", device=device,
                         command=common.command_line(), started=started, seconds=time.perf_counter() - t0,
                         load_before=load_before, load_after=common.load_line())
    common.write_record(out, mixer.markdown(passes_settings, passes, decode_settings, points, registry,
                                            args.tolerance, head))
    return 0


def cmd_bench_gpu(args: argparse.Namespace) -> int:
    import json
    import tempfile

    from harness.bench import autotune, common, gpu
    from harness.bench.gpu_args import check_gpu_args

    check_gpu_args(args)  # every option, before any work
    device = gpu.require_cuda(args.dry_run)  # exit 2 without CUDA, unless a dry run
    if os.environ.get(autotune.REP_ENV) or os.environ.get(autotune.SLICE_ENV):
        print(autotune.apply_from_environment(), flush=True)
    if args.deadline is not None:  # the time-boxed proof: sections in processes of their own
        from harness.bench import proof

        records = Path(args.records)
        clash = [name for name in proof.Records.NAMES if (records / name).exists()]
        if clash:
            raise HarnessError(f"--records {records} already holds {', '.join(clash)}: give a new folder "
                               f"(a record is never overwritten).")
        proof.run(records, args.deadline, list(args.tests or []), args.test_timeout, args.dry_run,
                  say=lambda line: print(line, flush=True), commit=args.commit)
        return 0
    sections = tuple(args.only or gpu.SECTIONS)
    settings = gpu.dry_run_settings(sections, tuple(args.mixers or ())) if args.dry_run else gpu.Settings(
        sections=sections, mixers=tuple(args.mixers or ()), steps=args.steps, repeats=args.repeats,
        min_time_s=args.min_time)
    settings.early_path = args.jsonl
    started, t0, load_before = datetime.now(UTC), time.perf_counter(), common.load_line()
    out = common.record_path(args.output, "gpu", "dry-run" if args.dry_run else device, started)
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as home:
        rows, tags = gpu.run(settings, home, progress=lambda line: print(line, flush=True),
                             rows_to=gpu.appender(args.jsonl) if args.jsonl else None)
    head = common.header("GPU benchmark" + (" (dry run on the CPU: tiny shapes, no figure to read)"
                                            if args.dry_run else ""), device=device,
                         command=common.command_line(), started=started, seconds=time.perf_counter() - t0,
                         load_before=load_before, load_after=common.load_line())
    common.write_record(out, gpu.markdown(settings, rows, tags, head))
    if out is not None:
        out.with_suffix(".json").write_text(json.dumps(gpu.records(rows, tags), indent=1) + "\n")
    return 0


def decode_names(registry: Any) -> list[str]:
    from harness.bench import decode

    return decode.architectures(registry)


def select(names: list[str], only: list[str] | None) -> list[str]:
    """``names`` limited to those ``--only`` gives (``kind:name`` or a bare name)."""
    if not only:
        return names
    chosen = [n for n in names if n in only or n.split(":", 1)[1] in only]
    unknown = [o for o in only if not any(o in (n, n.split(":", 1)[1]) for n in names)]
    if unknown:
        raise HarnessError(f"--only: {', '.join(unknown)} is not among the architectures measured here "
                           f"({', '.join(names)}).")
    return chosen


#: ``harness bench model`` flags that set a config field (as ``harness train``'s do)
MODEL_FLAGS = (("task", "task.name"), ("model", "model.name"), ("attention", "model.attention.name"),
               ("mixer", "model.mixer.name"), ("position", "model.position.name"))


def _output_arg(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--output", "--out", dest="output", default=None, metavar="PATH",
                   help=f"Markdown record to write, never an existing file (default: a new dated "
                        f"file benchmarks/{name}_<device>_<date>.md; '-' writes none)")


def _common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--threads", type=int, default=1, help="torch threads per measurement")
    p.add_argument("--max-memory-gb", type=float, default=None,
                   help="skip sizes estimated above this (default: half the available RAM, "
                        "or 90%% of free GPU memory)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement")
    p.add_argument("--plugin", action="append", default=[], metavar="PATH.py",
                   help="load a local plugin file (repeatable)")


def add_parsers(subparsers: Any) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks (see `harness bench attention --help`)")
    kinds = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    bench.set_defaults(handler=lambda _args: bench.print_help() or 0)

    p = kinds.add_parser(
        "attention",
        help="forward+backward throughput and peak memory of every attention variant",
        description="Measure every attention variant (default hyper-parameters) next to "
                    "PyTorch's SDPA and nn.MultiheadAttention; print a table and write it as "
                    "Markdown with the machine description.",
    )
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4, help="the model's head count")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--bidirectional", action="store_true", help="no causal mask")
    p.add_argument("--variants", nargs="+", metavar="NAME", help="default: every registered variant")
    p.add_argument("--threads", type=int, default=1, help="torch threads per measurement")
    p.add_argument("--max-memory-gb", type=float, default=None,
                   help="skip sizes estimated above this (default: half the available RAM, "
                        "or 90%% of free GPU memory)")
    p.add_argument("--min-time", type=float, default=1.0, help="seconds of timed passes per size")
    p.add_argument("--max-pass-s", type=float, default=120.0,
                   help="skip a length whose forward + backward would take longer (extrapolated; "
                        "memory too small to extrapolate at tiny sizes still bounds the time)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per measurement")
    _output_arg(p, "attention")
    p.add_argument("--plugin", action="append", default=[], metavar="PATH.py",
                   help="load a local plugin file (repeatable)")
    p.set_defaults(handler=cmd_bench_attention)

    p = kinds.add_parser(
        "model",
        help="tokens/s, fixed cost and MFU of a config trained through harness.train vs plain PyTorch",
        description="Train a run config (a YAML file and/or --task/--model/--set) for a few steps "
                    "through harness.train, next to a plain-PyTorch reference of the same shapes "
                    "(harness/bench/reference_models.py), each in a fresh process, alternately; print "
                    "tokens/s, their ratio, the fixed cost per run and MFU, and write a record.",
    )
    p.add_argument("config", nargs="?", help="run config YAML")
    for flag, key in MODEL_FLAGS:
        p.add_argument(f"--{flag}", default=None, help=f"sets {key}")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set model.params.d_model=256")
    p.add_argument("--steps", type=int, default=30, help="training steps per run")
    p.add_argument("--warmup", type=int, default=5, help="first steps left out of the throughput")
    p.add_argument("--repeats", type=int, default=3, help="harness/reference pairs, each a fresh process")
    p.add_argument("--threads", type=int, default=1, help="torch threads of both")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's peak (default: measured fp32 matmul on CPU; the table for GPUs)")
    p.add_argument("--min-ratio", type=float, default=None,
                   help="exit 1 when harness/reference tokens/s falls below this (e.g. 0.95)")
    p.add_argument("--max-fixed-cost", type=float, default=None, metavar="SECONDS",
                   help="exit 1 when the fixed cost per run exceeds this (e.g. 3)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    _output_arg(p, "model")
    p.set_defaults(handler=cmd_bench_model)

    p = kinds.add_parser(
        "decode",
        help="generated tokens/s and decoding memory against context length, every generating architecture",
        description="For every architecture that generates (each causal attention variant and each "
                    "mixer in the transformer, and the recurrent LMs), read a prompt of each context "
                    "length through the cache and time greedy generation; fit the growth of time per "
                    "token and of state with context on log-log.",
    )
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--new-tokens", type=int, default=16, help="generated (and timed) tokens per point")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--only", nargs="+", metavar="NAME", help="only these (kind:name or name)")
    p.add_argument("--fit-from", type=int, default=1024, help="fit slopes over contexts from this on")
    _common_args(p)
    _output_arg(p, "decode")
    p.set_defaults(handler=cmd_bench_decode)

    p = kinds.add_parser(
        "gpu",
        help="on a CUDA GPU: GPT-2-small-shaped Transformer MFU vs plain PyTorch, every mixer's "
             "reference vs fast path vs FLA's layer, flash attention to 32k, decode latency",
        description="The GPU session's benchmark (docs/performance.md): each section's rows carry "
                    "the GPU's name, CUDA and driver. Needs a CUDA device (exit 2 otherwise); "
                    "--dry-run runs every code path at tiny shapes on the CPU.",
    )
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (code paths only)")
    p.add_argument("--only", nargs="+", choices=["ceiling", "transformer", "mixers", "attention", "decode", "small"],
                   help="only these sections (default: all)")
    p.add_argument("--mixers", nargs="+", metavar="NAME", help="only these mixers (default: every one)")
    p.add_argument("--steps", type=int, default=30, help="training steps of the transformer runs")
    p.add_argument("--repeats", type=int, default=1, help="harness/reference pairs (fresh processes)")
    p.add_argument("--min-time", type=float, default=1.0, help="seconds of timed passes per layer")
    p.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="the time-boxed proof (benchmarks/gpu/README.md): the environment, then the "
                        "tests and the sections in order of value, each written as it ends; a section "
                        "that would overrun is skipped and named")
    p.add_argument("--records", default=None, metavar="DIR",
                   help="with --deadline: the folder for proof.md, proof.jsonl and tests.xml")
    p.add_argument("--tests", nargs="+", default=None, metavar="PATH",
                   help="with --deadline: the pytest files of the tests section (e.g. tests/test_gpu.py)")
    p.add_argument("--test-timeout", type=float, default=90.0, help="seconds per test (pytest-timeout)")
    p.add_argument("--commit", default=None, metavar="SHA",
                   help="with --deadline: the commit measured, for the record (a node's copy has no .git)")
    p.add_argument("--jsonl", default=None, help=argparse.SUPPRESS)  # a proof's section: rows as they finish
    _output_arg(p, "gpu")
    p.set_defaults(handler=cmd_bench_gpu)

    p = kinds.add_parser(
        "mixer",
        help="time, memory and decoding cost of every mixer and attention variant against length, "
             "checked against the declared complexity",
        description="Forward + backward time and peak memory of one layer against the sequence length "
                    "(fixed width), and decoding time per token against context length, for every "
                    "mixer and attention variant; fit log-log slopes and compare them with each "
                    "layer's declared complexity.",
    )
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--contexts", type=int, nargs="*", default=[128, 256, 512, 1024, 2048, 4096, 8192],
                   help="decoding contexts (none: skip decoding)")
    p.add_argument("--new-tokens", type=int, default=16, help="generated (and timed) tokens per point")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--min-time", type=float, default=1.0, help="seconds of timed passes per size")
    p.add_argument("--max-pass-s", type=float, default=120.0,
                   help="skip a length whose forward + backward would take longer (extrapolated)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="only these (kind:name or name)")
    p.add_argument("--fit-from", type=int, default=1024, help="fit slopes over lengths from this on")
    p.add_argument("--tolerance", type=float, default=0.35, help="flag slopes further than this from the declared")
    _common_args(p)
    _output_arg(p, "mixers")
    p.set_defaults(handler=cmd_bench_mixer)
