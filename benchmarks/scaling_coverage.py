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
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.report import scaling_fit as sf  # noqa: E402

TRUTH = sf.PowerLaw(1.6, 4000.0, 0.25)
CROSS_A = sf.PowerLaw(2.0, 30.0, 0.1)
CROSS_B = sf.PowerLaw(1.9, float(30.0 * 1e14 ** -0.1 + 0.1) * 1e14 ** 0.2, 0.2)
CROSS_AT = 1e14
def runs(law: sf.PowerLaw, rng: np.random.Generator, noise: float, seeds: int,
         budgets: int = 5, sizes: int = 5) -> list[sf.Run]:
    out = []
    half = sizes // 2
    for c in np.logspace(12, 16, budgets):
        for k in range(-half, sizes - half):
            truth = float(law(c)) + 0.02 * (0.7 * k) ** 2
            for s in range(seeds):
                out.append(sf.Run(float(c), math.sqrt(c) * math.exp(0.7 * k), s,
                                  truth * math.exp(rng.normal(0, noise))))
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
    args = ap.parse_args()
    started = time.time()
    print(f"95% interval coverage, {args.reps} simulated studies per row, {args.boot} bootstrap "
          f"replicates, {args.budgets} budgets x {args.sizes} sizes; alpha / E / N*-exponent / "
          f"crossover (at {CROSS_AT:.0e})\n")
    print("| seeds per cell | noise per run | alpha | E | N* exponent | crossover | crossover found |")
    print("|---|---|---|---|---|---|---|")
    for noise in (float(x) for x in args.noise.split(",")):
        for seeds in (int(x) for x in args.seeds.split(",")):
            hits = np.zeros(4)
            found = 0
            for i in range(args.reps):
                rng = np.random.default_rng(1000 * seeds + i)
                fit = sf.fit_candidate("t", runs(TRUTH, rng, noise, seeds, args.budgets, args.sizes), n_boot=args.boot, seed=i)
                hits[0] += cover(fit.alpha, TRUTH.alpha)
                hits[1] += cover(fit.E, TRUTH.E)
                hits[2] += cover(fit.n_exponent, 0.5)
                fa = sf.fit_candidate("A", runs(CROSS_A, rng, noise, seeds, args.budgets, args.sizes), n_boot=args.boot, seed=i)
                fb = sf.fit_candidate("B", runs(CROSS_B, rng, noise, seeds, args.budgets, args.sizes), n_boot=args.boot,
                                      seed=i + 7)
                cx = sf.crossover(fa, fb)
                found += cx.compute is not None
                hits[3] += cx.compute is not None and cx.low <= CROSS_AT <= cx.high
            cov = hits / args.reps
            print(f"| {seeds} | {noise:g} | {cov[0]:.3f} | {cov[1]:.3f} | {cov[2]:.3f} | "
                  f"{cov[3]:.3f} | {found / args.reps:.2f} |", flush=True)
    import scipy

    print(f"\n{platform.platform()}, Python {platform.python_version()}, scipy {scipy.__version__}, "
          f"numpy {np.__version__}; {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
