"""Scaling-law fits with intervals: the numbers behind a scaling study's report.

Pure numerics on numpy and scipy (no stores, no torch), so they are tested on synthetic data
(``tests/test_scaling_fit.py``) and their interval coverage measured
(``benchmarks/scaling_coverage.py``, recorded in ``benchmarks/scaling_coverage.md``).

* :func:`fit_power_law`: L(C) = E + A·C^(-alpha), fitted as Besiroglu et al. 2024 ("Chinchilla
  Scaling: A replication attempt", arXiv:2404.10102) refit Hoffmann et al. 2022: the Huber
  loss (delta = 1e-3) of the residuals in log space, log L_hat = logsumexp(log A - alpha·log C,
  log E), minimised by L-BFGS-B from a grid of initialisations (the best end point wins).
  The compute axis is centred on the geometric mean of the budgets for the optimiser's sake.
* :func:`fit_isoflop`: Chinchilla's approach 2: at one budget, the loss as a parabola in
  log N (parameters); its vertex is the compute-optimal size N*(C) and its value the
  frontier loss L*(C). A vertex outside the measured sizes (or a parabola open downwards) is
  *not bracketed*: the smallest measured loss stands in and the report says so.
* :func:`fit_candidate`: per candidate, the iso-FLOP profiles at every budget, the frontier
  L*(C) fitted by :func:`fit_power_law`, and N*(C) = G·C^a by least squares in log-log;
  intervals from a residual bootstrap in which every run counts once, whether its cell has
  one seed or three: each run's log residual from its budget's iso-FLOP parabola (fitted to
  the cells' means), pooled and scaled by sqrt(R/(R - 3·budgets)) (R runs; 3 coefficients a
  parabola), redraws every cell as the parabola's value times the mean of as many resampled
  residuals as the cell has runs, then everything is refitted. (Until 2026-11-26 only the
  replicated cells' residuals were pooled: a grid where a few cells had two seeds and the
  rest one got intervals far too narrow; ``benchmarks/scaling_coverage.md``, uneven grids.)
  With no residual degrees of freedom (3 sizes a budget, one seed a cell) the frontier fit's
  residuals are resampled instead, and the N*(C) exponent then has no interval.
* approach 3 (:mod:`.scaling_surface`): with ``surface=True`` the loss surface L(N, D) fitted
  to every run, N*(C) and D*(C) with intervals (a bootstrap over cells).
* :func:`crossover`: the compute at which one candidate's fitted frontier falls below
  another's, with its percentile interval over paired bootstrap replicates, or none within
  the range searched; flagged when it lies more than :data:`EXTRAPOLATION_LIMIT` times past
  the largest budget measured.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from harness.report.scaling_surface import SurfaceFit, fit_with_intervals

#: Huber threshold on log residuals (Hoffmann et al. 2022; Besiroglu et al. 2024).
HUBER_DELTA = 1e-3
#: A prediction this many times past the largest budget measured is an extrapolation warned of.
EXTRAPOLATION_LIMIT = 10.0
#: Crossovers are searched up to this many times the largest budget.
SEARCH_LIMIT = 1e3
#: Bootstrap replicates of a fit.
N_BOOT = 400
#: The initialisation grid: exponents, E as a share of the smallest loss, A·C_ref^-alpha as a
#: share of the mean loss.
ALPHA_GRID = (0.05, 0.15, 0.3, 0.6, 1.2)
E_GRID = (0.05, 0.3, 0.6, 0.9)
A_GRID = (0.05, 0.2, 0.5, 1.0)


# -- L(C) = E + A C^-alpha -----------------------------------------------------------------
@dataclass(frozen=True)
class PowerLaw:
    """L(C) = E + A·C^(-alpha)."""

    E: float
    A: float
    alpha: float

    def __call__(self, compute: float | np.ndarray) -> np.ndarray:
        c = np.asarray(compute, dtype=np.float64)
        return self.E + self.A * np.exp(-self.alpha * np.log(c))

    def log_loss(self, compute: float | np.ndarray) -> np.ndarray:
        x = np.log(np.asarray(compute, dtype=np.float64))
        with np.errstate(divide="ignore"):
            return np.logaddexp(math.log(self.A) - self.alpha * x if self.A > 0 else -np.inf,
                                math.log(self.E) if self.E > 0 else -np.inf)


def _huber(r: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Huber loss of each residual and its derivative."""
    a = np.abs(r)
    small = a <= delta
    loss = np.where(small, 0.5 * r * r, delta * (a - 0.5 * delta))
    grad = np.where(small, r, delta * np.sign(r))
    return loss, grad


def _objective(theta: np.ndarray, x: np.ndarray, y: np.ndarray, delta: float
               ) -> tuple[float, np.ndarray]:
    """Huber loss of log residuals; theta = (log E, log A', alpha) with x = log C - log C_ref."""
    e, a, alpha = theta
    u = a - alpha * x
    s = np.logaddexp(u, e)
    wu, we = np.exp(u - s), np.exp(e - s)
    loss, g = _huber(s - y, delta)
    grad = np.array([np.sum(g * we), np.sum(g * wu), np.sum(-g * wu * x)])
    return float(np.sum(loss)), grad


def _minimise(start: Sequence[float], x: np.ndarray, y: np.ndarray, delta: float
              ) -> tuple[float, np.ndarray]:
    from scipy.optimize import minimize

    bounds = [(-30.0, float(y.max()) + 1.0), (-30.0, float(y.max()) + 5.0), (1e-4, 5.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = minimize(_objective, np.asarray(start, dtype=np.float64), args=(x, y, delta),
                       jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-12})
    return float(res.fun), res.x


def fit_power_law(compute: Sequence[float] | np.ndarray, loss: Sequence[float] | np.ndarray, *,
                  delta: float = HUBER_DELTA, start: PowerLaw | None = None) -> PowerLaw:
    """L(C) = E + A·C^-alpha by the Huber loss of log residuals (see module). ``start``: a
    previous fit to start from alone (bootstrap replicates) instead of the grid."""
    c = np.asarray(compute, dtype=np.float64)
    L = np.asarray(loss, dtype=np.float64)
    if c.shape != L.shape or c.size < 3:
        raise ValueError(f"a power-law fit needs at least 3 (compute, loss) points, got {c.size}")
    if np.any(c <= 0) or np.any(L <= 0) or not np.all(np.isfinite(L)):
        raise ValueError("compute and loss must be positive and finite")
    ref = float(np.exp(np.mean(np.log(c))))
    x, y = np.log(c) - math.log(ref), np.log(L)
    if start is not None:
        starts = [(math.log(max(start.E, 1e-12)),
                   math.log(max(start.A, 1e-300)) - start.alpha * math.log(ref), start.alpha)]
    else:
        starts = [(math.log(fe * L.min()), math.log(fa * L.mean()), al)
                  for al in ALPHA_GRID for fe in E_GRID for fa in A_GRID]
    best: tuple[float, np.ndarray] | None = None
    for s in starts:
        found = _minimise(s, x, y, delta)
        if best is None or found[0] < best[0]:
            best = found
    assert best is not None
    e, a, alpha = best[1]
    return PowerLaw(float(math.exp(e)), float(math.exp(a + alpha * math.log(ref))), float(alpha))


# -- iso-FLOP profiles (approach 2) -------------------------------------------------------
@dataclass(frozen=True)
class IsoFlop:
    """One budget's profile: loss = c0 + c1·log N + c2·(log N)^2 and its minimum."""

    budget: float
    coefficients: tuple[float, float, float]  # c0, c1, c2
    n_opt: float  # the compute-optimal parameter count (the best measured one if not bracketed)
    loss_opt: float
    bracketed: bool  # the vertex lies within the sizes measured and the parabola opens upwards

    def __call__(self, params: float | np.ndarray) -> np.ndarray:
        z = np.log(np.asarray(params, dtype=np.float64))
        c0, c1, c2 = self.coefficients
        return c0 + c1 * z + c2 * z * z


def fit_isoflop(budget: float, params: Sequence[float] | np.ndarray,
                loss: Sequence[float] | np.ndarray) -> IsoFlop:
    """The parabola in log N through one budget's (size, mean loss) points (least squares;
    at least 3 sizes)."""
    n = np.asarray(params, dtype=np.float64)
    L = np.asarray(loss, dtype=np.float64)
    if n.size < 3 or np.unique(n).size < 3:
        raise ValueError(f"an iso-FLOP profile needs at least 3 sizes, got {np.unique(n).size}")
    z = np.log(n)
    c2, c1, c0 = np.polyfit(z, L, 2)
    best = int(np.argmin(L))
    if c2 > 0:
        vertex = -c1 / (2 * c2)
        if z.min() <= vertex <= z.max():
            return IsoFlop(float(budget), (float(c0), float(c1), float(c2)), float(math.exp(vertex)),
                           float(c0 + c1 * vertex + c2 * vertex * vertex), True)
    return IsoFlop(float(budget), (float(c0), float(c1), float(c2)), float(n[best]), float(L[best]),
                   False)


# -- observations and a candidate's fit ---------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One finished run of a scaling study."""

    budget: float  # the compute budget it was given (FLOPs, or tokens)
    params: float  # its size (parameter count)
    seed: int
    loss: float
    compute: float | None = None  # the compute it realised (None: not measured)
    tokens: float | None = None  # the tokens it trained (None: from the budget, see tokens_of)


def tokens_of(run: Run, unit: str) -> float:
    """The training tokens D of a run: measured, else its token budget, else C / 6N."""
    if run.tokens is not None and run.tokens > 0:
        return float(run.tokens)
    return float(run.budget) if unit == "tokens" else float(run.budget) / (6.0 * run.params)


def cells(runs: Iterable[Run]) -> dict[tuple[float, float], list[float]]:
    """The losses of each (budget, size) cell."""
    out: dict[tuple[float, float], list[float]] = {}
    for r in runs:
        if math.isfinite(r.loss) and r.loss > 0:
            out.setdefault((r.budget, r.params), []).append(r.loss)
    return out


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its percentile bootstrap interval."""

    value: float
    low: float
    high: float
    confidence: float
    replicates: int  # bootstrap replicates that produced a value

    @property
    def defined(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


def _estimate(value: float, samples: Sequence[float], confidence: float) -> Estimate:
    arr = np.asarray([s for s in samples if math.isfinite(s)], dtype=np.float64)
    if arr.size < 2:
        return Estimate(value, math.nan, math.nan, confidence, int(arr.size))
    q = (1 - confidence) / 2
    return Estimate(value, float(np.quantile(arr, q)), float(np.quantile(arr, 1 - q)), confidence,
                    int(arr.size))


@dataclass
class CandidateFit:
    """A candidate's scaling fit (see :func:`fit_candidate`)."""

    name: str
    budgets: list[float]
    profiles: list[IsoFlop]
    law: PowerLaw  # L*(C) on the frontier
    E: Estimate
    A: Estimate
    alpha: Estimate
    n_exponent: Estimate  # a in N*(C) = G C^a
    n_coefficient: float  # G
    replicates: list[PowerLaw] = field(default_factory=list)
    residual_source: str = ""  # what the bootstrap resampled
    notes: list[str] = field(default_factory=list)
    surface: SurfaceFit | None = None  # approach 3 (None: not asked for, or not fittable)

    def band(self, compute: np.ndarray, confidence: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The pointwise percentile band of the fitted L(C) over the bootstrap replicates."""
        conf = self.alpha.confidence if confidence is None else confidence
        if len(self.replicates) < 2:
            nan = np.full(np.shape(compute), np.nan)
            return nan, nan
        curves = np.array([law(compute) for law in self.replicates])
        q = (1 - conf) / 2
        return np.quantile(curves, q, axis=0), np.quantile(curves, 1 - q, axis=0)

    @property
    def largest_budget(self) -> float:
        return max(self.budgets)

    @property
    def smallest_budget(self) -> float:
        return min(self.budgets)


def _frontier(grid: dict[tuple[float, float], float]) -> tuple[list[float], list[IsoFlop]]:
    budgets = sorted({b for b, _ in grid})
    profiles = []
    for b in budgets:
        sizes = sorted(n for bb, n in grid if bb == b)
        profiles.append(fit_isoflop(b, sizes, [grid[(b, n)] for n in sizes]))
    return budgets, profiles


def _n_law(profiles: Sequence[IsoFlop]) -> tuple[float, float]:
    """a and G of N*(C) = G C^a (least squares in log-log)."""
    x = np.log([p.budget for p in profiles])
    y = np.log([p.n_opt for p in profiles])
    a, g = np.polyfit(x, y, 1)
    return float(a), float(math.exp(g))


def check_design(runs: Sequence[Run]) -> None:
    """At least 3 budgets, each with at least 3 sizes (else ValueError saying which)."""
    grid = cells(runs)
    budgets = sorted({b for b, _ in grid})
    if len(budgets) < 3:
        raise ValueError(f"a scaling fit needs at least 3 budgets with results, got {len(budgets)}")
    for b in budgets:
        sizes = {n for bb, n in grid if bb == b}
        if len(sizes) < 3:
            raise ValueError(f"budget {b:.3g} has results at {len(sizes)} size(s); an iso-FLOP "
                             f"profile needs at least 3")


def fit_candidate(name: str, runs: Sequence[Run], *, confidence: float = 0.95,
                  n_boot: int = N_BOOT, seed: int = 0, surface: bool = False,
                  unit: str = "flops") -> CandidateFit:
    """The candidate's iso-FLOP profiles, frontier fit and N*(C) law, with bootstrap
    intervals (see module); with ``surface`` also approach 3 (``unit``: what the budgets
    count, for the runs' tokens: :func:`tokens_of`). Needs at least 3 budgets with 3 sizes
    each."""
    check_design(runs)
    grid = cells(runs)
    means = {k: float(np.mean(v)) for k, v in grid.items()}
    budgets, profiles = _frontier(means)
    law = fit_power_law([p.budget for p in profiles], [p.loss_opt for p in profiles])
    a, g = _n_law(profiles)
    rng = np.random.default_rng(seed)
    keys = sorted(grid)
    notes = []
    by_budget = {p.budget: p for p in profiles}
    fitted_cells = {k: float(by_budget[k[0]](k[1])) for k in keys}
    # every run's log residual from its budget's parabola, replicated cells and single ones alike
    res = np.array([math.log(v) - math.log(fitted_cells[k]) for k in keys for v in grid[k]]
                   if all(f > 0 for f in fitted_cells.values()) else [])
    dof = res.size - 3 * len(profiles)
    replicated = sum(len(v) > 1 for v in grid.values())
    pooled = dof > 0
    if pooled:
        pool = res * math.sqrt(res.size / dof)
        source = (f"log residuals of all {res.size} runs from the iso-FLOP parabolas, pooled "
                  f"({len(keys)} cells, {replicated} with several seeds; {dof} degrees of freedom)")
    else:
        fitted = law.log_loss(np.array([p.budget for p in profiles]))
        res = np.log([p.loss_opt for p in profiles]) - fitted
        pool = res * math.sqrt(len(res) / max(len(res) - 3, 1))
        source = "residuals of the frontier fit (no cell has two seeds, 3 sizes a budget)"
        notes.append("one seed per (size, budget) and 3 sizes a budget: the intervals rest on "
                     "the frontier fit's residuals alone, and the N*(C) exponent has none")
    reps: list[PowerLaw] = []
    alphas, es, as_, ns = [], [], [], []
    for _ in range(n_boot):
        if pooled:
            sample = {}
            for k in keys:
                draw = rng.choice(pool, size=len(grid[k]), replace=True)
                sample[k] = float(np.mean(np.exp(math.log(fitted_cells[k]) + draw)))
            try:
                _, profs = _frontier(sample)
                rep = fit_power_law([p.budget for p in profs], [p.loss_opt for p in profs],
                                    start=law)
                ra, _ = _n_law(profs)
            except (ValueError, np.linalg.LinAlgError):
                continue
        else:
            draw = rng.choice(pool, size=len(profiles), replace=True)
            ys = np.exp(law.log_loss(np.array(budgets)) + draw)
            try:
                rep = fit_power_law(budgets, ys, start=law)
            except ValueError:
                continue
            ra = a
        reps.append(rep)
        alphas.append(rep.alpha)
        es.append(rep.E)
        as_.append(rep.A)
        ns.append(ra)
    if sum(not p.bracketed for p in profiles):
        edge = [f"{p.budget:.3g}" for p in profiles if not p.bracketed]
        notes.append(f"the optimal size is not bracketed at budget(s) {', '.join(edge)}: the best "
                     f"measured size stands in (add sizes beyond it)")
    fit = CandidateFit(name, budgets, profiles, law, _estimate(law.E, es, confidence),
                       _estimate(law.A, as_, confidence), _estimate(law.alpha, alphas, confidence),
                       _estimate(a, ns, confidence), g, reps, source, notes)
    if surface:
        kept = [r for r in runs if math.isfinite(r.loss) and r.loss > 0]
        try:
            fit.surface = fit_with_intervals([r.params for r in kept], [tokens_of(r, unit) for r in kept],
                                             [r.loss for r in kept], confidence=confidence,
                                             n_boot=n_boot, seed=seed)
        except ValueError as exc:
            fit.notes.append(f"no loss-surface fit (approach 3): {exc}")
    return fit


# -- crossovers ----------------------------------------------------------------------------
def _first_crossing(a: PowerLaw, b: PowerLaw, low: float, high: float) -> float | None:
    """The smallest compute in [low, high] where the two laws cross (None if they do not)."""
    from scipy.optimize import brentq

    xs = np.linspace(math.log(low), math.log(high), 400)
    d = a.log_loss(np.exp(xs)) - b.log_loss(np.exp(xs))
    signs = np.sign(d)
    for i in range(len(xs) - 1):
        if signs[i] == 0:
            return float(math.exp(xs[i]))
        if signs[i] != signs[i + 1]:
            def f(x: float) -> float:
                return float(a.log_loss(math.exp(x)) - b.log_loss(math.exp(x)))
            return float(math.exp(brentq(f, xs[i], xs[i + 1])))
    return None


@dataclass(frozen=True)
class Crossover:
    """Where candidate ``b``'s frontier falls below (or rises above) ``a``'s."""

    a: str
    b: str
    compute: float | None  # None: no crossing within [smallest budget, SEARCH_LIMIT x largest]
    low: float
    high: float
    share: float  # the share of bootstrap replicate pairs that cross within the same range
    below_after: str | None  # which candidate is lower above the crossing
    largest_budget: float
    confidence: float

    @property
    def extrapolated(self) -> bool:
        return self.compute is not None and self.compute > EXTRAPOLATION_LIMIT * self.largest_budget

    @property
    def measured(self) -> bool:
        return self.compute is not None and self.compute <= self.largest_budget

    def sentence(self) -> str:
        if self.compute is None:
            return (f"{self.a} and {self.b}: no crossover within the measured range"
                    f" (nor predicted up to {SEARCH_LIMIT:.0e}x the largest budget; "
                    f"{self.share:.0%} of bootstrap replicates cross there)")
        above = self.below_after
        other = self.a if above == self.b else self.b
        interval = (f"[{self.low:.2g}, {self.high:.2g}]" if math.isfinite(self.low)
                    else "[interval undefined]")
        where = ("within the measured range" if self.measured
                 else "extrapolated" + (f" {self.compute / self.largest_budget:.0f}x past the "
                                        f"largest budget: WARNING, beyond "
                                        f"{EXTRAPOLATION_LIMIT:.0f}x" if self.extrapolated else ""))
        return (f"{above} below {other} above {self.compute:.2g} FLOPs {interval} "
                f"({where}; {self.share:.0%} of bootstrap replicates cross)")


def crossover(fa: CandidateFit, fb: CandidateFit, *, confidence: float = 0.95) -> Crossover:
    """The first crossing of the two fitted frontiers from the smallest budget measured up to
    :data:`SEARCH_LIMIT` times the largest, with the percentile interval of the crossings of
    paired bootstrap replicates (replicates that do not cross are left out and counted in
    ``share``)."""
    low = min(fa.smallest_budget, fb.smallest_budget)
    largest = max(fa.largest_budget, fb.largest_budget)
    high = SEARCH_LIMIT * largest
    point = _first_crossing(fa.law, fb.law, low, high)
    pairs = list(zip(fa.replicates, fb.replicates, strict=False))
    found = [c for c in (_first_crossing(ra, rb, low, high) for ra, rb in pairs) if c is not None]
    share = len(found) / len(pairs) if pairs else math.nan
    below = None
    if point is not None:
        probe = min(point * 1.5, high)
        below = fb.name if float(fb.law(probe)) < float(fa.law(probe)) else fa.name
    if point is None or len(found) < 2:
        lo = hi = math.nan
    else:
        q = (1 - confidence) / 2
        logs = np.log(found)
        lo, hi = float(np.exp(np.quantile(logs, q))), float(np.exp(np.quantile(logs, 1 - q)))
    return Crossover(fa.name, fb.name, point, lo, hi, share, below, largest, confidence)
