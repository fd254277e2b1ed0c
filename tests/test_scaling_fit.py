"""Scaling-law fits (harness.report.scaling_fit) on synthetic data with known answers: the
exponent and the crossover are recovered from noisy power laws, the fit agrees with
scipy.optimize.curve_fit on clean data, the iso-FLOP profiles recover the optimal-size
exponent of a Chinchilla-form loss, and the bootstrap interval covers the truth at about its
nominal rate over repeated simulations (the full record: benchmarks/scaling_coverage.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import curve_fit

from harness.report import scaling_fit as sf

BUDGETS = np.logspace(12, 16, 5)


def frontier_runs(law: sf.PowerLaw, rng: np.random.Generator, noise: float = 0.01,
                  seeds: int = 3, budgets: np.ndarray = BUDGETS) -> list[sf.Run]:
    """A grid whose iso-FLOP minimum sits at the middle size of every budget with loss L(C):
    a parabola in log N around N* = C^0.5 (multiplicative noise per run)."""
    runs = []
    for c in budgets:
        n_opt = math.sqrt(c)
        for k in (-2, -1, 0, 1, 2):
            n = n_opt * math.exp(0.7 * k)
            truth = float(law(c)) + 0.02 * (0.7 * k) ** 2
            for s in range(seeds):
                runs.append(sf.Run(float(c), n, s, truth * math.exp(rng.normal(0, noise))))
    return runs


def test_the_fit_agrees_with_scipy_curve_fit_on_clean_data():
    truth = sf.PowerLaw(1.7, 900.0, 0.28)
    c = np.logspace(11, 17, 7)
    ours = sf.fit_power_law(c, truth(c))

    def model(logc, E, logA, alpha):
        return E + np.exp(logA - alpha * logc)

    (E, logA, alpha), _ = curve_fit(model, np.log(c), truth(c), p0=(1.0, 5.0, 0.2), maxfev=20000)
    assert ours.alpha == pytest.approx(alpha, rel=1e-4)
    assert pytest.approx(E, rel=1e-4) == ours.E
    assert pytest.approx(math.exp(logA), rel=1e-3) == ours.A
    assert ours.alpha == pytest.approx(0.28, rel=1e-4)  # and both find the truth


def test_the_huber_loss_shrugs_off_an_outlier_that_moves_least_squares():
    truth = sf.PowerLaw(1.5, 300.0, 0.3)
    c = np.logspace(11, 17, 9)
    y = truth(c)
    y[4] *= 1.15  # one broken run
    ours = sf.fit_power_law(c, y)
    (_, _, alpha_ls), _ = curve_fit(lambda x, E, la, a: E + np.exp(la - a * x), np.log(c), y,
                                    p0=(1.0, 5.0, 0.2), maxfev=20000)
    assert abs(ours.alpha - 0.3) < 0.01 < abs(alpha_ls - 0.3)


def test_the_exponent_is_recovered_from_noisy_runs_with_an_interval_around_it():
    truth = sf.PowerLaw(1.6, 4000.0, 0.25)
    fit = sf.fit_candidate("a", frontier_runs(truth, np.random.default_rng(3)), n_boot=200)
    assert fit.alpha.value == pytest.approx(0.25, abs=0.03)
    assert fit.alpha.low < 0.25 < fit.alpha.high
    assert fit.alpha.high - fit.alpha.low < 0.15  # informative, not the whole axis
    assert fit.n_exponent.value == pytest.approx(0.5, abs=0.02)
    assert all(p.bracketed for p in fit.profiles)
    assert "pooled" in fit.residual_source


def test_isoflop_profiles_recover_the_optimal_size_exponent_of_a_chinchilla_loss():
    """L(N, D) = E + A/N^a + B/D^b with D = C/6N: N*(C) grows as C^(b/(a+b)) and the frontier
    loss falls as C^-(ab/(a+b)) (Hoffmann et al. 2022)."""
    E, A, a, B, b = 1.69, 406.4, 0.34, 410.7, 0.28
    rng = np.random.default_rng(0)
    runs = []
    for c in np.logspace(15, 18, 4):
        centre = (a * A / (b * B)) ** (1 / (a + b)) * (c / 6) ** (b / (a + b))
        for f in (0.25, 0.5, 1, 2, 4):
            n = centre * f
            for s in range(3):
                loss = E + A / n**a + B / (c / (6 * n)) ** b
                runs.append(sf.Run(float(c), n, s, loss * math.exp(rng.normal(0, 0.002))))
    fit = sf.fit_candidate("chinchilla", runs, n_boot=100)
    assert fit.n_exponent.value == pytest.approx(b / (a + b), abs=0.02)
    assert fit.alpha.value == pytest.approx(a * b / (a + b), abs=0.02)


def test_a_known_crossover_is_found_inside_its_interval():
    """B starts worse and falls faster: the two laws cross at a known compute."""
    la = sf.PowerLaw(2.0, 30.0, 0.1)
    lb = sf.PowerLaw(1.9, float(30.0 * 1e14 ** -0.1 + 0.1) * 1e14 ** 0.2, 0.2)  # equal at 1e14
    true = next(c for c in np.logspace(12, 18, 60001) if lb(c) < la(c))
    rng = np.random.default_rng(1)
    budgets = np.logspace(12, 16, 5)
    fa = sf.fit_candidate("A", frontier_runs(la, rng, 0.004, budgets=budgets), n_boot=200)
    fb = sf.fit_candidate("B", frontier_runs(lb, rng, 0.004, budgets=budgets), n_boot=200, seed=1)
    cross = sf.crossover(fa, fb)
    assert cross.compute == pytest.approx(true, rel=0.5)
    assert cross.low < true < cross.high
    assert cross.below_after == "B"
    assert cross.share > 0.9
    assert cross.measured and not cross.extrapolated
    assert cross.sentence().startswith("B below A above")


def test_no_crossover_is_said_so_and_a_far_one_is_flagged_as_extrapolated():
    rng = np.random.default_rng(2)
    a = sf.fit_candidate("A", frontier_runs(sf.PowerLaw(2.0, 100.0, 0.2), rng, 0.003), n_boot=60)
    b = sf.fit_candidate("B", frontier_runs(sf.PowerLaw(2.5, 100.0, 0.2), rng, 0.003), n_boot=60)
    none = sf.crossover(a, b)
    assert none.compute is None and "no crossover within the measured range" in none.sentence()
    # crossing at about 1e18 FLOPs, 100x past the largest budget (1e16)
    slow = sf.PowerLaw(2.0, 20.0, 0.1)
    fast = sf.PowerLaw(2.0, 20.0 * 1e18 ** 0.1, 0.2)  # A_s C^-0.1 = A_f C^-0.2 at C = 1e18
    fs = sf.fit_candidate("slow", frontier_runs(slow, rng, 0.0005), n_boot=60)
    ff = sf.fit_candidate("fast", frontier_runs(fast, rng, 0.0005), n_boot=60, seed=3)
    far = sf.crossover(fs, ff)
    assert far.compute is not None and far.compute > 10 * 1e16
    assert far.extrapolated and "WARNING" in far.sentence()


def test_too_few_budgets_or_sizes_is_a_clear_error():
    rng = np.random.default_rng(0)
    runs = frontier_runs(sf.PowerLaw(2.0, 100.0, 0.2), rng, budgets=BUDGETS[:2])
    with pytest.raises(ValueError, match="at least 3 budgets"):
        sf.fit_candidate("x", runs)
    two_sizes = [r for r in frontier_runs(sf.PowerLaw(2.0, 100.0, 0.2), rng)
                 if r.params in {math.sqrt(r.budget), math.sqrt(r.budget) * math.exp(0.7)}]
    with pytest.raises(ValueError, match="at least 3"):
        sf.fit_candidate("x", two_sizes)


def coverage(reps: int, seeds: int, noise: float, n_boot: int, base_seed: int = 0
             ) -> tuple[float, float]:
    """The share of simulations whose alpha interval covers the true alpha, and the mean
    interval half-width over 1.96 divided by the spread of the estimates across simulations
    (about 1 when the interval is as wide as the estimator's sampling error)."""
    truth = sf.PowerLaw(1.6, 4000.0, 0.25)
    hits, estimates, widths = 0, [], []
    for i in range(reps):
        rng = np.random.default_rng(base_seed + i)
        fit = sf.fit_candidate("a", frontier_runs(truth, rng, noise, seeds), n_boot=n_boot, seed=i)
        hits += fit.alpha.low <= 0.25 <= fit.alpha.high
        estimates.append(fit.alpha.value)
        widths.append((fit.alpha.high - fit.alpha.low) / (2 * 1.96))
    return hits / reps, float(np.mean(widths) / np.std(estimates, ddof=1))


@pytest.mark.slow
def test_the_interval_covers_the_true_exponent_at_about_its_nominal_rate():
    """95% intervals over 100 simulated studies (3 seeds a cell, 1% noise a run): coverage
    within binomial noise of nominal (sd about 2 points), never the 70s of a naive bootstrap,
    and not bought by width: the intervals are about as wide as the estimates' spread."""
    covered, width = coverage(100, seeds=3, noise=0.01, n_boot=200)
    assert covered >= 0.87
    assert 0.75 <= width <= 1.4


def test_a_few_replicated_cells_do_not_narrow_the_intervals():
    """Uneven grids (the issue behind the residual bootstrap over every run): one seed a
    cell, except four cells run twice with identical losses (zero spread). Pooling only the
    replicated cells' residuals gave intervals of zero width; every run's residual from the
    iso-FLOP parabolas keeps them as wide as with one seed everywhere."""
    truth = sf.PowerLaw(1.6, 4000.0, 0.25)
    single = frontier_runs(truth, np.random.default_rng(5), noise=0.01, seeds=1)
    twice = single + [sf.Run(r.budget, r.params, 1, r.loss) for r in single[::6]]
    widths = []
    for runs in (single, twice):
        fit = sf.fit_candidate("u", runs, n_boot=80, seed=2)
        widths.append(fit.alpha.high - fit.alpha.low)
        assert fit.alpha.low < 0.25 < fit.alpha.high
    assert widths[1] > 0.7 * widths[0]
    assert "all 30 runs" in sf.fit_candidate("u", twice, n_boot=2).residual_source
