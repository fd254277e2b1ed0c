"""The report's figures: learning curves, evaluation length, quality versus cost, Optuna's
own plots and the attention maps of the best attention-based run.

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
from harness.plots import extrapolation_curve, pyplot, save_figure
from harness.report.collect import CandidateResult, front_cost
from harness.study.storage import StudyHandle


def learning_curves(handle: StudyHandle, results: list[CandidateResult], path: Path) -> Path | None:
    """``val/<metric>`` against optimizer steps: each seed thin, the mean over seeds bold."""
    key = val_key(handle.config.objective.metric)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    drawn = False
    for i, res in enumerate(results):
        color = f"C{i % 10}"
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
    ax.set_title("Learning curves of the confirmation runs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def extrapolation(handle: StudyHandle, results: list[CandidateResult], train_length: int,
                  path: Path) -> Path | None:
    curves = {r.name: {n: v for n, v in r.by_length.items() if v is not None and math.isfinite(v)}
              for r in results}
    curves = {k: v for k, v in curves.items() if v}
    if not curves or max(len(v) for v in curves.values()) < 2:
        return None
    return extrapolation_curve(curves, metric=val_key(handle.config.objective.metric),
                               train_length=train_length, path=path,
                               title="Mean over confirmation seeds by evaluation length")


def front(handle: StudyHandle, results: list[CandidateResult], path: Path) -> Path | None:
    """Quality against cost: every completed tuning trial (small), each candidate's
    confirmed mean with its interval (large), the non-dominated candidates joined."""
    cfg = handle.config
    cost = front_cost(handle)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    front_pts = []
    for i, res in enumerate(results):
        color = f"C{i % 10}"
        pts = [(c, q) for c, q in res.tuning_points if math.isfinite(c)]
        if pts:
            ax.scatter(*zip(*pts, strict=True), s=14, color=color, alpha=0.35)
        x = res.cost.get(cost, math.nan)
        if math.isfinite(x) and math.isfinite(res.mean):
            err = None
            if all(math.isfinite(v) for v in res.ci):
                err = [[res.mean - res.ci[0]], [res.ci[1] - res.mean]]
            ax.errorbar([x], [res.mean], yerr=err, fmt="o", markersize=8, color=color,
                        capsize=3, label=res.name)
            if res.on_front:
                front_pts.append((x, res.mean))
    if not ax.has_data():
        plt.close(fig)
        return None
    if len(front_pts) > 1:
        front_pts.sort()
        ax.plot(*zip(*front_pts, strict=True), color="black", linestyle="--", linewidth=1,
                label="front")
    if cost in ("params", "peak_memory"):
        ax.set_xscale("log")
    ax.set_xlabel({"params": "parameters", "tokens_per_s": "training tokens / s",
                   "peak_memory": "peak memory (MB)"}[cost])
    ax.set_ylabel(val_key(cfg.objective.metric))
    ax.set_title("Quality versus cost (small: tuning trials; large: confirmed mean, 95% CI)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def optuna_plots(handle: StudyHandle, out: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """Optuna's optimization history and parameter importances per candidate (matplotlib
    backend). Importance needs two completed trials and a searched parameter; otherwise a
    note says why it is missing."""
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
        for kind, plot in (("history", ovm.plot_optimization_history),
                           ("importance", ovm.plot_param_importances)):
            path = out / "optuna" / f"{cand.name}_{kind}.png"
            if kind == "importance" and (len(complete) < 2 or not any(t.params for t in complete)):
                notes.append(f"{cand.name}: no parameter importance (needs two completed trials "
                             f"with searched parameters; has {len(complete)})")
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


def attention_maps(handle: StudyHandle, results: list[CandidateResult], out: Path
                   ) -> tuple[str | None, list[Path]]:
    """Copy the attention maps of the best-ranked attention-based candidate's best
    confirmation run (logged by every run under ``attention/``)."""
    maximize = handle.config.objective.direction == "maximize"
    ranked = sorted((r for r in results if r.uses_attention and r.seeds), key=lambda r: r.rank)
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
