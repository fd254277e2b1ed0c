"""The MAD report: per task and overall, each candidate's MAD score with its interval over
seeds, a table and a figure per task, and the paper's ranking beside ours.

A MAD score (Poli et al. 2024) is the mean test accuracy over a task's settings, each
setting's accuracy that of its best point on the learning-rate x weight-decay grid; the
overall score is the mean over tasks. Here each setting's best point is re-run on the
suite's confirmation seeds (the same seeds for every candidate and setting), so every seed
gives a score of its own: the score reported is their mean and its interval is over those
per-seed scores (:func:`harness.report.stats.mean_interval`: Student t below ten seeds, BCa
bootstrap from ten, both from scipy.stats). Settings differ in difficulty, not in noise, so
they are averaged, never resampled.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.keys import Tag
from harness.report import stats
from harness.report.collect import collect
from harness.report.figures import palette
from harness.report.render import render_html, render_markdown
from harness.study.mad import TASKS, Cell, MadSuite, cell_candidate, cells

Values = dict[int, float]  # seed -> accuracy


@dataclass
class Score:
    """A candidate's score (one task, or overall): the per-seed scores and their summary."""

    by_seed: Values
    confidence: float

    @property
    def mean(self) -> float:
        return stats.mean(list(self.by_seed.values()))

    @property
    def interval(self) -> stats.Interval:
        return stats.mean_interval(list(self.by_seed.values()), self.confidence)


@dataclass
class MadResults:
    suite: MadSuite
    seeds: list[int]
    #: task -> candidate -> cell name -> seed -> accuracy (NaN: the run failed or is missing)
    cells: dict[str, dict[str, dict[str, Values]]] = field(default_factory=dict)
    #: task -> candidate -> cell name -> the tuned point ({lr, weight_decay})
    best: dict[str, dict[str, dict[str, dict[str, Any]]]] = field(default_factory=dict)

    @property
    def candidates(self) -> list[str]:
        return [c.name for c in self.suite.candidates]

    def task_score(self, task: str, cand: str) -> Score:
        by_cell = self.cells.get(task, {}).get(cand, {})
        return Score({s: _mean_or_nan([v.get(s, math.nan) for v in by_cell.values()])
                      for s in self.seeds}, self.suite.confirm.confidence)

    def score(self, cand: str) -> Score:
        tasks = [t for t in self.suite.tasks if t in self.cells]
        return Score({s: _mean_or_nan([self.task_score(t, cand).by_seed[s] for t in tasks])
                      for s in self.seeds}, self.suite.confirm.confidence)


def _mean_or_nan(values: list[float]) -> float:
    """The mean of every value, NaN if any is missing: a score over fewer settings than the
    others' would not be comparable."""
    return math.nan if not values or any(math.isnan(v) for v in values) else sum(values) / len(values)


def gather(suite: MadSuite, handles: dict[str, Any]) -> MadResults:
    """Each task study's confirmation accuracies, by candidate and setting."""
    # the confirmation seeds every task study used (StudyConfig.confirm_seeds)
    out = MadResults(suite, [suite.seed + 1 + i for i in range(suite.confirm.seeds)])
    for task, handle in handles.items():
        results = {r.name: r for r in collect(handle)}
        out.cells[task], out.best[task] = {}, {}
        for cand in out.candidates:
            out.cells[task][cand], out.best[task][cand] = {}, {}
            for cell in cells(suite, task):
                r = results.get(cell_candidate(cand, cell))
                values = r.values() if r is not None else {}
                out.cells[task][cand][cell.name] = {s: values.get(s, math.nan) for s in out.seeds}
                out.best[task][cand][cell.name] = _point(r.best_config if r is not None else None)
    return out


def _point(config: dict[str, Any] | None) -> dict[str, Any]:
    train = (config or {}).get("train", {})
    return {k: train[k] for k in ("lr", "weight_decay") if k in train}


# -- the document ---------------------------------------------------------------------------
def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f}"


def _with_interval(score: Score) -> str:
    iv = score.interval
    text = _pct(score.mean)
    return text + (f" [{_pct(iv.low)}, {_pct(iv.high)}]" if iv.defined else "")


def blocks(res: MadResults, figures: dict[str, Path]) -> list[Any]:
    suite = res.suite
    method = stats.interval_label(len(res.seeds), suite.confirm.confidence)
    out: list[Any] = [("h1", f"MAD suite {suite.name}")]
    if suite.description:
        out.append(("p", suite.description))
    out.append(("p", f"Protocol: Poli et al. 2024 (arXiv:2403.17844, athms/mad-lab). Each "
                     f"candidate trains at every setting of each task, at every point of the grid "
                     f"{_grid(suite)} ({suite.budget.steps} steps per run); the best point of each "
                     f"setting (tuning seed {suite.seed}) is re-run on the confirmation seeds "
                     f"{', '.join(map(str, res.seeds))}. Accuracy is on {suite.test_examples} "
                     f"fresh test examples per setting, at the positions MAD scores. A task's score "
                     f"is the mean over its settings, the MAD score the mean over tasks; each "
                     f"seed gives one score and the intervals ({method}, scipy.stats) are over "
                     f"those per-seed scores. Accuracies in %."))
    header = ["candidate", f"MAD score [{method}]"] + [_short(t) for t in suite.tasks if t in res.cells]
    rows = []
    ranked = sorted(res.candidates, key=lambda c: -_key(res.score(c).mean))
    for cand in ranked:
        rows.append([cand, _with_interval(res.score(cand))]
                    + [_with_interval(res.task_score(t, cand)) for t in suite.tasks if t in res.cells])
    out += [("h2", "MAD scores"), ("table", (header, rows)),
            ("p", "Columns after the score: each task's score. " + "; ".join(
                f"{_short(t)} = {t}" for t in suite.tasks if t in res.cells) + ".")]
    seeds_rows = [[cand] + [_pct(res.score(cand).by_seed[s]) for s in res.seeds] for cand in ranked]
    out += [("h2", "MAD score per seed"), ("table", (["candidate"] + [f"seed {s}" for s in res.seeds],
                                            seeds_rows))]
    if suite.reference is not None or suite.orderings:
        out += reference_blocks(res)
    for task in suite.tasks:
        if task not in res.cells:
            continue
        settings = cells(suite, task)
        out += [("h2", f"{task}"), ("p", f"Probes: {TASKS[task].probes}. Task plugin "
                                         f"`{TASKS[task].plugin}`; settings in MAD's names, one "
                                         f"change from the baseline at a time.")]
        header = ["setting"] + res.candidates
        rows = []
        for cell in settings:
            row = [_setting(cell)]
            for cand in res.candidates:
                values = res.cells[task][cand][cell.name]
                point = res.best[task][cand][cell.name]
                tuned = ", ".join(f"{k}={v:g}" for k, v in point.items())
                row.append(f"{_pct(_mean_or_nan(list(values.values())))}" + (f" ({tuned})" if tuned else ""))
            rows.append(row)
        rows.append(["task score"] + [_with_interval(res.task_score(task, c)) for c in res.candidates])
        out += [("table", (header, rows))]
        if task in figures:
            out.append(("img", (figures[task].name, f"{task}: accuracy against each difficulty, one "
                                                    f"line per candidate (mean over seeds, {method} bars)")))
    return out


def _key(value: float) -> float:
    return -math.inf if math.isnan(value) else value


def _short(task: str) -> str:
    return "".join(w[0] for w in task.split("_")).upper()


def _grid(suite: MadSuite) -> str:
    return " x ".join(f"{k} {{{', '.join(f'{v:g}' for v in vs)}}}" for k, vs in suite.search.items())


def _setting(cell: Cell) -> str:
    baseline = ", ".join(f"{k}={v}" for k, v in cell.mad.items() if k != "num_train_examples" or cell.axis is None)
    return f"baseline ({baseline})" if cell.axis is None else f"{cell.axis}={cell.value}"


def reference_blocks(res: MadResults) -> list[Any]:
    """The paper's numbers beside ours (``reference``), and each published ordering
    (``orderings``): our difference with its interval over seeds, and whether it agrees."""
    out: list[Any] = [("h2", "Beside the paper")]
    ref = res.suite.reference
    if ref is not None:
        rows = [[r.model, "-" if r.value is None else f"{r.value:g}", r.candidate or "-",
                 _with_interval(res.score(r.candidate)) if r.candidate else "-", r.note] for r in ref.rows]
        out += [("p", f"{ref.source}: {ref.metric}."),
                ("table", (["published model", "published", "our candidate", "ours (%)", "note"], rows))]
        out += [("p", "Differences in protocol: " + "; ".join(ref.differences) + ".")] if ref.differences else []
    rows = []
    for o in res.suite.orderings:
        a, b = (res.task_score(o.task, c).by_seed if o.task else res.score(c).by_seed
                for c in (o.better, o.worse))
        d = Score({s: a[s] - b[s] for s in res.seeds}, res.suite.confirm.confidence)
        iv = d.interval
        resolved = iv.defined and (iv.low > 0 or iv.high < 0)
        verdict = ("n/a" if math.isnan(d.mean) else ("agrees" if d.mean > 0 else "disagrees")
                   + (" (resolved: the interval excludes 0)" if resolved else " (not resolved: the interval includes 0)"))
        rows.append([f"{o.better} > {o.worse}", o.task or "MAD score", f"{100 * d.mean:+.1f}"
                     + (f" [{100 * iv.low:+.1f}, {100 * iv.high:+.1f}]" if iv.defined else ""), verdict, o.source])
    if rows:
        out += [("p", f"Each ordering the paper states, and ours: the difference of the two scores in "
                      f"points (mean over seeds {', '.join(map(str, res.seeds))}, "
                      f"{stats.interval_label(len(res.seeds), res.suite.confirm.confidence)} interval)."),
                ("table", (["published ordering", "score", "our difference", "ours", "source"], rows))]
    return out


def figures(res: MadResults, out_dir: Path) -> dict[str, Path]:
    """One figure per task: a panel per difficulty axis, accuracy against the setting's value
    (the baseline's value included), one line per candidate with interval bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = palette(res.candidates)
    made: dict[str, Path] = {}
    for task in res.suite.tasks:
        if task not in res.cells:
            continue
        settings = cells(res.suite, task)
        axes_names = list(dict.fromkeys(c.axis for c in settings if c.axis is not None)) or ["baseline"]
        fig, axes = plt.subplots(1, len(axes_names), figsize=(3.2 * len(axes_names), 3.0), squeeze=False)
        for ax, axis in zip(axes[0], axes_names, strict=True):
            chosen = [c for c in settings if c.axis in (None, axis)]
            chosen.sort(key=lambda c: c.mad.get(axis, 0) if axis != "baseline" else 0)
            xs = [c.mad.get(axis, 0) for c in chosen]
            for cand in res.candidates:
                per = [Score(res.cells[task][cand][c.name], res.suite.confirm.confidence) for c in chosen]
                ys = [100 * p.mean for p in per]
                ivs = [p.interval for p in per]
                err = [[100 * (p.mean - iv.low) if iv.defined else 0 for p, iv in zip(per, ivs, strict=True)],
                       [100 * (iv.high - p.mean) if iv.defined else 0 for p, iv in zip(per, ivs, strict=True)]]
                ax.errorbar(xs, ys, yerr=err, marker="o", ms=3, capsize=2, label=cand, color=colors[cand])
            if axis != "frac_noise" and len(set(xs)) > 1 and min(xs) > 0:
                ax.set_xscale("log", base=2)
            ax.set_xlabel(axis)
            ax.set_ylim(-2, 102)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("test accuracy (%)")
        axes[0][-1].legend(fontsize=7)
        fig.suptitle(task, fontsize=10)
        fig.tight_layout()
        path = out_dir / f"mad_{task}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made[task] = path
    return made


def summary(res: MadResults) -> dict[str, Any]:
    """Everything in the tables, as JSON."""
    def score(s: Score) -> dict[str, Any]:
        iv = s.interval
        return {"mean": s.mean, "low": iv.low, "high": iv.high, "method": iv.method,
                "confidence": iv.confidence, "by_seed": {str(k): v for k, v in s.by_seed.items()}}

    return {"suite": res.suite.name, "seeds": res.seeds, "tasks": [t for t in res.suite.tasks if t in res.cells],
            "scores": {c: {"overall": score(res.score(c)),
                           "tasks": {t: score(res.task_score(t, c)) for t in res.cells}}
                       for c in res.candidates},
            "cells": res.cells, "best": res.best}


def write(res: MadResults, out_dir: Path, tracker: Any, experiment: str) -> tuple[Path, str]:
    """The report folder (``mad.md``, ``mad.html``, ``mad.json``, a figure per task) and the
    MLflow run that holds it with every score as a metric; returns both."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = figures(res, out_dir)
    doc = blocks(res, figs)
    (out_dir / "mad.md").write_text(render_markdown(doc))
    (out_dir / "mad.html").write_text(render_html(doc, f"MAD suite {res.suite.name}"))
    (out_dir / "mad.json").write_text(json.dumps(summary(res), indent=2, default=float))
    run = tracker.start_run(experiment, run_name=f"{res.suite.name} (MAD scores)",
                            tags={Tag.KIND: "mad", Tag.STUDY: res.suite.name})
    metrics = {}
    for cand in res.candidates:
        metrics[f"mad/{cand}"] = res.score(cand).mean
        for task in res.cells:
            metrics[f"mad/{cand}/{task}"] = res.task_score(task, cand).mean
    tracker.log_metrics(run, {k: v for k, v in metrics.items() if not math.isnan(v)})
    tracker.log_params(run, {"seeds": ",".join(map(str, res.seeds)), "tasks": ",".join(res.cells),
                             "steps": res.suite.budget.steps, "grid": _grid(res.suite)})
    tracker.client.log_artifacts(run, str(out_dir), "report")
    tracker.end_run(run, "FINISHED")
    return out_dir, run
