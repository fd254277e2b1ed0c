"""harness.stats against independent computations: brute-force enumeration, the normal
approximation, hand-computed ranks and an O(n^2) Pareto check."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import pytest

from harness import stats


def brute_force_sign_flip(d: list[float]) -> float:
    """Two-sided p-value by listing every sign pattern with itertools (no numpy tricks)."""
    observed = abs(sum(d) / len(d))
    extreme = total = 0
    for signs in itertools.product((1, -1), repeat=len(d)):
        total += 1
        if abs(sum(s * x for s, x in zip(signs, d, strict=True)) / len(d)) >= observed - 1e-12:
            extreme += 1
    return extreme / total


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_sign_flip_matches_brute_force(n):
    rng = np.random.default_rng(n)
    for _ in range(5):
        d = list(rng.normal(0.3, 1.0, size=n))
        assert stats.sign_flip_test(d) == pytest.approx(brute_force_sign_flip(d), abs=1e-12)


def test_sign_flip_known_values_and_ties():
    # every difference positive: only the all-plus and all-minus patterns are as extreme
    assert stats.sign_flip_test([0.1, 0.2, 0.3, 0.4, 0.5]) == pytest.approx(2 / 32)
    # equal differences: every pattern with the same number of signs ties, none is dropped
    assert stats.sign_flip_test([1.0, 1.0, 1.0]) == pytest.approx(brute_force_sign_flip([1, 1, 1]))
    assert stats.sign_flip_test([0.0, 0.0]) == 1.0
    assert math.isnan(stats.sign_flip_test([]))


def test_sign_flip_monte_carlo_agrees_with_exact():
    d = list(np.random.default_rng(3).normal(0.4, 1.0, size=14))
    exact = stats.sign_flip_test(d)
    approx = stats.sign_flip_test(d, exact_max=0, n_resamples=200_000, seed=1)
    assert approx == pytest.approx(exact, abs=0.005)


def test_bootstrap_matches_normal_approximation_for_large_n():
    x = np.random.default_rng(0).exponential(2.0, size=500)
    low, high = stats.bootstrap_ci(x, 0.95, n_resamples=10_000, seed=5)
    half = 1.959964 * statistics.stdev(x) / math.sqrt(len(x))
    assert low == pytest.approx(x.mean() - half, rel=0.02)
    assert high == pytest.approx(x.mean() + half, rel=0.02)


def test_bootstrap_small_samples():
    values = [0.5, 0.7, 0.6]
    low, high = stats.bootstrap_ci(values, seed=1)
    assert min(values) <= low <= np.mean(values) <= high <= max(values)
    assert stats.bootstrap_ci(values, seed=1) == (low, high)  # seeded: reproducible
    assert all(math.isnan(v) for v in stats.bootstrap_ci([0.5]))
    assert all(math.isnan(v) for v in stats.bootstrap_ci([0.5, float("nan")]))


def test_bootstrap_coverage_is_close_to_nominal():
    rng = np.random.default_rng(11)
    hits = 0
    trials = 300
    for i in range(trials):
        low, high = stats.bootstrap_ci(rng.normal(1.0, 1.0, size=40), n_resamples=2000, seed=i)
        hits += low <= 1.0 <= high
    assert 0.89 <= hits / trials <= 0.98


def test_paired_comparison_uses_matched_seeds_only():
    cand = {1: 0.9, 2: 0.8, 3: 0.85, 4: float("nan"), 7: 0.1}
    base = {1: 0.7, 2: 0.75, 3: 0.8, 4: 0.7, 5: 0.7}
    cmp = stats.paired_comparison(cand, base, seed=0)
    diffs = [0.9 - 0.7, 0.8 - 0.75, 0.85 - 0.8]
    assert cmp.n == 3
    assert cmp.mean_difference == pytest.approx(sum(diffs) / 3)
    assert cmp.p_value == pytest.approx(brute_force_sign_flip(diffs))
    assert cmp.ci[0] <= cmp.mean_difference <= cmp.ci[1]


def test_ranks_by_hand():
    assert stats.ranks([0.5, 0.9, 0.7], maximize=True) == [3.0, 1.0, 2.0]
    assert stats.ranks([0.5, 0.9, 0.7], maximize=False) == [1.0, 3.0, 2.0]
    assert stats.ranks([0.8, 0.9, 0.8, 0.1], maximize=True) == [2.5, 1.0, 2.5, 4.0]
    assert stats.ranks([float("nan"), 0.2, float("nan")], maximize=True) == [2.5, 1.0, 2.5]


def test_pareto_mask_matches_pairwise_dominance():
    rng = np.random.default_rng(2)
    pts = rng.integers(0, 6, size=(25, 2)).astype(float)
    maximize = [True, False]
    mask = stats.pareto_mask(pts.tolist(), maximize)
    for i, p in enumerate(pts):
        dominated = any(
            (q[0] >= p[0] and q[1] <= p[1]) and (q[0] > p[0] or q[1] < p[1]) for q in pts
        )
        assert mask[i] == (not dominated)
    assert stats.pareto_mask([[1.0, float("nan")], [0.5, 1.0]], [True, True]) == [False, True]
