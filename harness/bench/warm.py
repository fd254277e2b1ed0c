"""``python -m harness.bench.warm --slice I/N``: one of the proof's N FLA warmers.

Started by :mod:`harness.bench.proof` at its beginning, beside its first sections, on a GPU
node with FLA installed. This process compiles its share of every autotuned kernel's
configurations (:func:`harness.bench.autotune.precompile_slice`) for the calls the mixers
section and the GPU tests will make: each fast-path mixer and FLA's own layer, forward and
backward at the mixers section's shapes (:mod:`harness.bench.gpu`), then the fast-path test
file in this process. Outcomes are not used (one configuration runs, untimed); what counts is
Triton's on-disk cache, which the measuring processes then hit. One line on stdout says what
was compiled; the proof's log keeps it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def workload(settings: object, mixers: tuple[str, ...], lengths: tuple[int, ...]) -> None:
    from harness.bench import gpu

    assert isinstance(settings, gpu.Settings)
    for length in lengths:  # the order the mixers section measures in
        settings.mixer_lengths = (length,)
        for name in mixers:
            for call, arguments in ((gpu.harness_layer, (settings, f"mixer:{name}", "fla", length)),
                                    (gpu.fla_layer, (settings, name, length))):
                try:
                    call(*arguments)  # type: ignore[operator]
                except Exception as exc:  # one layer that fails leaves the others to warm
                    print(f"warm: mixer {name} at L {length}: {type(exc).__name__}: {exc}"[:300], flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--slice", required=True, help="INDEX/COUNT")
    p.add_argument("--mixers", nargs="+", required=True)
    p.add_argument("--lengths", nargs="+", type=int, required=True)
    p.add_argument("--done", default=None, help="a file to create once the mixers' shapes are compiled")
    p.add_argument("--tests", nargs="*", default=[], help="pytest files to run once, untimed")
    args = p.parse_args(argv)
    from harness.runtime.children import die_with_parent

    die_with_parent()
    import importlib.util

    from harness.bench import autotune, gpu

    index, count = autotune.parse_slice(args.slice)
    import torch

    why = ("triton is not installed here" if importlib.util.find_spec("triton") is None
           else None if torch.cuda.is_available() else "no CUDA device here")
    if why:
        print(f"warm {args.slice}: {why}, nothing to compile", flush=True)
        if args.done:
            Path(args.done).touch()
        return 0
    stats = autotune.precompile_slice(index, count)
    start = time.perf_counter()
    settings = gpu.Settings(min_time_s=0.0)
    workload(settings, tuple(args.mixers), tuple(args.lengths))
    mixers_s = time.perf_counter() - start
    print(f"warm {args.slice}: the mixers' shapes in {mixers_s:.0f} s: {stats['compiled']} configurations "
          f"compiled ({stats['failed']} refused) for {stats['keys']} kernel calls", flush=True)
    if args.done:
        Path(args.done).touch()
    tests = [t for t in args.tests if Path(t).is_file()]
    if tests:
        import pytest

        os.environ["HARNESS_WARMER"] = "1"
        pytest.main(["-q", "-p", "no:cacheprovider", "-o", "addopts=", "--no-header", "-rN", *tests])
    print(f"warm {args.slice}: {stats['compiled']} configurations compiled ({stats['failed']} refused) "
          f"for {stats['keys']} kernel calls; mixers {mixers_s:.0f} s, all {time.perf_counter() - start:.0f} s",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
