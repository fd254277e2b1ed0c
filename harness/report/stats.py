"""Statistics for comparing candidates over a handful of seeds, on ``scipy.stats``.

A study ends with a few confirmation seeds per candidate, so everything here is chosen for
small samples, and every result carries the name of the method that produced it:

* :func:`mean_interval` — the interval of a mean: Student t (``scipy.stats.t.interval``)
  below :data:`BCA_MIN_N` values, BCa bootstrap (``scipy.stats.bootstrap``) from there on.
  Measured (``benchmarks/interval_coverage.md``): BCa is far too narrow at few values (72%
  coverage at 3 values, 85% at 6, 90% at 10, 92% at 20 for a nominal 95%), the t interval
  within about 3 points of nominal at every n even on skewed data; BCa reaches nominal only
  around 100 values, where it also follows the skew of a bounded metric. One value: NaN.
* :func:`p_value` — the paired test of "no difference": the exact sign-flip permutation test
  (``scipy.stats.permutation_test``, ``permutation_type="samples"``; no distributional
  assumption, but its smallest two-sided p-value is 2/2^n) or the paired t-test
  (``scipy.stats.ttest_1samp`` on the differences; assumes roughly normal differences).
* :func:`holm` — Holm's step-down adjustment of a family of p-values (scipy has only the
  false-discovery-rate adjustments, which do not control the family-wise error).
* :func:`paired_comparison` — effect sizes first: the mean difference on matched seeds, its
  interval and the relative difference, then the p-value.
* :func:`probability_of_improvement` — P(X > Y) over seed pairs (the Mann–Whitney U
  statistic over n·m), with a percentile bootstrap interval resampling each candidate's seeds
  separately (rliable's stratified bootstrap; one task is one stratum).
* :func:`seeds_to_resolve` — how many seeds would resolve an observed difference
  (a power estimate: noncentral t, iterated over n; never fewer than the test can resolve).
* :func:`resolution_floor` — whether a test over n seeds can reach a level at all after a
  Holm correction over m comparisons, and the fewest seeds that can.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

#: Interval methods, as named in every table header.
STUDENT_T = "Student t"
BCA = "BCa bootstrap"
#: From this many values on, intervals are BCa bootstrap; below it, Student t.
BCA_MIN_N = 100
N_RESAMPLES = 10_000
#: Up to this many pairs the sign-flip test enumerates all 2^n patterns; beyond, Monte Carlo.
EXACT_MAX = 16
#: The paired tests a study may choose (``confirm.test``), by name.
TESTS = {"sign_flip": "exact sign-flip permutation test", "t": "paired t-test"}


#: Sample values: a sequence or a numpy array of numbers.
Values = Sequence[float] | np.ndarray


def _clean(values: Values) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64).ravel()
    return arr[np.isfinite(arr)]


def mean(values: Values) -> float:
    arr = _clean(values)
    return float(arr.mean()) if arr.size else math.nan


# -- intervals ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    method: str  # STUDENT_T or BCA
    confidence: float

    @property
    def defined(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    @property
    def label(self) -> str:
        """``95% Student t``: what a table header says the interval is."""
        return f"{self.confidence:.0%} {self.method}"


def interval_method(n: int) -> str:
    return BCA if n >= BCA_MIN_N else STUDENT_T


def interval_label(n: int, confidence: float) -> str:
    return Interval(math.nan, math.nan, interval_method(n), confidence).label


def mean_interval(values: Values, confidence: float = 0.95, *, seed: int = 0,
                  n_resamples: int = N_RESAMPLES) -> Interval:
    """The interval of the mean of ``values`` (non-finite values dropped), by the method
    :func:`interval_method` picks for their number. NaN bounds for fewer than two values;
    values without spread give the zero-width interval at their mean."""
    import scipy.stats

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    arr = _clean(values)
    method = interval_method(arr.size)
    if arr.size < 2:
        return Interval(math.nan, math.nan, method, confidence)
    m = float(arr.mean())
    sem = float(scipy.stats.sem(arr))
    if np.ptp(arr) == 0 or sem == 0:  # no spread (or one that underflows)
        return Interval(m, m, method, confidence)
    if method == BCA:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # degenerate resamples: NaN, handled below
            res = scipy.stats.bootstrap((arr,), np.mean, confidence_level=confidence,
                                        n_resamples=n_resamples, method="BCa", vectorized=True,
                                        rng=np.random.default_rng(seed))
        low, high = res.confidence_interval
        if math.isfinite(low) and math.isfinite(high):
            return Interval(float(low), float(high), BCA, confidence)
        method = STUDENT_T  # BCa undefined for these values (for example two distinct values)
    low, high = scipy.stats.t.interval(confidence, arr.size - 1, loc=m, scale=sem)
    return Interval(float(low), float(high), method, confidence)


# -- tests -------------------------------------------------------------------------------------
def _check_test(test: str) -> None:
    if test not in TESTS:
        raise ValueError(f"unknown test '{test}'; one of {', '.join(TESTS)}")


def sign_flip_p(differences: Values, *, seed: int = 0, n_resamples: int = 100_000) -> float:
    """Two-sided p-value of the paired sign-flip permutation test of mean difference 0:
    exact (all 2^n sign patterns) up to :data:`EXACT_MAX` pairs, Monte Carlo beyond. NaN for
    no pairs."""
    import scipy.stats

    d = _clean(differences)
    if d.size == 0:
        return math.nan
    if d.size == 1 or not d.any():  # one pair: both sign patterns are as extreme
        return 1.0
    res = scipy.stats.permutation_test(
        (d,), np.mean, permutation_type="samples", vectorized=True, alternative="two-sided",
        n_resamples=np.inf if d.size <= EXACT_MAX else n_resamples, rng=np.random.default_rng(seed))
    return float(res.pvalue)


def t_p(differences: Values) -> float:
    """Two-sided p-value of the paired t-test (one-sample t-test of the differences). NaN for
    fewer than two pairs or differences without spread (the test is undefined)."""
    import scipy.stats

    d = _clean(differences)
    if d.size < 2 or np.ptp(d) == 0:
        return 1.0 if d.size >= 2 and not d.any() else math.nan
    return float(scipy.stats.ttest_1samp(d, 0.0).pvalue)


def p_value(differences: Values, test: str = "sign_flip", *, seed: int = 0) -> float:
    _check_test(test)
    return sign_flip_p(differences, seed=seed) if test == "sign_flip" else t_p(differences)


def min_p_value(test: str, n: int) -> float:
    """The smallest p-value the test can give with n pairs: 2/2^n for the exact sign-flip
    test (only the all-plus and all-minus patterns are as extreme as consistent signs); the
    t-test has no floor from two pairs on."""
    _check_test(test)
    if n < (1 if test == "sign_flip" else 2):
        return 1.0
    return min(1.0, 2.0 / 2.0 ** n) if test == "sign_flip" else 0.0


@dataclass(frozen=True)
class ResolutionFloor:
    """Can a test over ``n`` seeds resolve anything at level ``alpha`` after a Holm
    correction over ``comparisons``? Holm multiplies the smallest p-value by the family size."""

    test: str
    n: int
    comparisons: int
    alpha: float
    smallest_adjusted_p: float
    seeds_needed: int  # the fewest seeds for which it can

    @property
    def possible(self) -> bool:
        return self.smallest_adjusted_p <= self.alpha

    def sentence(self) -> str:
        """Why no difference can be resolved (for the first line of a report, and the
        warning of ``harness study run``)."""
        family = (f", {self.smallest_adjusted_p:.3g} after the Holm correction over "
                  f"{self.comparisons} comparisons" if self.comparisons > 1 else "")
        return (f"with {self.n} confirmation seed(s) the {TESTS[self.test]} cannot reach the "
                f"study's level {self.alpha:.3g}: its smallest p-value is "
                f"{min_p_value(self.test, self.n):.3g}{family}, so no difference between "
                f"candidates can be resolved. Use at least {self.seeds_needed} seeds "
                f"(confirm.seeds)" + (", or confirm.test: t if the differences are roughly normal"
                                      if self.test == "sign_flip" else "") + ".")


def resolution_floor(test: str, n: int, comparisons: int, alpha: float) -> ResolutionFloor:
    m = max(1, comparisons)
    need = next(k for k in range(2, 64) if min(1.0, m * min_p_value(test, k)) <= alpha)
    return ResolutionFloor(test, n, m, alpha, min(1.0, m * min_p_value(test, n)), need)


def holm(p_values: Values) -> list[float]:
    """Holm's step-down adjusted p-values (the family is the finite ones; NaN stays NaN):
    sorted ascending, the i-th (from 0) is multiplied by m - i, made non-decreasing, capped
    at 1. Rejecting where the adjusted value is <= alpha controls the family-wise error."""
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    m = order.size
    out[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    return [float(x) for x in out]


# -- comparisons -------------------------------------------------------------------------------
def matched(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[np.ndarray, np.ndarray]:
    """Values of two candidates on the seeds both have with finite values, in seed order."""
    seeds = sorted(s for s in set(a) & set(b) if math.isfinite(a[s]) and math.isfinite(b[s]))
    return (np.array([a[s] for s in seeds], dtype=np.float64),
            np.array([b[s] for s in seeds], dtype=np.float64))


@dataclass(frozen=True)
class PairedComparison:
    """A candidate against another on their matched seeds: candidate minus other."""

    n: int
    mean_difference: float
    interval: Interval
    relative_difference: float  # mean difference / |mean of the other on the matched seeds|
    p_value: float
    test: str
    p_adjusted: float = math.nan  # Holm over the family the caller compares in


def paired_comparison(candidate: Mapping[int, float], other: Mapping[int, float],
                      confidence: float = 0.95, test: str = "sign_flip", *,
                      seed: int = 0) -> PairedComparison:
    """Compare on matched seeds (``{seed: value}``); unmatched seeds and non-finite values
    are left out."""
    a, b = matched(candidate, other)
    d = a - b
    ref = float(b.mean()) if b.size else math.nan
    diff = mean(d)
    rel = diff / abs(ref) if b.size and ref != 0 else math.nan
    return PairedComparison(d.size, diff, mean_interval(d, confidence, seed=seed), rel,
                            p_value(d, test, seed=seed), test)


def probability_of_improvement(x: Values, y: Values, confidence: float = 0.95,
                               *, seed: int = 0, n_resamples: int = N_RESAMPLES
                               ) -> tuple[float, Interval]:
    """P(X > Y) for a seed of X and a seed of Y drawn independently (ties count one half),
    with a percentile bootstrap interval that resamples the seeds of X and of Y separately.
    Pass values negated where smaller is better."""
    import scipy.stats

    xs, ys = _clean(x), _clean(y)
    nan = Interval(math.nan, math.nan, "percentile bootstrap", confidence)
    if not xs.size or not ys.size:
        return math.nan, nan
    point = float(scipy.stats.mannwhitneyu(xs, ys).statistic) / (xs.size * ys.size)
    if xs.size < 2 or ys.size < 2:
        return point, nan

    def prob(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        gt = (a[..., :, None] > b[..., None, :]).mean(axis=(-1, -2))
        eq = (a[..., :, None] == b[..., None, :]).mean(axis=(-1, -2))
        return np.asarray(gt + 0.5 * eq)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = scipy.stats.bootstrap((xs, ys), prob, confidence_level=confidence,
                                    n_resamples=n_resamples, method="percentile",
                                    vectorized=True, rng=np.random.default_rng(seed))
    ci = res.confidence_interval
    return point, Interval(float(ci.low), float(ci.high), "percentile bootstrap", confidence)


def t_power(effect: float, n: int, alpha: float) -> float:
    """Power of the two-sided paired t-test with n pairs at level alpha when the mean
    difference is ``effect`` standard deviations (noncentral t)."""
    import scipy.stats

    df = n - 1
    crit = scipy.stats.t.ppf(1 - alpha / 2, df)
    nc = effect * math.sqrt(n)
    return float(scipy.stats.nct.sf(crit, df, nc) + scipy.stats.nct.cdf(-crit, df, nc))


def seeds_to_resolve(differences: Values, alpha: float, power: float = 0.8,
                     test: str = "sign_flip", max_n: int = 10_000) -> float:
    """About how many paired seeds the test needs to resolve the observed mean difference at
    level ``alpha`` with the given power, if the differences were normal with the observed
    mean and standard deviation (both estimates themselves uncertain at few seeds).

    The paired t-test's sample size, found by iterating its power over n (noncentral t),
    starting from the normal approximation n = ((z_{1-a/2} + z_power) s / d)^2; the
    sign-flip test has about the t-test's power at normal data but never fewer seeds than
    it needs to reach ``alpha`` at all. ``inf`` when the observed difference is zero or more
    than ``max_n`` seeds would be needed; NaN for fewer than two differences."""
    import scipy.stats

    d = _clean(differences)
    if d.size < 2:
        return math.nan
    floor = resolution_floor(test, d.size, 1, alpha).seeds_needed
    diff, sd = abs(float(d.mean())), float(d.std(ddof=1))
    if diff == 0:
        return math.inf
    if sd == 0:
        return float(floor)
    effect = diff / sd
    z = scipy.stats.norm.ppf(1 - alpha / 2) + scipy.stats.norm.ppf(power)
    n = max(2, math.floor((z / effect) ** 2))
    if n > max_n:
        return math.inf
    while n > 2 and t_power(effect, n - 1, alpha) >= power:
        n -= 1
    while t_power(effect, n, alpha) < power:
        n += 1
        if n > max_n:
            return math.inf
    return float(max(n, floor))
