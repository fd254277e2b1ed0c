"""``harness report STUDY``: what a study found, in a form people can read and check.

Everything is read back from the two stores — the Optuna storage (slots, values, best
configurations) and MLflow (metrics, curves, attention maps of each run) — so a report can
be rebuilt at any time, by anyone who can reach them. One folder (default
``$HARNESS_HOME/reports/<study>/``), also logged to the study's parent MLflow run under
``report/``:

* ``results.md`` / ``results.html``: the ranked table (mean and 95% bootstrap interval over
  the confirmation seeds, the paired test against the baseline, parameters and cost next to
  quality), the evaluation-length table ("n/a" where a model cannot run), the best
  configuration of each candidate, and every figure;
* ``summary.json``: the same numbers for programs;
* ``learning_curves.png``, ``extrapolation.png``, ``front.png`` (quality versus cost);
* ``optuna/<candidate>_history.png`` and ``_importance.png`` (Optuna's own plots);
* ``attention/``: attention maps of the best attention-based model on a few examples.
"""

from __future__ import annotations

import html
import json
import math
import os
import shutil
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness import stats, tracking
from harness.plots import extrapolation_curve, pyplot, save_figure
from harness.study import (
    CONFIG_ATTR,
    SEED_ATTR,
    StudyHandle,
    best_trial,
    phase_progress,
    progress,
    reconcile,
    settle_parent,
)
from harness.study_config import COSTS

N_RESAMPLES = 10_000


@dataclass
class SeedRun:
    seed: int
    run_id: str
    value: float
    metrics: dict[str, float]
    not_applicable: list[int]


@dataclass
class CandidateResult:
    name: str
    label: str
    seeds: list[SeedRun]
    tuning: dict[str, int]
    best_trial: int | None
    best_value: float | None
    best_config: dict[str, Any] | None
    tuning_points: list[tuple[float, float]] = field(default_factory=list)  # (cost, quality)
    mean: float = math.nan
    ci: tuple[float, float] = (math.nan, math.nan)
    rank: float = math.nan
    paired: stats.PairedComparison | None = None
    cost: dict[str, float] = field(default_factory=dict)  # mean over seeds
    by_length: dict[int, float | None] = field(default_factory=dict)  # None: n/a
    on_front: bool = False

    @property
    def values(self) -> dict[int, float]:
        return {s.seed: s.value for s in self.seeds}

    @property
    def uses_attention(self) -> bool:
        return bool(self.best_config and (self.best_config.get("model") or {}).get("attention"))


# -- collecting -------------------------------------------------------------------------------
def _children(handle: StudyHandle) -> dict[str, Any]:
    """Child runs of the study by their ``harness.trial`` tag (one query, paged)."""
    client = handle.tracker.client
    out, token = {}, None
    while True:
        page = client.search_runs([handle.experiment_id()],
                                  f"tags.mlflow.parentRunId = '{handle.parent_run_id}'",
                                  max_results=1000, page_token=token)
        for run in page:
            out[run.data.tags.get("harness.trial", run.info.run_id)] = run
        token = page.token
        if not token:
            return out


def _cost_value(metrics: dict[str, float], cost: str) -> float:
    keys = COSTS[cost][0]
    return next((float(metrics[k]) for k in keys if k in metrics), math.nan)


def front_cost(handle: StudyHandle) -> str:
    """The cost on the front's x axis: the study's cost objective, else parameters."""
    return handle.config.cost.metric if handle.config.cost else "params"


def collect(handle: StudyHandle, lengths: tuple[int, ...]) -> list[CandidateResult]:
    """Per candidate: tuning summary, best configuration, confirmation runs and statistics."""
    from optuna.trial import TrialState

    from harness.system import metric_key

    cfg = handle.config
    children = _children(handle)
    metric, cost = cfg.objective.metric, front_cost(handle)
    results = []
    for cand in cfg.candidates:
        tune = handle.load("tune", cand.name)
        trials = tune.get_trials(deepcopy=False)
        prog = phase_progress(trials, cfg.budget.trials)
        best = best_trial(tune, cfg)
        points = []
        for t in trials:
            run = children.get(f"{tune.study_name}#{t.number}")
            if t.state == TrialState.COMPLETE and run is not None:
                points.append((_cost_value(run.data.metrics, cost), t.values[0]))
        confirm = handle.load("confirm", cand.name)
        seeds = []
        for t in confirm.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            run = children.get(f"{confirm.study_name}#{t.number}")
            if run is None:
                continue
            na = run.data.tags.get("harness.not_applicable_lengths", "")
            seeds.append(SeedRun(int(t.user_attrs[SEED_ATTR]), run.info.run_id, t.values[0],
                                 dict(run.data.metrics), [int(x) for x in na.split(",") if x]))
        seeds.sort(key=lambda s: s.seed)
        best_config = best.user_attrs.get(CONFIG_ATTR) if best is not None else None
        label = " · ".join(x for x in (cand.model.name,
                                       cand.model.attention.name if cand.model.attention else "",
                                       cand.model.position.name if cand.model.position else "") if x)
        res = CandidateResult(
            cand.name, label, seeds,
            {"complete": prog.complete, "pruned": prog.pruned, "failed": prog.failed,
             "interrupted": prog.retried, "budget": prog.slots},
            best.number if best else None, best.values[0] if best else None, best_config, points)
        values = [s.value for s in seeds]
        res.mean = stats.mean(values)
        res.ci = stats.bootstrap_ci(values, cfg.confirm.confidence, N_RESAMPLES)
        for name in COSTS:
            res.cost[name] = stats.mean([_cost_value(s.metrics, name) for s in seeds])
        for length in lengths:
            if seeds and all(length in s.not_applicable for s in seeds):
                res.by_length[length] = None
            else:
                res.by_length[length] = stats.mean(
                    [s.metrics.get(metric_key(metric, length), math.nan) for s in seeds])
        results.append(res)
    _compare(results, handle)
    return results


def _compare(results: list[CandidateResult], handle: StudyHandle) -> None:
    cfg = handle.config
    maximize = cfg.objective.direction == "maximize"
    for res, rank in zip(results, stats.ranks([r.mean for r in results], maximize), strict=True):
        res.rank = rank
    base = next(r for r in results if r.name == cfg.baseline)
    for res in results:
        if res is not base:
            res.paired = stats.paired_comparison(res.values, base.values, cfg.confirm.confidence,
                                                 N_RESAMPLES)
    cost = front_cost(handle)
    points = [(r.mean, r.cost.get(cost, math.nan)) for r in results]
    mask = stats.pareto_mask(points, [maximize, COSTS[cost][1] == "maximize"])
    for res, on in zip(results, mask, strict=True):
        res.on_front = on


# -- figures ----------------------------------------------------------------------------------
def learning_curves(handle: StudyHandle, results: list[CandidateResult], path: Path) -> Path | None:
    """``val/<metric>`` against optimizer steps: each seed thin, the mean over seeds bold."""
    key = f"val/{handle.config.objective.metric}"
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
    return extrapolation_curve(curves, metric=f"val/{handle.config.objective.metric}",
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
    ax.set_ylabel(f"val/{cfg.objective.metric}")
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
    name = f"val/{cfg.objective.metric}"
    figures, notes = [], []
    (out / "optuna").mkdir(exist_ok=True)
    for cand in cfg.candidates:
        study = handle.load("tune", cand.name)
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


# -- rendering ----------------------------------------------------------------------------------
Block = tuple[str, Any]


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "n/a"
    return f"{x:.{digits}g}" if math.isfinite(x) else "–"


def _count(x: float | None) -> str:
    """Parameters, tokens/s, megabytes: whole numbers with thousands separators."""
    return f"{x:,.0f}" if x is not None and math.isfinite(x) else "–"


def _interval(mean: float, ci: tuple[float, float]) -> str:
    if not math.isfinite(mean):
        return "–"
    if not all(math.isfinite(v) for v in ci):
        return f"{_fmt(mean)} (one seed)"
    return f"{_fmt(mean)} [{_fmt(ci[0])}, {_fmt(ci[1])}]"


def ranked_table(handle: StudyHandle, results: list[CandidateResult], length: int) -> Block:
    cfg = handle.config
    header = ["rank", "candidate", "model · attention · position",
              f"val/{cfg.objective.metric} @{length}: mean [95% CI]",
              f"Δ vs {cfg.baseline} [95% CI]", "p (paired)", "seeds", "params",
              "tokens/s", "peak MB", "tuning: done (pruned, failed) / budget"]
    rows = []
    for r in sorted(results, key=lambda r: (r.rank, r.name)):
        p = r.paired
        delta = "baseline" if p is None else _interval(p.mean_difference, p.ci)
        pval = "" if p is None else f"{_fmt(p.p_value, 3)} (n={p.n})"
        t = r.tuning
        rows.append([
            f"{r.rank:g}" + (" ★" if r.on_front else ""), r.name, r.label, _interval(r.mean, r.ci),
            delta, pval, str(len(r.seeds)), _count(r.cost.get("params")),
            _count(r.cost.get("tokens_per_s")), _count(r.cost.get("peak_memory")),
            f"{t['complete'] + t['pruned'] + t['failed']} ({t['pruned']}, {t['failed']}) / {t['budget']}",
        ])
    return "table", (header, rows)


def length_table(handle: StudyHandle, results: list[CandidateResult], lengths: tuple[int, ...],
                 train_length: int) -> Block:
    header = ["candidate"] + [f"{n}" + (" (train)" if n == train_length else "") for n in lengths]
    rows = [[r.name] + [_fmt(r.by_length.get(n)) for n in lengths] for r in results]
    return "table", (header, rows)


def render_markdown(blocks: list[Block]) -> str:
    out = []
    for kind, value in blocks:
        if kind in ("h1", "h2"):
            out.append(("# " if kind == "h1" else "## ") + value)
        elif kind == "p":
            out.append(value)
        elif kind == "list":
            out.append("\n".join(f"- {item}" for item in value))
        elif kind == "img":
            out.append(f"![{value[1]}]({value[0]})")
        elif kind == "code":
            out.append("```yaml\n" + value + "\n```")
        elif kind == "table":
            header, rows = value
            lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
            out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def render_html(blocks: list[Block], title: str) -> str:
    e = html.escape
    body = []
    for kind, value in blocks:
        if kind in ("h1", "h2"):
            body.append(f"<{kind}>{e(value)}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{e(value)}</p>")
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in value) + "</ul>")
        elif kind == "img":
            body.append(f'<figure><img src="{e(value[0])}" alt="{e(value[1])}">'
                        f"<figcaption>{e(value[1])}</figcaption></figure>")
        elif kind == "code":
            body.append(f"<pre>{e(value)}</pre>")
        elif kind == "table":
            header, rows = value
            head = "".join(f"<th>{e(h)}</th>" for h in header)
            trs = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}"
             "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;"
             "padding:4px 8px;text-align:left}img{max-width:100%}figure{margin:1em 0}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


# -- the report -----------------------------------------------------------------------------------
def write_report(handle: StudyHandle, out: str | Path | None = None, log_to_parent: bool = True) -> Path:
    """Write the report folder and log it to the parent run; returns the folder."""
    import yaml

    cfg = handle.config
    out_dir = Path(out) if out else tracking.home() / "reports" / handle.name
    out_dir.mkdir(parents=True, exist_ok=True)
    reconcile(handle)
    prog = progress(handle)
    settle_parent(handle, prog)
    train_length = int(handle.record["train_length"])
    lengths = tuple(int(n) for n in handle.record["eval_lengths"])
    length = cfg.objective.length or train_length
    results = collect(handle, lengths)

    blocks: list[Block] = [("h1", f"Study {handle.name}")]
    if cfg.description:
        blocks.append(("p", cfg.description.strip()))
    blocks.append(("p", _protocol_text(handle, length, prog.complete)))
    blocks.append(("h2", "Ranking"))
    blocks.append(ranked_table(handle, results, length))
    blocks.append(("p", "★: on the quality-versus-cost front (no other candidate is at least as "
                        f"good in both val/{cfg.objective.metric} and {front_cost(handle)}). "
                        "Cost columns are means over the confirmation seeds."))
    notes = list(handle.record.get("notes", []))
    figures: list[tuple[str, Path | None]] = [
        ("Learning curves", learning_curves(handle, results, out_dir / "learning_curves.png")),
        ("Evaluation length", extrapolation(handle, results, train_length, out_dir / "extrapolation.png")),
        ("Quality versus cost", front(handle, results, out_dir / "front.png")),
    ]
    if len(lengths) > 1:
        blocks.append(("h2", f"val/{cfg.objective.metric} by evaluation length (mean over seeds)"))
        blocks.append(length_table(handle, results, lengths, train_length))
        if any(v is None for r in results for v in r.by_length.values()):
            blocks.append(("p", "n/a: the model cannot run at that length (for example a learned "
                                "position table or a fixed-length mixer)."))
    for title, path in figures:
        if path is not None:
            blocks += [("h2", title), ("img", (path.name, title))]
    opt_figs, opt_notes = optuna_plots(handle, out_dir)
    notes += opt_notes
    if opt_figs:
        blocks.append(("h2", "Tuning (Optuna)"))
        blocks += [("img", (str(p.relative_to(out_dir)), t)) for t, p in opt_figs]
    who, maps = attention_maps(handle, results, out_dir)
    if maps:
        blocks.append(("h2", f"Attention maps: {who}"))
        blocks += [("img", (str(p.relative_to(out_dir)), p.stem)) for p in maps]
    else:
        notes.append("no attention maps: no attention-based candidate logged any")
    blocks.append(("h2", "Best configuration per candidate"))
    for r in results:
        if r.best_config:
            shown = {k: r.best_config[k] for k in ("model", "train") if k in r.best_config}
            blocks.append(("p", f"{r.name}: tuning trial #{r.best_trial}, "
                                f"val/{cfg.objective.metric} = {_fmt(r.best_value)}"))
            blocks.append(("code", yaml.safe_dump(shown, sort_keys=False).strip()))
        else:
            blocks.append(("p", f"{r.name}: no completed tuning trial"))
    if notes:
        blocks += [("h2", "Notes"), ("list", notes)]

    (out_dir / "results.md").write_text(render_markdown(blocks))
    (out_dir / "results.html").write_text(render_html(blocks, f"Study {handle.name}"))
    summary = _finite(_summary(handle, results, length, prog.complete))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if log_to_parent:
        handle.tracker.client.log_artifacts(handle.parent_run_id, str(out_dir), "report")
    return out_dir


def _protocol_text(handle: StudyHandle, length: int, complete: bool) -> str:
    cfg = handle.config
    b = cfg.budget
    match = f", widths matched to {b.params:,} parameters" if b.params else ""
    state = "" if complete else " THE STUDY IS NOT COMPLETE: numbers below are partial."
    return (
        f"Task {cfg.task.name} {cfg.task.params}. Objective: {cfg.objective.direction} "
        f"val/{cfg.objective.metric} at evaluation length {length}. Protocol: every candidate "
        f"tuned with {b.trials} trials of {b.steps} steps ({cfg.sampler.name} sampler, "
        f"{cfg.pruner.name} pruner{match}); its best configuration re-run with "
        f"{cfg.confirm.seeds} fresh seeds ({', '.join(map(str, cfg.confirm_seeds()))}). Mean and "
        f"{cfg.confirm.confidence:.0%} percentile bootstrap interval ({N_RESAMPLES:,} resamples) "
        f"over seeds; Δ and p against the baseline {cfg.baseline} on matched seeds (exact "
        f"two-sided sign-flip permutation test; with n seeds no p-value can be below 2/2^n, "
        f"{2 / 2 ** cfg.confirm.seeds:.3g} here). Rank 1 is best; ties share a rank.{state}"
    )


def _summary(handle: StudyHandle, results: list[CandidateResult], length: int,
             complete: bool) -> dict[str, Any]:
    cfg = handle.config
    return {
        "study": handle.name, "complete": complete, "parent_run_id": handle.parent_run_id,
        "objective": {"metric": cfg.objective.metric, "direction": cfg.objective.direction,
                      "length": length},
        "baseline": cfg.baseline, "confidence": cfg.confirm.confidence,
        "candidates": [
            {"name": r.name, "label": r.label, "rank": r.rank, "mean": r.mean, "ci": list(r.ci),
             "values": {str(s.seed): s.value for s in r.seeds},
             "runs": {str(s.seed): s.run_id for s in r.seeds},
             "paired": asdict(r.paired) if r.paired else None, "cost": r.cost,
             "by_length": {str(n): v for n, v in r.by_length.items()}, "on_front": r.on_front,
             "tuning": r.tuning, "best_trial": r.best_trial, "best_value": r.best_value}
            for r in results
        ],
    }


def _finite(x: Any) -> Any:
    """JSON has no NaN: undefined numbers (one seed, no value) become null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x

