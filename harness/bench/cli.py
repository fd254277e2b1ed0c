"""``harness bench attention``: the command line of :mod:`harness.bench.attention`.

Only argparse at import time (``harness --help`` stays fast); the handler imports torch.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.errors import HarnessError


def cmd_bench_attention(args: argparse.Namespace) -> int:
    import torch

    from harness.bench import attention as bench
    from harness.loader import load

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise HarnessError("--device cuda was requested but torch sees no CUDA device.")
    out = output_path(args.out, device, args.force)  # before the measurements, not after
    registry = load(args.plugin)
    names = args.variants or registry.names("attention")
    for name in names:
        registry.get("attention", name)  # unknown names fail here, with close matches
    settings = bench.Settings(
        lengths=tuple(args.lengths), batch=args.batch, d_model=args.d_model, heads=args.heads,
        device=device, dtype=args.dtype, causal=not args.bidirectional, threads=args.threads,
        variants=tuple(names), plugins=tuple(os.path.abspath(p) for p in args.plugin),
        max_memory_gb=args.max_memory_gb or default_budget_gb(device),
        min_time_s=args.min_time, timeout_s=args.timeout,
    )
    print(f"{bench.machine(device)}\nbudget {settings.max_memory_gb:.1f} GB; "
          f"one subprocess per measurement\n\n{bench.HEADER}", flush=True)
    started, t0 = datetime.now(UTC), time.perf_counter()
    results = bench.benchmark(settings, names, progress=lambda row: print(row, flush=True))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        command = "harness " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        text = bench.markdown(settings, results, bench.machine(device), command, started,
                              time.perf_counter() - t0)
        with open(out, "w" if args.force else "x") as fh:  # "x": never over an existing record
            fh.write(text)
        print(f"\nwritten to {out}")
    return 0


def output_path(requested: str | None, device: str, force: bool, today: str | None = None) -> Path | None:
    """Where the result goes: ``--output PATH`` (refused if it exists, unless ``--force``),
    else a new dated file ``benchmarks/attention_<device>_<date>.md`` (``-2``, ``-3`` ... when
    that day has one already); None for ``--output -``. Committed records are never
    overwritten silently."""
    if requested == "-":
        return None
    if requested is not None:
        path = Path(requested)
        if path.exists() and not force:
            raise HarnessError(
                f"--output {path} exists (a recorded benchmark?). Choose another path, leave "
                f"--output out for a new dated file, or pass --force to overwrite it."
            )
        return path
    stem = f"benchmarks/attention_{device}_{today or datetime.now().strftime('%Y-%m-%d')}"
    path, n = Path(f"{stem}.md"), 1
    while path.exists():
        n += 1
        path = Path(f"{stem}-{n}.md")
    return path


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
    p.add_argument("--output", "--out", dest="out", default=None, metavar="PATH",
                   help="Markdown file (default: a new dated file benchmarks/attention_<device>_"
                        "<date>.md; '-' writes none); an existing file is refused without --force")
    p.add_argument("--force", action="store_true", help="overwrite an existing --output file")
    p.add_argument("--plugin", action="append", default=[], metavar="PATH.py",
                   help="load a local plugin file (repeatable)")
    p.set_defaults(handler=cmd_bench_attention)
