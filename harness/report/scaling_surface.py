"""Chinchilla's approach 3: the loss surface L(N, D) = E + A/N^alpha + B/D^beta fitted to every
run, and the compute-optimal split it implies.

Fitted as Besiroglu et al. 2024 ("Chinchilla Scaling: A replication attempt",
arXiv:2404.10102) refit Hoffmann et al. 2022: log L_hat = logsumexp(log A - alpha·log N,
log B - beta·log D, log E), the Huber loss (delta = 1e-3) of log L_hat - log L summed over the
runs, minimised by L-BFGS-B from a grid of 108 initialisations (each runs 40 steps, the 8
best then run to convergence, the best end point wins; on Chinchilla's data this reaches the
optimum of the replication's 4,500-start search); the axes are centred on the geometric means
of N and D for the optimiser's sake. Intervals:
percentile bootstrap over *cells* (the distinct (N, D) points, each carrying all its seeds:
a cell run three times and a cell run once are one draw each), each replicate refitted from
the point estimate.

Minimising L subject to C = 6ND gives N*(C) = G·(C/6)^a and D*(C) = (C/6)^b / G with
a = beta/(alpha+beta), b = alpha/(alpha+beta), G = (alpha·A / (beta·B))^(1/(alpha+beta))
(Hoffmann et al. 2022, eq. 4).

Checked on the data Besiroglu et al. extracted from Hoffmann et al.'s figure 4
(``tests/data/chinchilla/``): their published estimates fall inside the intervals
(``tests/test_scaling_surface.py``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import product

import numpy as np

#: Huber threshold on log residuals (Hoffmann et al. 2022; Besiroglu et al. 2024).
HUBER_DELTA = 1e-3
#: The initialisation grid: exponents, E as a share of the smallest loss, the A and B terms at
#: the centre as shares of the mean loss (3 x 3 x 3 x 2 x 2 = 108 starts).
EXPONENT_GRID = (0.15, 0.4, 1.0)
E_GRID = (0.1, 0.5, 0.9)
TERM_GRID = (0.1, 0.4)
#: Every start runs this many L-BFGS steps; the best POLISHED end points then run to convergence.
ROUGH_ITERATIONS = 40
POLISHED = 8
#: Where the fit searches alpha and beta; an exponent left at either end is not identified.
EXPONENT_BOUNDS = (1e-3, 5.0)


@dataclass(frozen=True)
class Surface:
    """L(N, D) = E + A/N^alpha + B/D^beta."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float

    def __call__(self, n: float | np.ndarray, d: float | np.ndarray) -> np.ndarray:
        return np.exp(self.log_loss(n, d))

    def log_loss(self, n: float | np.ndarray, d: float | np.ndarray) -> np.ndarray:
        ln, ld = np.log(np.asarray(n, dtype=np.float64)), np.log(np.asarray(d, dtype=np.float64))
        return np.logaddexp(np.logaddexp(math.log(self.A) - self.alpha * ln,
                                         math.log(self.B) - self.beta * ld), math.log(self.E))

    @property
    def a(self) -> float:
        """The exponent of N*(C) ∝ C^a."""
        return self.beta / (self.alpha + self.beta)

    @property
    def b(self) -> float:
        """The exponent of D*(C) ∝ C^b."""
        return self.alpha / (self.alpha + self.beta)

    @property
    def log_G(self) -> float:  # noqa: N802 (the paper's name)
        """log G, computed in logs: where an exponent is near 0, G itself is far beyond a float."""
        return ((math.log(self.alpha) + math.log(self.A) - math.log(self.beta) - math.log(self.B))
                / (self.alpha + self.beta))

    @property
    def G(self) -> float:  # noqa: N802 (the paper's name)
        with np.errstate(over="ignore"):
            return float(np.exp(self.log_G))

    def at_bound(self) -> list[str]:
        """The exponents the fit left at a bound of its search (``EXPONENT_BOUNDS``): there the
        runs do not identify them, nor the compute-optimal split that divides by them."""
        return [name for name in ("alpha", "beta")
                if any(math.isclose(getattr(self, name), b, rel_tol=1e-6) for b in EXPONENT_BOUNDS)]

    def _opt(self, compute: float | np.ndarray, exponent: float, sign: float) -> np.ndarray:
        with np.errstate(over="ignore", under="ignore"):
            return np.exp(sign * self.log_G + exponent * np.log(np.asarray(compute, dtype=np.float64) / 6))

    def n_opt(self, compute: float | np.ndarray) -> np.ndarray:
        """The compute-optimal parameters at compute C = 6ND (inf or 0 where G is beyond a float)."""
        return self._opt(compute, self.a, 1.0)

    def d_opt(self, compute: float | np.ndarray) -> np.ndarray:
        """The compute-optimal training tokens at compute C = 6ND."""
        return self._opt(compute, self.b, -1.0)


def _objective(theta: np.ndarray, x: np.ndarray, y: np.ndarray, z: np.ndarray, delta: float
               ) -> tuple[float, np.ndarray]:
    """Huber loss of log residuals and its gradient; theta = (log E, log A', log B', alpha,
    beta) on centred axes x = log N - x0, y = log D - y0; z = log L."""
    e, a, b, alpha, beta = theta
    u, v = a - alpha * x, b - beta * y
    s = np.logaddexp(np.logaddexp(u, v), e)
    wu, wv, we = np.exp(u - s), np.exp(v - s), np.exp(e - s)
    r = s - z
    small = np.abs(r) <= delta
    loss = np.where(small, 0.5 * r * r, delta * (np.abs(r) - 0.5 * delta))
    g = np.where(small, r, delta * np.sign(r))
    grad = np.array([np.sum(g * we), np.sum(g * wu), np.sum(g * wv), -np.sum(g * wu * x),
                     -np.sum(g * wv * y)])
    return float(np.sum(loss)), grad


def huber_objective(surface: Surface, n: Sequence[float] | np.ndarray, d: Sequence[float] | np.ndarray,
                    loss: Sequence[float] | np.ndarray, delta: float = HUBER_DELTA) -> float:
    """The summed Huber loss of a surface's log residuals on some runs (what the fit minimises)."""
    r = surface.log_loss(np.asarray(n), np.asarray(d)) - np.log(np.asarray(loss, dtype=np.float64))
    a = np.abs(r)
    return float(np.sum(np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))))


def fit_surface(n: Sequence[float] | np.ndarray, d: Sequence[float] | np.ndarray,
                loss: Sequence[float] | np.ndarray, *, delta: float = HUBER_DELTA,
                start: Surface | None = None) -> Surface:
    """L(N, D) by the Huber loss of log residuals from the grid of initialisations (or from
    ``start`` alone: bootstrap replicates). At least 6 runs at 3 or more distinct N and D."""
    from scipy.optimize import minimize

    N, D, L = (np.asarray(v, dtype=np.float64) for v in (n, d, loss))
    if not (N.shape == D.shape == L.shape) or N.size < 6:
        raise ValueError(f"a loss-surface fit needs at least 6 (N, D, loss) runs, got {N.size}")
    if np.any(N <= 0) or np.any(D <= 0) or np.any(L <= 0) or not np.all(np.isfinite(L)):
        raise ValueError("parameters, tokens and losses must be positive and finite")
    if np.unique(N).size < 3 or np.unique(D).size < 3:
        raise ValueError("a loss-surface fit needs at least 3 distinct sizes and 3 distinct token counts")
    x0, y0 = float(np.mean(np.log(N))), float(np.mean(np.log(D)))
    x, y, z = np.log(N) - x0, np.log(D) - y0, np.log(L)
    if start is not None:  # from the point fit, and with E at half the lowest loss: where the
        # point put E near 0, its gradient in log E vanishes and a replicate could never leave it
        e_starts = {math.log(start.E), math.log(0.5 * float(L.min()))}
        starts = [(e, math.log(start.A) - start.alpha * x0, math.log(start.B) - start.beta * y0,
                   start.alpha, start.beta) for e in sorted(e_starts)]
    else:
        lo, mean = float(L.min()), float(L.mean())
        starts = [(math.log(fe * lo), math.log(fa * mean), math.log(fb * mean), al, be)
                  for al, be, fe, fa, fb in product(EXPONENT_GRID, EXPONENT_GRID, E_GRID, TERM_GRID,
                                                    TERM_GRID)]
    top = float(z.max()) + 5.0
    bounds = [(-30.0, top), (-30.0, top), (-30.0, top), EXPONENT_BOUNDS, EXPONENT_BOUNDS]

    def run(s: Sequence[float] | np.ndarray, iterations: int) -> tuple[float, np.ndarray]:
        res = minimize(_objective, np.asarray(s, dtype=np.float64), args=(x, y, z, delta),
                       jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": iterations, "ftol": 1e-15, "gtol": 1e-12})
        return float(res.fun), res.x

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # every start a few dozen steps, then the most promising end points to convergence
        rough = sorted((run(s, ROUGH_ITERATIONS) for s in starts), key=lambda r: r[0])
        best = min((run(r[1], 3000) for r in rough[:POLISHED]), key=lambda r: r[0])
    e, a, b, alpha, beta = (float(v) for v in best[1])
    return Surface(math.exp(e), math.exp(a + alpha * x0), math.exp(b + beta * y0), alpha, beta)


@dataclass(frozen=True)
class Interval:
    """A point estimate with its percentile bootstrap interval."""

    value: float
    low: float
    high: float

    @property
    def defined(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def covers(self, x: float) -> bool:
        return self.defined and self.low <= x <= self.high


def _interval(value: float, samples: Sequence[float], confidence: float) -> Interval:
    arr = np.asarray([s for s in samples if math.isfinite(s)], dtype=np.float64)
    if arr.size < 2:
        return Interval(value, math.nan, math.nan)
    q = (1 - confidence) / 2
    return Interval(value, float(np.quantile(arr, q)), float(np.quantile(arr, 1 - q)))


@dataclass
class SurfaceFit:
    """A loss surface with bootstrap intervals (see :func:`fit_with_intervals`)."""

    surface: Surface
    E: Interval
    A: Interval
    B: Interval
    alpha: Interval
    beta: Interval
    a: Interval  # N*(C) ∝ C^a
    runs: int
    cells: int
    confidence: float
    replicates: list[Surface] = field(default_factory=list)
    largest_compute: float = math.nan  # the largest 6ND among the runs fitted
    lowest_loss: float = math.nan  # the lowest loss among the runs fitted

    @property
    def e_identified(self) -> bool:
        """False when the fit puts the irreducible loss E at about 0 (below a thousandth of the
        lowest loss): the runs show no floor, so E and its interval say nothing."""
        return 1e-3 * self.lowest_loss <= self.surface.E

    def optimum(self, compute: float) -> tuple[Interval, Interval]:
        """N*(C) and D*(C) at compute C = 6ND with their percentile intervals (all NaN when an
        exponent sits at its bound: :meth:`Surface.at_bound`)."""
        if self.surface.at_bound():
            return Interval(math.nan, math.nan, math.nan), Interval(math.nan, math.nan, math.nan)
        q = (1 - self.confidence) / 2
        out = []
        for f in (Surface.n_opt, Surface.d_opt):
            value = float(f(self.surface, compute))
            reps = np.array([math.nan if r.at_bound() else float(f(r, compute))
                             for r in self.replicates])
            # replicates whose own optimum is undefined are dropped, unless there are so many
            # that the interval's tails would be theirs
            ok = reps[np.isfinite(reps)]
            enough = ok.size >= 2 and reps.size - ok.size <= (1 - self.confidence) * reps.size
            out.append(Interval(value, float(np.quantile(ok, q)), float(np.quantile(ok, 1 - q)))
                       if enough else Interval(value, math.nan, math.nan))
        return out[0], out[1]


def fit_with_intervals(n: Sequence[float], d: Sequence[float], loss: Sequence[float], *,
                       confidence: float = 0.95, n_boot: int = 400, seed: int = 0,
                       delta: float = HUBER_DELTA) -> SurfaceFit:
    """:func:`fit_surface` on every run, with percentile intervals from a bootstrap over cells
    (distinct (N, D) points; all runs of a drawn cell enter the replicate's fit)."""
    N, D, L = (np.asarray(v, dtype=np.float64) for v in (n, d, loss))
    point = fit_surface(N, D, L, delta=delta)
    groups: dict[tuple[float, float], list[int]] = {}
    for i, key in enumerate(zip(N.tolist(), D.tolist(), strict=True)):
        groups.setdefault(key, []).append(i)
    members = list(groups.values())
    rng = np.random.default_rng(seed)
    reps: list[Surface] = []
    for _ in range(n_boot):
        rows = np.concatenate([members[j] for j in rng.integers(0, len(members), len(members))])
        try:
            reps.append(fit_surface(N[rows], D[rows], L[rows], delta=delta, start=point))
        except ValueError:
            continue

    def iv(get: str | None, value: float) -> Interval:
        return _interval(value, [getattr(r, get) for r in reps] if get else [], confidence)

    return SurfaceFit(point, iv("E", point.E), iv("A", point.A), iv("B", point.B),
                      iv("alpha", point.alpha), iv("beta", point.beta), iv("a", point.a),
                      int(N.size), len(members), confidence, reps, float(np.max(6 * N * D)),
                      float(L.min()))
