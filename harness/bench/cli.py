"""``harness bench attention``: the command line of :mod:`harness.bench.attention`.

Only argparse at import time (``harness --help`` stays fast); the handler imports torch.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime
from typing import Any


def cmd_bench_attention(args: argparse.Namespace) -> int:
    from harness.bench import attention as bench
    from harness.bench import common
    from harness.loader import load

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
        min_time_s=args.min_time, timeout_s=args.timeout,
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


def _output_arg(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--output", "--out", dest="output", default=None, metavar="PATH",
                   help=f"Markdown record to write, never an existing file (default: a new dated "
                        f"file benchmarks/{name}_<device>_<date>.md; '-' writes none)")


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
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per measurement")
    _output_arg(p, "attention")
    p.add_argument("--plugin", action="append", default=[], metavar="PATH.py",
                   help="load a local plugin file (repeatable)")
    p.set_defaults(handler=cmd_bench_attention)
