"""Coverage of the two interval methods the report chooses between, by number of seeds.

    python benchmarks/interval_coverage.py [--reps 400] [--resamples 2000]

For each sample size n and each population (normal; accuracy-like, left-skewed near a
ceiling; loss-like, right-skewed; heavy-tailed), draws ``reps`` samples of n values and
counts how often the 95% interval of the mean covers the population mean: Student t
(``scipy.stats.t.interval``) and BCa bootstrap (``scipy.stats.bootstrap(method="BCa")``).
The report uses Student t below ``harness.report.stats.BCA_MIN_N`` seeds and BCa from there on;
the table recorded in ``benchmarks/interval_coverage.md`` is the evidence for that switch.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
from scipy import stats

POPULATIONS = {
    # name: (sampler(rng, size), population mean)
    "normal": (lambda rng, size: rng.normal(0.0, 1.0, size), 0.0),
    "acc-like beta(8,1.5)": (lambda rng, size: rng.beta(8.0, 1.5, size), 8.0 / 9.5),
    "loss-like lognormal(0,0.5)": (lambda rng, size: rng.lognormal(0.0, 0.5, size),
                                   float(np.exp(0.125))),
    "heavy-tailed t(3)": (lambda rng, size: rng.standard_t(3, size), 0.0),
}
SIZES = (3, 4, 5, 6, 8, 10, 12, 15, 20, 30, 40, 60, 100)


def coverage(n: int, sampler, mu: float, reps: int, resamples: int, rng) -> tuple[float, float]:
    hit_t = hit_bca = 0
    for _ in range(reps):
        x = sampler(rng, n)
        lo, hi = stats.t.interval(0.95, n - 1, loc=x.mean(), scale=stats.sem(x))
        hit_t += lo <= mu <= hi
        res = stats.bootstrap((x,), np.mean, confidence_level=0.95, n_resamples=resamples,
                              method="BCa", rng=rng)
        ci = res.confidence_interval
        hit_bca += bool(ci.low <= mu <= ci.high)
    return hit_t / reps, hit_bca / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma list of n")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    start = time.time()
    print(f"95% interval coverage of the mean, {args.reps} samples per cell, "
          f"{args.resamples} bootstrap resamples; t / BCa")
    print("| n | " + " | ".join(POPULATIONS) + " |")
    print("|---|" + "---|" * len(POPULATIONS))
    import warnings

    for n in (int(x) for x in args.sizes.split(",")):
        cells = []
        for sampler, mu in POPULATIONS.values():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t_cov, b_cov = coverage(n, sampler, mu, args.reps, args.resamples, rng)
            cells.append(f"{t_cov:.3f} / {b_cov:.3f}")
        print(f"| {n} | " + " | ".join(cells) + " |", flush=True)
    print(f"\n{platform.platform()}, Python {platform.python_version()}, scipy "
          f"{__import__('scipy').__version__}, numpy {np.__version__}; {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
