"""``harness check --coord NAME``: the coordinate check (:mod:`harness.testing.coord`) from the
command line: for each component a table per parametrization (every layer's activation size at
the last step per width, and its growth with width at each step), the verdict, and a figure."""

from __future__ import annotations

import argparse
import time
from typing import Any

from harness.errors import HarnessError

KINDS = ("model", "mixer", "attention")


def _widths(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        widths = ()
    if len(widths) < 3 or any(w < 4 for w in widths) or list(widths) != sorted(set(widths)):
        raise HarnessError(f"--widths {text}: give at least three increasing widths of 4 or more, "
                           f"comma-separated, e.g. --widths 32,64,128,256,512 (the first is μP's base).")
    return widths


def run_coord(registry: Any, specs: list[Any], args: argparse.Namespace, params: dict[str, Any]) -> int:
    """Check each spec of a kind that has a width; 1 when μP lets a layer grow."""
    from harness.testing.coord import coord_check, figure, table
    from harness.testing.core import NotApplicable

    widths = _widths(args.widths)
    if args.steps < 2 or args.seeds < 1 or not args.lr > 0:
        raise HarnessError("--steps must be at least 2 (a step after the first update), --seeds at "
                           "least 1 and --lr positive; e.g. --steps 4 --seeds 2 --lr 1e-2")
    from harness.runtime.paths import writable_folder

    out = writable_folder(args.out, "--out")  # before minutes of training, not after
    failed = []
    for spec in specs:
        started = time.perf_counter()
        print(f"{spec.kind} {spec.name}  ({spec.provenance()})", flush=True)
        if spec.kind not in KINDS:
            print(f"  n/a: a {spec.kind} has no width of its own; check the models and layers that use it\n")
            continue
        try:
            results = [coord_check(registry, spec.kind, spec.name, parametrization=p, widths=widths,
                                   steps=args.steps, seeds=args.seeds, lr=args.lr,
                                   optimizer=args.optimizer, params=params)
                       for p in ("standard", "mup")]
        except NotApplicable as exc:
            print(f"  n/a: {exc}\n")
            continue
        for result in results:
            print(f"\n{result.verdict()}\n\n{table(result)}\n", flush=True)
        out.mkdir(parents=True, exist_ok=True)
        path = figure(results, out / f"coord_{spec.kind}_{spec.name}.png")
        mup = results[1]
        print(f"  -> μP {'passes' if mup.passed else 'FAILS'}; figure {path} ({time.perf_counter() - started:.1f} s)\n")
        if not mup.passed:
            failed.append(f"{spec.kind} {spec.name}")
    print(f"{len(specs)} component(s): " + (f"μP lets layers grow in {', '.join(failed)}" if failed
                                              else "μP keeps every layer flat"))
    return 1 if failed else 0
