"""Statistics for comparing candidates over seeds (numpy only).

A study ends with a handful of confirmation seeds per candidate, so everything here is
chosen for small samples:

* :func:`bootstrap_ci` — percentile bootstrap of the mean, seeded so reports are
  reproducible. With one value there is no spread to resample: the interval is undefined
  (NaN), never a misleading zero-width interval.
* :func:`sign_flip_test` — the paired permutation test: under the null hypothesis "no
  difference", each seed's difference is as likely to be positive as negative, so the
  p-value is the share of the 2^n sign assignments whose mean difference is at least as
  extreme as the observed one. Exact enumeration up to ``exact_max`` pairs (no
  distributional assumption, valid for n = 3), Monte Carlo beyond.
* :func:`paired_comparison` — mean difference, its bootstrap interval and the test.
* :func:`ranks` — 1 = best, ties share the average rank, missing values rank last.
* :func:`pareto_mask` — which points are not dominated (the quality-versus-cost front).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Relative tolerance when comparing permuted statistics with the observed one, so that
#: sign patterns giving the same mean up to rounding count as "as extreme".
_TIE_RTOL = 1e-9


def _clean(values: Sequence[float]) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    return arr[np.isfinite(arr)]


def mean(values: Sequence[float]) -> float:
    arr = _clean(values)
    return float(arr.mean()) if arr.size else math.nan


def bootstrap_ci(
    values: Sequence[float],
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean of ``values``.

    Non-finite values are dropped. Returns ``(nan, nan)`` for fewer than two values.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    arr = _clean(values)
    if arr.size < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.size, size=(n_resamples, arr.size))
    means = arr[idx].mean(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return float(low), float(high)


def sign_flip_test(
    differences: Sequence[float],
    exact_max: int = 16,
    n_resamples: int = 100_000,
    seed: int = 0,
) -> float:
    """Two-sided p-value of the paired sign-flip permutation test of mean difference 0.

    Exact (all 2^n sign patterns) for n <= ``exact_max``; otherwise a Monte Carlo estimate
    that counts the observed pattern, so the p-value is never 0. NaN for no pairs.
    """
    d = _clean(differences)
    n = d.size
    if n == 0:
        return math.nan
    observed = abs(d.mean())
    threshold = observed - _TIE_RTOL * max(observed, np.abs(d).max())
    if n <= exact_max:
        # Row k of `signs` is the binary expansion of k mapped to +1 / -1.
        patterns = np.arange(2**n, dtype=np.int64)[:, None] >> np.arange(n, dtype=np.int64)
        signs = 1 - 2 * (patterns & 1)
        stats = np.abs(signs @ d) / n
        return float(np.mean(stats >= threshold))
    rng = np.random.default_rng(seed)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(n_resamples, n))
    stats = np.abs(signs @ d) / n
    return float((np.sum(stats >= threshold) + 1) / (n_resamples + 1))


@dataclass(frozen=True)
class PairedComparison:
    """A candidate against the baseline over the seeds both have."""

    n: int
    mean_difference: float  # candidate minus baseline
    ci: tuple[float, float]
    p_value: float


def paired_comparison(
    candidate: dict[int, float],
    baseline: dict[int, float],
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> PairedComparison:
    """Compare two candidates on matched seeds (``{seed: value}``); unmatched seeds and
    non-finite values are left out."""
    seeds = sorted(
        s for s in set(candidate) & set(baseline)
        if math.isfinite(candidate[s]) and math.isfinite(baseline[s])
    )
    diffs = [candidate[s] - baseline[s] for s in seeds]
    return PairedComparison(
        n=len(diffs),
        mean_difference=mean(diffs),
        ci=bootstrap_ci(diffs, confidence, n_resamples, seed),
        p_value=sign_flip_test(diffs, seed=seed),
    )


def ranks(values: Sequence[float], maximize: bool) -> list[float]:
    """Rank 1 = best. Ties share the average of the ranks they span; NaN ranks last (tied
    among themselves)."""
    arr = np.asarray(values, dtype=np.float64)
    key = np.where(np.isfinite(arr), -arr if maximize else arr, np.inf)
    order = np.argsort(key, kind="stable")
    out = np.empty(arr.size)
    i = 0
    while i < arr.size:
        j = i
        while j + 1 < arr.size and key[order[j + 1]] == key[order[i]]:
            j += 1
        out[order[i: j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return [float(r) for r in out]


def pareto_mask(points: Sequence[Sequence[float]], maximize: Sequence[bool]) -> list[bool]:
    """For each point, whether no other point is at least as good in every coordinate and
    strictly better in one. Points with a non-finite coordinate are never on the front."""
    arr = np.asarray(points, dtype=np.float64).reshape(len(points), len(maximize))
    signed = np.where(np.asarray(maximize), arr, -arr)  # larger is better everywhere
    finite = np.asarray(np.isfinite(signed).all(axis=1), dtype=bool)
    mask = []
    for i in range(len(arr)):
        if not finite[i]:
            mask.append(False)
            continue
        others = signed[finite]
        dominated = np.any(np.all(others >= signed[i], axis=1) & np.any(others > signed[i], axis=1))
        mask.append(not bool(dominated))
    return mask
