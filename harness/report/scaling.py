"""The compute sections of a study's report: each run's realised compute against its budget,
and for a scaling study the fits (:mod:`.scaling_fit`), crossovers, figures and exports.

* :func:`compute_rows`: every confirmation run of a compute-budgeted study (``budget.flops``
  or ``tokens``, or a scaling study): budget, realised compute (``cost/train_flops`` =
  FLOPs per token counted on one step x training tokens; or ``cost/train_tokens``) and the
  deviation, flagged past :data:`COMPUTE_TOLERANCE`.
* :func:`analyse`: per base candidate of a scaling study, :func:`.scaling_fit.fit_candidate`
  over its confirmation runs (loss = the objective, size = ``cost/params``, budget = the
  cell's, tokens = ``cost/train_tokens``), approach 3's loss surface included
  (:mod:`.scaling_surface`), and the crossover of every pair of candidates.
* :func:`blocks`: the report's section (sentences first, then the tables, the figures);
  :func:`fits_csv`, :func:`runs_csv`, :func:`latex_table`, :func:`summary` and
  :func:`dataframe`: the same numbers as every other table's exports (``scaling.csv``,
  ``scaling_runs.csv``, ``scaling.tex``, ``scaling.json``; a pandas DataFrame).

Reads nothing from the stores: it works on :class:`~.collect.CandidateResult` s and the study
config, so tests build them by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.keys import Metric
from harness.report import scaling_fit as sf
from harness.report.collect import CandidateResult
from harness.report.export import csv_text, number
from harness.report.render import Block, fmt
from harness.report.scaling_surface import EXPONENT_BOUNDS, Interval, SurfaceFit
from harness.study.budget import off_budget
from harness.study.schema import StudyConfig

#: A run whose realised compute is further than this from its budget is flagged.
COMPUTE_TOLERANCE = 0.02


# -- realised compute ---------------------------------------------------------------------
@dataclass(frozen=True)
class ComputeRow:
    candidate: str
    seed: int
    unit: str  # flops or tokens
    budget: float
    realised: float | None
    steps: float | None

    @property
    def off(self) -> float | None:
        return off_budget(self.realised, self.budget)

    @property
    def flagged(self) -> bool:
        return self.off is None or abs(self.off) > COMPUTE_TOLERANCE


def compute_rows(results: list[CandidateResult]) -> list[ComputeRow]:
    """One row per confirmation run that had a FLOP or token budget."""
    rows = []
    for r in results:
        for s in r.seeds:
            m = s.metrics
            if Metric.BUDGET_FLOPS in m:
                rows.append(ComputeRow(r.name, s.seed, "flops", m[Metric.BUDGET_FLOPS],
                                       m.get(Metric.TRAIN_FLOPS), m.get(Metric.TRAIN_STEPS)))
            elif Metric.BUDGET_TOKENS in m:
                rows.append(ComputeRow(r.name, s.seed, "tokens", m[Metric.BUDGET_TOKENS],
                                       m.get(Metric.TRAIN_TOKENS), m.get(Metric.TRAIN_STEPS)))
    return rows


def compute_blocks(rows: list[ComputeRow], config: StudyConfig) -> list[Block]:
    if not rows and config.budget.currency != "seconds":
        return []
    out: list[Block] = [("h2", "Compute per run")]
    if config.budget.currency == "seconds":
        out.append(("p", f"Every run trained for budget.seconds = {config.budget.seconds:g} s of "
                         f"wall clock on the machine that ran it: a wall-clock budget is "
                         f"machine-dependent (and load-dependent on a shared machine); the "
                         f"ranking holds for that machine only."))
    if not rows:
        return out
    flagged = [r for r in rows if r.flagged]
    out.append(("p", (f"{len(flagged)} of {len(rows)} runs are more than "
                      f"{COMPUTE_TOLERANCE:.0%} off their budget (⚠)." if flagged else
                      f"Every run is within {COMPUTE_TOLERANCE:.0%} of its budget.")
                + " Realised compute: FLOPs per token counted on one training step (matrix "
                  "products, forward and backward) x the tokens trained; steps are whole, so a "
                  "run lands up to half a step's compute off. What the counter misses per "
                  "mixer: docs/scaling.md."))
    table = [[r.candidate, str(r.seed), r.unit, f"{r.budget:.3g}",
              "–" if r.realised is None else f"{r.realised:.4g}",
              "–" if r.steps is None else f"{r.steps:.0f}",
              "–" if r.off is None else f"{r.off:+.2%}" + (" ⚠" if r.flagged else "")]
             for r in rows]
    out.append(("table", (["candidate", "seed", "unit", "budget", "realised", "steps", "off"], table)))
    return out


# -- scaling analysis ---------------------------------------------------------------------
@dataclass
class ScalingAnalysis:
    unit: str
    transfer: str  # the transfer rule, in words
    fits: dict[str, sf.CandidateFit] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # base -> why it has no fit
    crossovers: list[sf.Crossover] = field(default_factory=list)
    runs: dict[str, list[sf.Run]] = field(default_factory=dict)
    confidence: float = 0.95


def transfer_text(config: StudyConfig) -> str:
    assert config.scaling is not None
    t = config.scaling.transfer
    searched = ", ".join(sorted(config.search)) or "nothing"
    if t.rule == "per_size":
        return (f"hyper-parameters tuned per (size, budget) cell: {config.budget.trials} trial(s) "
                f"each over {searched}")
    if t.rule == "mup":
        base = ", ".join(f"{k} = {v}" for k, v in t.base.items())
        lr = (f"lr = {t.lr:g} at every size, tuned beforehand at the base shape, not in this study"
              if t.lr is not None else
              f"the hyper-parameters searched per cell ({config.budget.trials} trial(s) over {searched}) "
              f"in the same ranges at every size")
        return (f"every size in μP (model.parametrization: mup, base {base}: per-role learning rates, "
                f"initialisation and multipliers, 1/d attention), so its hyper-parameters transfer "
                f"across sizes: {lr}")
    rule = "1/width" if t.power == 1 else ("the same lr at every size" if t.power == 0
                                           else f"(width)^-{t.power:g}")
    return (f"one global lr per size scaled by {rule}: lr = {t.lr:g} x ({t.width_param} / {t.width})"
            f"^-{t.power:g} for every parameter, the models in the standard parametrization (not "
            f"μP), the base lr tuned beforehand at {t.width_param} = {t.width}, not in this study; "
            f"the other hyper-parameters shared")


def runs_by_base(config: StudyConfig, results: list[CandidateResult]) -> dict[str, list[sf.Run]]:
    cells = {c.name: c.cell for c in config.candidates if c.cell is not None}
    out: dict[str, list[sf.Run]] = {}
    for r in results:
        cell = cells.get(r.name)
        if cell is None:
            continue
        for s in r.seeds:
            params = s.metrics.get(Metric.PARAMS)
            if params is None or not math.isfinite(s.value):
                continue
            realised = s.metrics.get(Metric.TRAIN_FLOPS if cell.unit == "flops" else Metric.TRAIN_TOKENS)
            out.setdefault(cell.base, []).append(
                sf.Run(cell.budget, float(params), s.seed, float(s.value), realised,
                       s.metrics.get(Metric.TRAIN_TOKENS)))
    return out


def analyse(config: StudyConfig, results: list[CandidateResult], *, confidence: float = 0.95,
            n_boot: int = sf.N_BOOT) -> ScalingAnalysis | None:
    """The scaling fits of a scaling study (None for any other study)."""
    if config.scaling is None:
        return None
    n_boot = config.scaling.bootstrap or n_boot
    out = ScalingAnalysis(config.scaling.unit, transfer_text(config), confidence=confidence)
    out.runs = runs_by_base(config, results)
    bases = list(dict.fromkeys(c.cell.base for c in config.candidates if c.cell is not None))
    for i, base in enumerate(bases):
        runs = out.runs.get(base, [])
        try:
            out.fits[base] = sf.fit_candidate(base, runs, confidence=confidence, n_boot=n_boot,
                                              seed=i, surface=True, unit=out.unit)
        except ValueError as exc:
            out.failed[base] = str(exc)
    names = [b for b in bases if b in out.fits]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            out.crossovers.append(sf.crossover(out.fits[a], out.fits[b], confidence=confidence))
    return out


def _est(e: sf.Estimate | Interval, digits: int = 3) -> str:
    if not e.defined:
        return f"{fmt(e.value, digits)} [interval undefined]"
    return f"{fmt(e.value, digits)} [{fmt(e.low, digits)}, {fmt(e.high, digits)}]"


def fit_sentences(a: ScalingAnalysis) -> list[str]:
    unit = "FLOPs" if a.unit == "flops" else "tokens"
    out = []
    for name, f in a.fits.items():
        out.append(f"{name}: L(C) = E + A·C^-α with α = {_est(f.alpha)}, E = {_est(f.E)} "
                   f"(the loss it tends to); compute-optimal size N*(C) ∝ C^a with a = "
                   f"{_est(f.n_exponent)}; fitted on {len(f.budgets)} budgets from "
                   f"{f.smallest_budget:.3g} to {f.largest_budget:.3g} {unit} "
                   f"({f.largest_budget / f.smallest_budget:.0f}x)."
                   + (" " + " ".join(n[0].upper() + n[1:] + "." for n in f.notes) if f.notes else ""))
    for name, f in a.fits.items():
        s = f.surface
        if s is None:
            continue
        e = (_est(s.E) if s.e_identified else f"{s.surface.E:.3g} (about 0: these runs show no "
             f"irreducible loss, so E is not identified and its interval is not given)")
        out.append(f"{name}, approach 3: L(N, D) = E + A/N^α + B/D^β with E = {e}, "
                   f"α = {_est(s.alpha)}, β = {_est(s.beta)}; N*(C) ∝ C^a with a = β/(α+β) = "
                   f"{_est(s.a)}; {_optimum_sentence(s)} ({s.runs} runs in {s.cells} cells).")
    for name, why in a.failed.items():
        out.append(f"{name}: no fit: {why}.")
    for c in a.crossovers:
        out.append(c.sentence().replace("FLOPs", unit) + ".")
    return out


def _optimum_sentence(s: SurfaceFit) -> str:
    bound = s.surface.at_bound()
    if bound:
        return (f"{' and '.join(f'{b} = {getattr(s.surface, b):.3g}' for b in bound)} at the bound "
                f"of the fit's search ({EXPONENT_BOUNDS[0]:g} to {EXPONENT_BOUNDS[1]:g}): these runs "
                f"do not show how the loss falls with {' and '.join(AXIS[b] for b in bound)}, so the "
                f"compute-optimal N* and D* are not identified and not given")
    n_opt, d_opt = s.optimum(s.largest_compute)
    return (f"at the largest run's C = 6ND = {s.largest_compute:.3g} FLOPs, N* = {_est(n_opt)} "
            f"parameters and D* = {_est(d_opt)} tokens")


def blocks(a: ScalingAnalysis, figures: list[tuple[str, Path]] = ()) -> list[Block]:  # type: ignore[assignment]
    level = f"{a.confidence:.0%}"
    out: list[Block] = [("h2", "Scaling")]
    warnings = [c.sentence() for c in a.crossovers if c.extrapolated]
    if warnings:
        out.append(("warn", f"Extrapolation beyond {sf.EXTRAPOLATION_LIMIT:.0f}x the largest "
                            f"budget measured: " + "; ".join(warnings)))
    out += [("p", s) for s in fit_sentences(a)]
    out.append(("p", f"How hyper-parameters carry across sizes: {a.transfer}. The exponents move "
                     f"with this choice."))
    out.append(("p", f"Method: at each budget, the loss (mean over seeds) as a parabola in "
                     f"log N, its vertex the compute-optimal size (Chinchilla's approach 2); "
                     f"the vertices' losses fitted with L(C) = E + A·C^-α by the Huber loss "
                     f"(δ = {sf.HUBER_DELTA:g}) of log residuals from a grid of initialisations "
                     f"(Besiroglu et al. 2024); {level} percentile intervals from bootstrap "
                     f"replicates (their number and what they resample: the table) that redraw "
                     f"every run from pooled residuals, then refit everything. Crossovers are searched "
                     f"up to {sf.SEARCH_LIMIT:.0e}x the largest budget. Approach 3: every run "
                     f"fitted with L(N, D) = E + A/N^α + B/D^β by the same Huber loss (D: the "
                     f"tokens each run trained), N*(C) and D*(C) minimise it on C = 6ND; its "
                     f"intervals resample the (N, D) cells, each with all its seeds."))
    header = ["candidate", f"α [{level}]", f"E [{level}]", "A", f"a of N*(C) [{level}]",
              "budgets", "not bracketed", "bootstrap"]
    rows = [[n, _est(f.alpha), _est(f.E), f"{f.law.A:.3g}", _est(f.n_exponent),
             str(len(f.budgets)), str(sum(not p.bracketed for p in f.profiles)),
             f"{f.alpha.replicates} replicates; {f.residual_source}"] for n, f in a.fits.items()]
    if rows:
        out.append(("table", (header, rows)))
    header = ["candidate", f"E [{level}]", f"A [{level}]", f"B [{level}]", f"α [{level}]",
              f"β [{level}]", f"a = β/(α+β) [{level}]", "runs / cells"]
    rows = [[n, _est(s.E), _est(s.A), _est(s.B), _est(s.alpha), _est(s.beta), _est(s.a),
             f"{s.runs} / {s.cells}"] for n, f in a.fits.items() if (s := f.surface) is not None]
    if rows:
        out.append(("table", (header, rows)))
    header = ["candidate", "budget", "N* (optimal params)", "L*", "bracketed"]
    rows = [[n, f"{p.budget:.3g}", f"{p.n_opt:,.0f}", fmt(p.loss_opt), "yes" if p.bracketed else "no"]
            for n, f in a.fits.items() for p in f.profiles]
    if rows:
        out.append(("table", (header, rows)))
    for title, path in figures:
        out += [("h2", title), ("img", (path.name, title))]
    return out


# -- figures -------------------------------------------------------------------------------
def figures(a: ScalingAnalysis, colors: dict[str, str], out_dir: Path) -> list[tuple[str, Path]]:
    """Loss against compute (runs, frontier points, fitted lines and bands) and the iso-FLOP
    profiles (one panel per candidate)."""
    from harness.run.plots import pyplot, save_figure

    if not a.fits:
        return []
    plt = pyplot()
    drawn = []
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    lo = min(f.smallest_budget for f in a.fits.values())
    hi = max(f.largest_budget for f in a.fits.values())
    grid = np.logspace(math.log10(lo / 1.5), math.log10(hi * sf.EXTRAPOLATION_LIMIT), 120)
    for name, f in a.fits.items():
        color = colors.get(name)
        runs = a.runs.get(name, [])
        ax.scatter([r.budget for r in runs], [r.loss for r in runs], s=8, alpha=0.35, color=color)
        ax.scatter([p.budget for p in f.profiles], [p.loss_opt for p in f.profiles], s=36,
                   marker="D", color=color, edgecolor="black", zorder=3)
        ax.plot(grid, f.law(grid), color=color, label=f"{name}: α = {f.alpha.value:.3g}")
        low, high = f.band(grid)
        if np.all(np.isfinite(low)):
            ax.fill_between(grid, low, high, color=color, alpha=0.18, linewidth=0)
        if f.surface is not None and not f.surface.surface.at_bound():
            # approach 3's frontier: the surface at N*(C), D*(C)
            c6 = grid if a.unit == "flops" else 6 * grid
            s = f.surface.surface
            ax.plot(grid, s(s.n_opt(c6), s.d_opt(c6)), color=color, linestyle="--", linewidth=1,
                    label=f"{name}, approach 3: a = {s.a:.3g}")
    ax.axvline(hi, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training compute (FLOPs)" if a.unit == "flops" else "training tokens")
    ax.set_ylabel("loss (objective)")
    ax.set_title("Compute-optimal frontier: L(C) = E + A·C^-α, bands: bootstrap interval;\n"
                 "dashed: the loss surface L(N, D) at N*(C), D*(C)", fontsize=9)
    ax.legend(fontsize=7)
    drawn.append(("Loss versus compute", save_figure(fig, out_dir / "scaling_frontier.png")))
    fig, axes = plt.subplots(1, len(a.fits), figsize=(4.2 * len(a.fits), 3.8), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, (name, f) in zip(axes[0], a.fits.items(), strict=True):
        runs = a.runs.get(name, [])
        for i, p in enumerate(f.profiles):
            color = cmap(i / max(len(f.profiles) - 1, 1))
            pts = [r for r in runs if r.budget == p.budget]
            ax.scatter([r.params for r in pts], [r.loss for r in pts], s=10, color=color)
            ns = sorted({r.params for r in pts})
            z = np.logspace(math.log10(ns[0] / 1.3), math.log10(ns[-1] * 1.3), 60)
            ax.plot(z, p(z), color=color, label=f"C = {p.budget:.2g}")
            if f.surface is not None:  # the fitted surface along this budget (dashed)
                tokens = p.budget / (6 * z) if a.unit == "flops" else np.full_like(z, p.budget)
                ax.plot(z, f.surface.surface(z, tokens), color=color, linestyle="--", linewidth=1)
            ax.scatter([p.n_opt], [p.loss_opt], marker="*" if p.bracketed else "X", s=80,
                       color=color, edgecolor="black", zorder=3)
        ax.set_xscale("log")
        ax.set_xlabel("parameters N")
        ax.set_ylabel("loss")
        ax.set_title(f"{name}: iso-FLOP profiles" + (" (dashed: L(N, D))" if f.surface else ""))
        ax.legend(fontsize=7)
    drawn.append(("Iso-FLOP profiles", save_figure(fig, out_dir / "scaling_isoflop.png")))
    return drawn


# -- exports ---------------------------------------------------------------------------------
def fit_records(a: ScalingAnalysis) -> list[dict[str, Any]]:
    """One record per candidate (the CSV's and the DataFrame's rows)."""
    rows = []
    for name, f in a.fits.items():
        row: dict[str, Any] = {"candidate": name, "unit": a.unit, "confidence": a.confidence}
        for key, e in (("alpha", f.alpha), ("E", f.E), ("A", f.A), ("n_opt_exponent", f.n_exponent)):
            row |= {key: e.value, f"{key}_low": e.low, f"{key}_high": e.high}
        row |= {"n_opt_coefficient": f.n_coefficient, "budgets": len(f.budgets),
                "smallest_budget": f.smallest_budget, "largest_budget": f.largest_budget,
                "not_bracketed": sum(not p.bracketed for p in f.profiles),
                "replicates": f.alpha.replicates, "transfer": a.transfer}
        row |= surface_record(f)
        rows.append(row)
    return rows


SURFACE_KEYS = ("E", "A", "B", "alpha", "beta", "a")
#: What each of approach 3's exponents measures the loss against.
AXIS = {"alpha": "parameters (N)", "beta": "tokens (D)"}


def surface_record(f: sf.CandidateFit) -> dict[str, Any]:
    """Approach 3's columns (NaN without a surface fit, so every row has the same columns)."""
    out: dict[str, Any] = {}
    s = f.surface
    compute = s.largest_compute if s else math.nan
    ests = [(k, getattr(s, k) if s else None) for k in SURFACE_KEYS]
    if s is not None:
        n_opt, d_opt = s.optimum(compute)
        ests += [("n_opt_at_largest", n_opt), ("d_opt_at_largest", d_opt)]
    else:
        ests += [("n_opt_at_largest", None), ("d_opt_at_largest", None)]
    for key, e in ests:
        out |= {f"surface_{key}": e.value if e else math.nan,
                f"surface_{key}_low": e.low if e else math.nan,
                f"surface_{key}_high": e.high if e else math.nan}
    out["surface_compute"] = compute
    out["surface_runs"] = s.runs if s else 0
    return out


def fits_csv(a: ScalingAnalysis) -> str:
    return csv_text([{k: (number(v) if isinstance(v, float) else str(v)) for k, v in r.items()}
                 for r in fit_records(a)])


def runs_csv(a: ScalingAnalysis) -> str:
    return csv_text([{"candidate": n, "budget": number(r.budget), "params": number(r.params),
                  "seed": str(r.seed), "loss": number(r.loss), "realised": number(r.compute),
                  "off_budget": number(off_budget(r.compute, r.budget)), "tokens": number(r.tokens)}
                 for n, runs in a.runs.items() for r in runs])


def latex_table(a: ScalingAnalysis) -> str:
    from harness.report.export import tex

    def cell(e: sf.Estimate | Interval) -> str:
        if not e.defined:
            return f"${e.value:.3g}$"
        return f"${e.value:.3g}$ [${e.low:.3g}$, ${e.high:.3g}$]"

    lines = [r"% Scaling fits. Needs \usepackage{booktabs}.", r"\begin{table}[t]", r"  \centering",
             r"  \caption{" + tex(f"Compute-optimal frontier L(C) = E + A C^-alpha per candidate "
                                  f"and the exponent a of N*(C) ~ C^a, with {a.confidence:.0%} "
                                  f"bootstrap intervals. {a.transfer}.").replace("C^-alpha", r"$C^{-\alpha}$")
             + "}", r"  \begin{tabular}{lllll}", r"    \toprule",
             r"    Candidate & $\alpha$ & $E$ & $A$ & $a$ \\", r"    \midrule"]
    for name, f in a.fits.items():
        lines.append(f"    {tex(name)} & {cell(f.alpha)} & {cell(f.E)} & ${f.law.A:.3g}$ & "
                     f"{cell(f.n_exponent)} \\\\")
    lines += [r"    \bottomrule", r"  \end{tabular}", r"\end{table}"]
    surfaces = [(n, f.surface) for n, f in a.fits.items() if f.surface is not None]
    if surfaces:
        lines += [r"\begin{table}[t]", r"  \centering",
                  r"  \caption{" + tex(f"Loss surface L(N, D) = E + A/N^alpha + B/D^beta per candidate "
                                       f"(approach 3) and a = beta/(alpha+beta) of N*(C), with "
                                       f"{a.confidence:.0%} bootstrap intervals over cells.") + "}",
                  r"  \begin{tabular}{llllll}", r"    \toprule",
                  r"    Candidate & $E$ & $\alpha$ & $\beta$ & $a$ & runs \\", r"    \midrule"]
        for name, s in surfaces:
            lines.append(f"    {tex(name)} & {cell(s.E)} & {cell(s.alpha)} & {cell(s.beta)} & "
                         f"{cell(s.a)} & {s.runs} \\\\")
        lines += [r"    \bottomrule", r"  \end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def summary(a: ScalingAnalysis) -> dict[str, Any]:
    from harness.report.export import finite

    return finite({
        "unit": a.unit, "transfer": a.transfer, "confidence": a.confidence,
        "fits": fit_records(a), "failed": a.failed,
        "profiles": {n: [{"budget": p.budget, "n_opt": p.n_opt, "loss_opt": p.loss_opt,
                          "bracketed": p.bracketed, "coefficients": list(p.coefficients)}
                         for p in f.profiles] for n, f in a.fits.items()},
        "crossovers": [{"a": c.a, "b": c.b, "compute": c.compute, "low": c.low, "high": c.high,
                        "share": c.share, "below_after": c.below_after,
                        "extrapolated": c.extrapolated, "sentence": c.sentence()}
                       for c in a.crossovers],
        "surfaces": {n: {"E": s.E, "A": s.A, "B": s.B, "alpha": s.alpha, "beta": s.beta, "a": s.a,
                         "G": s.G} for n, f in a.fits.items()
                     if f.surface is not None for s in [f.surface.surface]},
        "runs": {n: [{"budget": r.budget, "params": r.params, "seed": r.seed, "loss": r.loss,
                      "realised": r.compute, "tokens": r.tokens} for r in runs]
                 for n, runs in a.runs.items()},
    })


def dataframe(a: ScalingAnalysis) -> Any:
    """The fits as a pandas DataFrame (one row per candidate)."""
    import pandas as pd

    return pd.DataFrame(fit_records(a))
