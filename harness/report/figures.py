"""The report's figures: every seed per candidate, learning curves, evaluation length,
quality versus cost, Optuna's own plots and the attention maps of the best attention-based
run. Each candidate keeps one colour in every figure (:func:`palette`).

Each function draws (or copies) into the report folder and returns what it wrote, or
``None``/nothing when there is nothing to show. matplotlib and Optuna are imported when a
figure is drawn, never at import.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from harness.keys import Phase, val_key
from harness.report.collect import CandidateResult, Protocol
from harness.report.verdict import Verdict
from harness.run.plots import MARKERS, extrapolation_curve, pyplot, save_figure
from harness.study.schema import COST_LABELS
from harness.study.storage import StudyHandle


def palette(names: list[str]) -> dict[str, str]:
    """One colour per candidate, in the study's candidate order, the same in every figure
    (tab10, then tab20 beyond ten candidates)."""
    plt = pyplot()
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    from matplotlib.colors import to_hex

    return {name: to_hex(cmap(i % cmap.N)) for i, name in enumerate(names)}


def seeds_strip(results: list[CandidateResult], verdict: Verdict, protocol: Protocol,
                colors: dict[str, str], path: Path) -> Path | None:
    """Every confirmation seed as a point (labelled with its seed), the mean as a bar and its
    interval as a line, candidates in table order."""
    by_name = {r.name: r for r in results}
    shown = [by_name[n] for n in verdict.order if by_name[n].seeds]
    if not shown:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(shown) + 2), 4))
    for x, r in enumerate(shown):
        color = colors[r.name]
        n = len(r.seeds)
        for k, s in enumerate(r.seeds):
            dx = 0.0 if n == 1 else -0.18 + 0.36 * k / (n - 1)
            ax.scatter([x + dx], [s.value], color=color, s=28, zorder=3)
            if n <= 10:
                ax.annotate(str(s.seed), (x + dx, s.value), textcoords="offset points",
                            xytext=(4, 2), fontsize=6, color="dimgrey")
        if math.isfinite(r.mean):
            ax.hlines(r.mean, x - 0.3, x + 0.3, color=color, linewidth=2, zorder=2)
        if r.interval is not None and r.interval.defined:
            ax.vlines(x + 0.3, r.interval.low, r.interval.high, color=color, linewidth=1)
    ax.set_xticks(range(len(shown)), [r.name + (" (best group)" if r.best_group and verdict.resolved
                                                else "") for r in shown],
                  rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(protocol.objective)
    label = shown[0].interval.label if shown[0].interval else ""
    ax.set_title(f"Each confirmation seed (points, with seed numbers)\nmean (bar), {label} "
                 f"interval (line)", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, path)


def learning_curves(handle: StudyHandle, results: list[CandidateResult], colors: dict[str, str],
                    path: Path) -> Path | None:
    """``val/<metric>`` against optimizer steps: each seed thin, the mean over seeds bold."""
    key = val_key(handle.config.objective.metric)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    drawn = False
    for res in results:
        color = colors[res.name]
        curves = []
        for s in res.seeds:
            hist = {m.step: m.value for m in handle.tracker.client.get_metric_history(s.run_id, key)}
            if hist:
                steps = sorted(hist)
                ax.plot(steps, [hist[x] for x in steps], color=color, alpha=0.3, linewidth=0.8)
                curves.append(hist)
        if curves:
            common = sorted(set.intersection(*(set(c) for c in curves)))
            ax.plot(common, [sum(c[x] for c in curves) / len(curves) for x in common],
                    color=color, linewidth=2, label=f"{res.name} (mean of {len(curves)})")
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"{key} (training length)")
    ax.set_title("Learning curves of the confirmation runs (thin: each seed)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def extrapolation(results: list[CandidateResult], protocol: Protocol, colors: dict[str, str],
                  path: Path) -> Path | None:
    """The objective's metric by evaluation length: mean over seeds, its interval as a band."""
    curves, bands = {}, {}
    for r in results:
        points = {n: v for n, v in r.by_length.items() if v is not None and math.isfinite(v)}
        if points:
            curves[r.name] = points
            bands[r.name] = {n: (ci.low, ci.high) for n, ci in r.by_length_interval.items()
                             if ci.defined and n in points}
    if not curves or max(len(v) for v in curves.values()) < 2:
        return None
    label = next((ci.label for r in results for ci in r.by_length_interval.values()), "")
    return extrapolation_curve(curves, metric=f"val/{protocol.metric}",
                               train_length=protocol.train_length, path=path, colors=colors,
                               bands=bands, band_label=f"{label} interval over seeds",
                               title="Mean over confirmation seeds by evaluation length")


def front(handle: StudyHandle, results: list[CandidateResult], verdict: Verdict,
          protocol: Protocol, colors: dict[str, str], path: Path) -> Path | None:
    """Quality against cost: every completed tuning trial (small), each candidate's
    confirmed mean with its interval (large), the front (when there is one) joined."""
    cost = protocol.front_cost
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    front_pts = []
    shift = dodge({r.name: r.cost.get(cost, math.nan) for r in results if math.isfinite(r.mean)})
    for i, res in enumerate(results):
        color = colors[res.name]
        pts = [(c, q) for c, q in res.tuning_points if math.isfinite(c)]
        if pts:
            ax.scatter(*zip(*pts, strict=True), s=14, color=color, alpha=0.35,
                       marker=MARKERS[i % len(MARKERS)])
        x = res.cost.get(cost, math.nan) * shift.get(res.name, 1.0)
        if math.isfinite(x) and math.isfinite(res.mean):
            err = None
            if res.interval is not None and res.interval.defined:
                err = [[res.mean - res.interval.low], [res.interval.high - res.mean]]
            ax.errorbar([x], [res.mean], yerr=err, fmt="*" if res.on_front else MARKERS[i % len(MARKERS)],
                        markersize=11 if res.on_front else 8, color=color, capsize=3,
                        label=res.name + (" (front)" if res.on_front else ""))
            if res.on_front:
                front_pts.append((x, res.mean))
    if not ax.has_data():
        plt.close(fig)
        return None
    if len(front_pts) > 1:
        front_pts.sort()
        ax.plot(*zip(*front_pts, strict=True), color="black", linestyle="--", linewidth=1,
                label="front")
    if cost in ("params", "peak_memory", "state_size"):
        ax.set_xscale("log")
    ax.set_xlabel(COST_LABELS[cost])
    ax.set_ylabel(protocol.objective)
    label = next((r.interval.label for r in results if r.interval is not None), "")
    note = "" if verdict.front else "; no front: costs not resolved apart"
    dodged = " Candidates of equal cost are drawn side by side." if any(
        v != 1.0 for v in shift.values()) else ""
    ax.set_title(f"Quality versus cost\nsmall: tuning trials; large: confirmed mean, {label} "
                 f"interval{note}.{dodged}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def dodge(costs: dict[str, float], step: float = 0.04) -> dict[str, float]:
    """Factors that move candidates of equal cost (within 1%) apart on the x axis, centred
    on their cost (a factor, so it reads alike on a log axis), so no point hides another."""
    out: dict[str, float] = {}
    groups: list[list[str]] = []
    for name, c in costs.items():
        if not math.isfinite(c):
            continue
        group = next((g for g in groups if abs(costs[g[0]] - c) <= 0.01 * max(abs(c), 1e-12)), None)
        if group is None:
            groups.append([name])
        else:
            group.append(name)
    for group in groups:
        for k, name in enumerate(group):
            out[name] = 1.0 + step * (k - (len(group) - 1) / 2)
    return out


def importance_min_trials(searched: int) -> int:
    """Completed trials before a parameter-importance plot says something: with one or two
    searched parameters, 10; with more, max(20, 4 per parameter). Measured
    (``benchmarks/importance_trials.md``): below these, Optuna's fANOVA importance misses the
    one parameter that matters in more than 10% of synthetic studies."""
    return 10 if searched <= 2 else max(20, 4 * searched)


def optuna_plots(handle: StudyHandle, out: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """Optuna's optimization history and parameter importances per candidate (matplotlib
    backend). Importance only with enough completed trials (:func:`importance_min_trials`);
    otherwise one sentence says why it is missing."""
    import optuna
    from optuna.visualization import matplotlib as ovm

    plt = pyplot()
    cfg = handle.config
    target = (lambda t: t.values[0]) if cfg.multi_objective else None
    name = val_key(cfg.objective.metric)
    figures, notes = [], []
    (out / "optuna").mkdir(exist_ok=True)
    for cand in cfg.candidates:
        study = handle.load(Phase.TUNE, cand.name)
        complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        searched = len({p for t in complete for p in t.params})
        need = importance_min_trials(searched)
        for kind, plot in (("history", ovm.plot_optimization_history),
                           ("importance", ovm.plot_param_importances)):
            path = out / "optuna" / f"{cand.name}_{kind}.png"
            if kind == "importance" and (searched < 2 or len(complete) < need):
                why = ("it searched no parameter" if searched == 0 else
                       "it searched one parameter (its importance is 1 by definition)"
                       if searched == 1 else
                       f"it has {len(complete)} completed tuning trials; {need} are needed to "
                       f"estimate the importance of {searched} searched parameters")
                notes.append(f"{cand.name}: no parameter-importance plot: {why}.")
                continue
            try:
                # Optuna switches the global style to ggplot; keep that inside this block.
                with warnings.catch_warnings(), plt.rc_context():
                    warnings.simplefilter("ignore")
                    ax = plot(study, target=target, target_name=name)
                fig: Any = ax.figure
                fig.set_size_inches(6.5, 4)
                save_figure(fig, path, dpi=100)
                figures.append((f"{cand.name}: Optuna {kind}", path))
            except (ValueError, RuntimeError, ZeroDivisionError) as exc:
                notes.append(f"{cand.name}: Optuna {kind} plot unavailable ({exc})")
    return figures, notes


def attention_maps(handle: StudyHandle, results: list[CandidateResult], verdict: Verdict,
                   out: Path) -> tuple[str | None, list[Path]]:
    """Copy the attention maps of the first attention-based candidate in table order, from
    its best confirmation run (logged by every run under ``attention/``)."""
    maximize = handle.config.objective.direction == "maximize"
    by_name = {r.name: r for r in results}
    ranked = [by_name[n] for n in verdict.order if by_name[n].uses_attention and by_name[n].seeds]
    for res in ranked:
        best = max(res.seeds, key=lambda s: s.value if maximize else -s.value)
        client = handle.tracker.client
        files = [f.path for f in client.list_artifacts(best.run_id, "attention") if not f.is_dir]
        if not files:
            continue
        dst = out / "attention"
        dst.mkdir(exist_ok=True)
        copied = []
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        with tempfile.TemporaryDirectory() as tmp:
            for item in files:
                local = Path(client.download_artifacts(best.run_id, item, tmp))
                target = dst / f"{res.name}_seed{best.seed}_{local.name}"
                shutil.copy(local, target)
                copied.append(target)
        return f"{res.name} (seed {best.seed}, run {best.run_id})", copied
    return None, []
