"""Coverage of the scaling fits' bootstrap intervals over repeated simulated studies.

    python benchmarks/scaling_coverage.py [--reps 60] [--boot 200]

Each simulated study is a grid of 5 budgets (1e12 to 1e16, 4 decades) x 5 sizes around the
compute-optimal one, ``seeds`` runs a cell, multiplicative log-normal noise ``noise`` per run,
and a true frontier L(C) = 1.6 + 4000 C^-0.25 (the iso-FLOP profile a parabola in log N
around N* = C^0.5). For each it runs :func:`harness.report.scaling_fit.fit_candidate` and
counts how often the 95% interval covers the true alpha, E and the N*(C) exponent (0.5);
then, for two candidates whose frontiers cross at 1e14 FLOPs, how often the crossover
interval covers it (:func:`harness.report.scaling_fit.crossover`). The table is recorded in
``benchmarks/scaling_coverage.md``.

Uneven grids: ``--uneven 2,1,1`` gives the cells (budget-major, sizes in order) 2, 1, 1, 2, 1,
1, ... seeds, cycling the pattern; ``--failed K`` drops K cells (the largest size at the
first K budgets) as failed runs would. ``--harness PATH`` imports ``harness`` from another
checkout (the code before a change, to compare). ``--duplicates`` makes a cell's extra seeds
repeat its first loss (a point read twice off a published figure: zero spread). ``--truth surface`` draws every run from a
Chinchilla loss surface L(N, D) = 1.8 + 400/N^0.35 + 2000/D^0.37 (D = C/6N, budgets 1e18 to
1e22, sizes around N*(C)) and measures approach 3's intervals (alpha, beta, E, a) and
approach 2's N*-exponent against the surface's a = beta/(alpha+beta).
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

_HARNESS = sys.argv[sys.argv.index("--harness") + 1] if "--harness" in sys.argv else None
sys.path.insert(0, _HARNESS or str(Path(__file__).resolve().parents[1]))
from harness.report import scaling_fit as sf  # noqa: E402

TRUTH = sf.PowerLaw(1.6, 4000.0, 0.25)
CROSS_A = sf.PowerLaw(2.0, 30.0, 0.1)
CROSS_B = sf.PowerLaw(1.9, float(30.0 * 1e14 ** -0.1 + 0.1) * 1e14 ** 0.2, 0.2)
CROSS_AT = 1e14
#: The loss surface of ``--truth surface`` (E, A, B, alpha, beta) and its a = beta/(alpha+beta).
SURFACE = (1.8, 400.0, 2000.0, 0.35, 0.37)
SURFACE_A = SURFACE[4] / (SURFACE[3] + SURFACE[4])


def layout(seeds: int, pattern: list[int] | None, failed: int, budgets: int, sizes: int
           ) -> list[list[int]]:
    """Seeds per cell, [budget][size]: ``seeds`` everywhere, or ``pattern`` cycled over the
    cells; 0 for the ``failed`` cells (the largest size at the first budgets)."""
    grid = [[pattern[(b * sizes + k) % len(pattern)] if pattern else seeds for k in range(sizes)]
            for b in range(budgets)]
    for b in range(failed):
        grid[b % budgets][sizes - 1 - b // budgets] = 0
    return grid


def runs(law: sf.PowerLaw, rng: np.random.Generator, noise: float, grid: list[list[int]],
         duplicates: bool = False) -> list[sf.Run]:
    """``duplicates``: a cell's extra seeds repeat its first loss (as points read twice off a
    published figure do)."""
    out = []
    sizes = len(grid[0])
    half = sizes // 2
    for c, row in zip(np.logspace(12, 16, len(grid)), grid, strict=True):
        for k, seeds in zip(range(-half, sizes - half), row, strict=True):
            truth = float(law(c)) + 0.02 * (0.7 * k) ** 2
            first = truth * math.exp(rng.normal(0, noise))
            for s in range(seeds):
                loss = first if s == 0 or duplicates else truth * math.exp(rng.normal(0, noise))
                out.append(sf.Run(float(c), math.sqrt(c) * math.exp(0.7 * k), s, loss))
    return out


def surface_runs(rng: np.random.Generator, noise: float, grid: list[list[int]]) -> list[sf.Run]:
    """Runs on a Chinchilla surface: sizes 0.7 in log around N*(C) at every budget."""
    E, A, B, al, be = SURFACE
    g = (al * A / (be * B)) ** (1 / (al + be))
    sizes = len(grid[0])
    half = sizes // 2
    out = []
    for c, row in zip(np.logspace(18, 22, len(grid)), grid, strict=True):
        for k, seeds in zip(range(-half, sizes - half), row, strict=True):
            n = g * (c / 6) ** SURFACE_A * math.exp(0.7 * k)
            loss = E + A / n ** al + B / (c / (6 * n)) ** be
            for s in range(seeds):
                out.append(sf.Run(float(c), n, s, loss * math.exp(rng.normal(0, noise))))
    return out


def cover(e: sf.Estimate, truth: float) -> bool:
    return e.defined and e.low <= truth <= e.high


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--boot", type=int, default=200)
    ap.add_argument("--seeds", default="1,2,3,5")
    ap.add_argument("--noise", default="0.005,0.02")
    ap.add_argument("--budgets", type=int, default=5, help="budgets from 1e12 to 1e16")
    ap.add_argument("--sizes", type=int, default=5, help="sizes per budget")
    ap.add_argument("--uneven", default="", help="seeds per cell, cycled over the cells (e.g. 2,1,1)")
    ap.add_argument("--failed", type=int, default=0, help="cells left out, as failed runs")
    ap.add_argument("--no-crossover", action="store_true", help="skip the crossover columns (a third of the time)")
    ap.add_argument("--truth", choices=("frontier", "surface"), default="frontier")
    ap.add_argument("--duplicates", action="store_true", help="extra seeds repeat the cell's first loss")
    ap.add_argument("--harness", default=None, help="import harness from this checkout")
    args = ap.parse_args()
    started = time.time()
    pattern = [int(x) for x in args.uneven.split(",")] if args.uneven else None
    print(f"95% interval coverage, {args.reps} simulated studies per row, {args.boot} bootstrap "
          f"replicates, {args.budgets} budgets x {args.sizes} sizes"
          + (f", seeds per cell cycling {pattern}" if pattern else "")
          + (f", {args.failed} cell(s) failed" if args.failed else "")
          + f"; harness from {Path(sf.__file__).resolve().parents[2]}\n")
    if args.truth == "surface":
        print("| seeds per cell | noise per run | runs | 3: alpha | 3: beta | 3: E | 3: a | 2: N* exponent |")
        print("|---|---|---|---|---|---|---|---|")
    else:
        print("| seeds per cell | noise per run | runs | alpha | E | N* exponent | crossover | crossover found |")
        print("|---|---|---|---|---|---|---|---|")
    seed_list = [0] if pattern else [int(x) for x in args.seeds.split(",")]
    for noise in (float(x) for x in args.noise.split(",")):
        for seeds in seed_list:
            grid = layout(seeds, pattern, args.failed, args.budgets, args.sizes)
            label = (args.uneven.replace(",", "/") if pattern else str(seeds)) \
                + (f", {args.failed} failed" if args.failed else "") \
                + (", extra seeds duplicates" if args.duplicates else "")
            n_runs = sum(map(sum, grid))
            if args.truth == "surface":
                hits = np.zeros(5)
                for i in range(args.reps):
                    rng = np.random.default_rng(7000 + i)
                    fit = sf.fit_candidate("t", surface_runs(rng, noise, grid), n_boot=args.boot, seed=i,
                                           surface=True)
                    s = fit.surface
                    hits += [s.alpha.covers(SURFACE[3]), s.beta.covers(SURFACE[4]), s.E.covers(SURFACE[0]),
                             s.a.covers(SURFACE_A), cover(fit.n_exponent, SURFACE_A)]
                cov = hits / args.reps
                print(f"| {label} | {noise:g} | {n_runs} | " + " | ".join(f"{c:.3f}" for c in cov) + " |",
                      flush=True)
                continue
            hits = np.zeros(4)
            found = 0
            for i in range(args.reps):
                rng = np.random.default_rng(1000 * seeds + i)
                fit = sf.fit_candidate("t", runs(TRUTH, rng, noise, grid, args.duplicates), n_boot=args.boot,
                                       seed=i)
                hits[0] += cover(fit.alpha, TRUTH.alpha)
                hits[1] += cover(fit.E, TRUTH.E)
                hits[2] += cover(fit.n_exponent, 0.5)
                if args.no_crossover:
                    continue
                fa = sf.fit_candidate("A", runs(CROSS_A, rng, noise, grid, args.duplicates), n_boot=args.boot,
                                      seed=i)
                fb = sf.fit_candidate("B", runs(CROSS_B, rng, noise, grid, args.duplicates), n_boot=args.boot,
                                      seed=i + 7)
                cx = sf.crossover(fa, fb)
                found += cx.compute is not None
                hits[3] += cx.compute is not None and cx.low <= CROSS_AT <= cx.high
            cov = hits / args.reps
            cross = ("- | -" if args.no_crossover else f"{cov[3]:.3f} | {found / args.reps:.2f}")
            print(f"| {label} | {noise:g} | {n_runs} | {cov[0]:.3f} | {cov[1]:.3f} | {cov[2]:.3f} | "
                  f"{cross} |", flush=True)
    import scipy

    print(f"\n{platform.platform()}, Python {platform.python_version()}, scipy {scipy.__version__}, "
          f"numpy {np.__version__}; {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
