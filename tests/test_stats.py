"""harness.report.stats against independent computations on random samples: brute-force sign
enumeration, the t formulas written out, Efron's BCa from its equations, Holm's procedure as
stated, pair counting for P(X > Y) and Monte Carlo power."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.report import stats

FINITE = st.floats(-10, 10, allow_nan=False, allow_infinity=False)
SMALL = settings(max_examples=40, deadline=None)


def brute_force_sign_flip(d: list[float]) -> float:
    """Two-sided p-value by listing every sign pattern with itertools (no numpy tricks)."""
    observed = abs(sum(d) / len(d))
    extreme = total = 0
    for signs in itertools.product((1, -1), repeat=len(d)):
        total += 1
        if abs(sum(s * x for s, x in zip(signs, d, strict=True)) / len(d)) >= observed - 1e-9:
            extreme += 1
    return extreme / total


# -- the paired tests ------------------------------------------------------------------------
@SMALL
@given(st.lists(st.floats(-5, 5, allow_nan=False).map(lambda x: round(x, 3)), min_size=1, max_size=9))
def test_sign_flip_matches_brute_force(d):
    assert stats.sign_flip_p(d) == pytest.approx(brute_force_sign_flip(d), abs=1e-12)


@pytest.mark.parametrize("n", range(1, 9))
def test_consistent_signs_give_the_floor(n):
    d = list(np.random.default_rng(n).uniform(0.1, 1.0, size=n))
    assert stats.sign_flip_p(d) == pytest.approx(2 / 2**n) == pytest.approx(stats.min_p_value("sign_flip", n))
    assert stats.sign_flip_p([-x for x in d]) == pytest.approx(2 / 2**n)


def test_sign_flip_edge_cases_and_monte_carlo():
    assert stats.sign_flip_p([0.0, 0.0]) == 1.0
    assert math.isnan(stats.sign_flip_p([]))
    assert stats.sign_flip_p([1.0, float("nan"), 2.0]) == pytest.approx(brute_force_sign_flip([1.0, 2.0]))
    d = np.random.default_rng(3).normal(0.4, 1.0, size=stats.EXACT_MAX + 2)  # Monte Carlo
    signs = 1 - 2 * ((np.arange(2 ** d.size)[:, None] >> np.arange(d.size)) & 1)
    exact = float(np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-9))
    assert stats.sign_flip_p(d) == pytest.approx(exact, abs=0.01)  # 100k draws: SE ~0.003


@SMALL
@given(st.lists(FINITE, min_size=2, max_size=12))
def test_t_test_matches_the_formula(d):
    arr = np.array(d)
    sd = arr.std(ddof=1)
    if sd < 1e-6 * max(1.0, abs(arr.mean())):
        return  # no spread: the formula is undefined (covered below)
    t = arr.mean() / (sd / math.sqrt(arr.size))
    assert stats.t_p(d) == pytest.approx(2 * scipy.stats.t.sf(abs(t), arr.size - 1), rel=1e-6, abs=1e-12)


def test_t_test_without_spread():
    assert stats.t_p([0.0, 0.0, 0.0]) == 1.0
    assert math.isnan(stats.t_p([0.1, 0.1]))
    assert math.isnan(stats.t_p([0.1]))
    assert stats.min_p_value("t", 3) == 0.0


@pytest.mark.parametrize(("test", "n", "m", "possible", "needed"), [
    ("sign_flip", 3, 1, False, 6),   # the numbers: 3 seeds floor at 0.25, 6 reach 0.05
    ("sign_flip", 6, 1, True, 6),
    ("sign_flip", 6, 3, False, 7),   # Holm over 3 pairs: 3 * 2/2^6 = 0.094
    ("sign_flip", 8, 10, False, 9),  # 5 candidates: 10 pairs
    ("t", 3, 10, True, 2),
])
def test_resolution_floor(test, n, m, possible, needed):
    floor = stats.resolution_floor(test, n, m, 0.05)
    assert floor.possible is possible
    assert floor.seeds_needed == needed
    # independently: the smallest n whose floor, times the family size, reaches the level
    k = next(k for k in range(2, 64) if m * stats.min_p_value(test, k) <= 0.05)
    assert k == needed
    if not possible:
        assert f"at least {needed} seeds" in floor.sentence()


# -- Holm ---------------------------------------------------------------------------------------
def holm_step_down(p: list[float], alpha: float) -> set[int]:
    """Holm (1979) as stated: sort ascending; reject H_(1..k) while p_(j) <= alpha/(m-j+1)."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    rejected = set()
    for j, i in enumerate(order):
        if p[i] > alpha / (len(p) - j):
            break
        rejected.add(i)
    return rejected


@SMALL
@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=12),
       st.sampled_from([0.01, 0.05, 0.1, 0.2]))
def test_holm_rejects_what_the_step_down_procedure_rejects(p, alpha):
    adjusted = stats.holm(p)
    assert {i for i, a in enumerate(adjusted) if a <= alpha} == holm_step_down(p, alpha)
    assert all(a >= x for a, x in zip(adjusted, p, strict=True)) and max(adjusted) <= 1
    # the adjusted values written out: max over the smaller ones of min(1, (m - j) p_(j))
    order = sorted(range(len(p)), key=lambda i: p[i])
    for rank, i in enumerate(order):
        expect = max(min(1.0, (len(p) - j) * p[order[j]]) for j in range(rank + 1))
        assert adjusted[i] == pytest.approx(expect)


def test_holm_leaves_undefined_p_values_out_of_the_family():
    adjusted = stats.holm([0.01, float("nan"), 0.04])
    assert math.isnan(adjusted[1])
    assert adjusted[0] == pytest.approx(0.02) and adjusted[2] == pytest.approx(0.04)


# -- intervals ---------------------------------------------------------------------------------
@SMALL
@given(st.lists(FINITE, min_size=2, max_size=stats.BCA_MIN_N - 1), st.sampled_from([0.8, 0.9, 0.95]))
def test_student_t_interval_below_the_switch(values, confidence):
    arr = np.array(values)
    ci = stats.mean_interval(values, confidence)
    assert ci.method == stats.STUDENT_T and ci.label == f"{confidence:.0%} Student t"
    if arr.std(ddof=1) == 0:  # no spread, or one below float precision
        assert ci.low == ci.high == pytest.approx(arr.mean())
        return
    half = scipy.stats.t.ppf((1 + confidence) / 2, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size)
    assert ci.low == pytest.approx(arr.mean() - half, abs=1e-9)
    assert ci.high == pytest.approx(arr.mean() + half, abs=1e-9)


def efron_bca(x: np.ndarray, confidence: float, resamples: int, seed: int) -> tuple[float, float]:
    """BCa from Efron (1987): bias correction z0 from the share of bootstrap means below the
    estimate, acceleration from the jackknife, adjusted percentiles of the bootstrap means."""
    rng = np.random.default_rng(seed)
    n = x.size
    boot = x[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    theta = x.mean()
    z0 = scipy.stats.norm.ppf(np.mean(boot < theta))
    jack = (x.sum() - x) / (n - 1)
    dev = jack.mean() - jack
    a = (dev**3).sum() / (6 * ((dev**2).sum()) ** 1.5)
    out = []
    for q in ((1 - confidence) / 2, (1 + confidence) / 2):
        z = scipy.stats.norm.ppf(q)
        out.append(np.quantile(boot, scipy.stats.norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))))
    return out[0], out[1]


def test_bca_from_the_switch_matches_efrons_equations():
    x = np.random.default_rng(5).lognormal(0.0, 0.7, size=stats.BCA_MIN_N + 20)  # skewed
    ci = stats.mean_interval(x, 0.95, n_resamples=40_000)
    low, high = efron_bca(x, 0.95, 40_000, seed=9)
    assert ci.method == stats.BCA
    width = high - low
    assert ci.low == pytest.approx(low, abs=0.03 * width)
    assert ci.high == pytest.approx(high, abs=0.03 * width)
    t = stats.mean_interval(x[: stats.BCA_MIN_N - 1])
    assert t.method == stats.STUDENT_T


def test_undefined_intervals():
    assert not stats.mean_interval([0.5]).defined
    assert not stats.mean_interval([0.5, float("nan")]).defined
    with pytest.raises(ValueError):
        stats.mean_interval([1.0, 2.0], 1.5)


# -- comparisons -------------------------------------------------------------------------------
def test_paired_comparison_uses_matched_seeds_only():
    cand = {1: 0.9, 2: 0.8, 3: 0.85, 4: float("nan"), 7: 0.1}
    base = {1: 0.7, 2: 0.75, 3: 0.8, 4: 0.7, 5: 0.7}
    cmp = stats.paired_comparison(cand, base)
    diffs = [0.9 - 0.7, 0.8 - 0.75, 0.85 - 0.8]
    assert cmp.n == 3
    assert cmp.mean_difference == pytest.approx(sum(diffs) / 3)
    assert cmp.relative_difference == pytest.approx((sum(diffs) / 3) / ((0.7 + 0.75 + 0.8) / 3))
    assert cmp.p_value == pytest.approx(brute_force_sign_flip(diffs))
    assert cmp.interval.low <= cmp.mean_difference <= cmp.interval.high
    assert stats.paired_comparison(cand, base, test="t").p_value == pytest.approx(stats.t_p(diffs))


@SMALL
@given(st.lists(st.integers(0, 5).map(float), min_size=1, max_size=8),
       st.lists(st.integers(0, 5).map(float), min_size=1, max_size=8))
def test_probability_of_improvement_counts_pairs(x, y):
    wins = sum((a > b) + 0.5 * (a == b) for a in x for b in y)
    point, ci = stats.probability_of_improvement(x, y, n_resamples=500)
    assert point == pytest.approx(wins / (len(x) * len(y)))
    if len(x) > 1 and len(y) > 1:
        assert 0 <= ci.low <= ci.high <= 1 and ci.method == "percentile bootstrap"


# -- power ---------------------------------------------------------------------------------------
def simulated_power(effect: float, n: int, alpha: float, sims: int = 40_000) -> float:
    d = np.random.default_rng(n).normal(effect, 1.0, size=(sims, n))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
    return float(np.mean(np.abs(t) > scipy.stats.t.ppf(1 - alpha / 2, n - 1)))


@pytest.mark.parametrize(("effect", "n", "alpha"), [(1.0, 5, 0.05), (0.5, 12, 0.05), (1.5, 4, 0.0167)])
def test_t_power_matches_simulation(effect, n, alpha):
    assert stats.t_power(effect, n, alpha) == pytest.approx(simulated_power(effect, n, alpha), abs=0.01)


@pytest.mark.parametrize(("effect", "alpha"), [(1.2, 0.05), (0.6, 0.05), (0.9, 0.0167)])
def test_seeds_to_resolve_is_the_smallest_n_with_the_power(effect, alpha):
    d = np.random.default_rng(1).normal(size=8)
    d = (d - d.mean()) / d.std(ddof=1) + effect  # observed mean `effect`, sd 1
    n = int(stats.seeds_to_resolve(d, alpha, 0.8, test="t"))
    assert simulated_power(effect, n, alpha) >= 0.79
    assert simulated_power(effect, n - 1, alpha) < 0.81
    # the normal approximation is a little optimistic at small n (the t has heavier tails)
    z = scipy.stats.norm.ppf(1 - alpha / 2) + scipy.stats.norm.ppf(0.8)
    assert (z / effect) ** 2 <= n <= (z / effect) ** 2 + 4


def test_seeds_to_resolve_edge_cases():
    assert math.isinf(stats.seeds_to_resolve([0.1, -0.1, 0.0], 0.05))  # no difference
    assert math.isinf(stats.seeds_to_resolve([1.0, -1.0, 0.05], 0.05))  # effect 0.017 sd
    assert math.isnan(stats.seeds_to_resolve([0.3], 0.05))
    # no spread: the sign-flip test's floor decides
    assert stats.seeds_to_resolve([0.2, 0.2, 0.2], 0.05, test="sign_flip") == 6
    # a clear difference: never fewer seeds than the test needs to reach the level
    assert stats.seeds_to_resolve([0.5, 0.52, 0.49], 0.05, test="sign_flip") == 6
    assert stats.seeds_to_resolve([0.5, 0.52, 0.49], 0.05, test="t") < 6
