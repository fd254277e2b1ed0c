"""The report's two long-context pictures (docs/long_context.md):

* **Depth x length**: for a task that places needles at depths (``needle``,
  ``variable_tracking``), one heatmap per candidate of its metric by needle depth (rows) and
  context length (columns), each cell the mean over the confirmation seeds, and a table of
  the same numbers with each candidate's mean over the grid and longest length held.
* **Recall against state**: for a ``sweep:`` study (every candidate at several widths), each
  base candidate's metric against its decoding-state bytes per layer at the training length
  (the KV cache for attention: 2 x length x width per layer; a recurrent mixer's fixed
  state), its Pareto front, the front of all of them, and which architecture buys the most
  recall per byte: the state each needs to reach a level of the metric.

Both add their section before the ranking, write CSV files beside the report and log the
cells and the front's points to the parent MLflow run (the figures reach it with the report).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.keys import Metric, depth_metric, val_key
from harness.report import stats
from harness.report.collect import CandidateResult, Protocol
from harness.report.render import Block, fmt, interval
from harness.run import grid

#: The levels of the metric the "state needed" table reads (metrics bounded by 1: acc, recall).
LEVELS = (0.5, 0.9)
#: Metrics that are shares, from 0 to 1.
BOUNDED = frozenset({"acc", "recall", "exact"})


# -- depth x length ----------------------------------------------------------------------------
def mean_cells(result: CandidateResult, metric: str) -> dict[tuple[int, int], float]:
    """The candidate's cells, each the mean over its confirmation seeds."""
    per_seed = [grid.cells(s.metrics, metric) for s in result.seeds]
    keys = sorted({k for cells in per_seed for k in cells})
    return {k: stats.mean([c[k] for c in per_seed if k in c]) for k in keys}


def grid_metric(results: Sequence[CandidateResult], proto: Protocol) -> str | None:
    """The metric the heatmaps show: the objective's when it has depth cells, else the first
    with cells (``recall``); None when no run logged any."""
    found = sorted({m for r in results for s in r.seeds for m in grid.metrics_with_cells(s.metrics)})
    if not found:
        return None
    return proto.metric if proto.metric in found else found[0]


def heatmap_blocks(results: Sequence[CandidateResult], proto: Protocol, out_dir: Path,
                   threshold: float | None) -> list[Block]:
    metric = grid_metric(results, proto)
    if metric is None:
        return []
    shown = [(r, mean_cells(r, metric)) for r in results if r.seeds]
    shown = [(r, c) for r, c in shown if c]
    if not shown:
        return []
    path = _heatmaps(shown, metric, proto, out_dir / "heatmap.png")
    lengths = sorted({n for _, c in shown for n, _ in c})
    level = threshold if threshold is not None else LEVELS[-1]
    header = ["candidate", "depth"] + [f"{n}{' (train)' if n == proto.train_length else ''}" for n in lengths]
    rows = []
    summary_rows = []
    for r, cells in shown:
        for d in sorted({d for _, d in cells}):
            rows.append([r.name, f"{d}%"] + [fmt(cells.get((n, d)), 3) for n in lengths])
        means = [m for s in r.seeds if (m := grid.grid_mean(s.metrics, metric)) is not None]
        held = [h for s in r.seeds if (h := grid.longest_held(s.metrics, metric, level, list(proto.lengths))) is not None]
        summary_rows.append([r.name, interval(stats.mean(means), stats.mean_interval(means, proto.confidence))
                             if means else "–", ", ".join(f"{h:g}" for h in held) or "–"])
    csv = ["candidate,depth,length,mean,seeds"] + [
        f"{r.name},{d},{n},{v!r},{len(r.seeds)}" for r, cells in shown for (n, d), v in sorted(cells.items())]
    (out_dir / "heatmap.csv").write_text("\n".join(csv) + "\n")
    blocks: list[Block] = [
        ("h2", "Depth x length"),
        ("p", f"val/{metric} by needle depth (rows: the share of the context before the needle, "
              f"0% = its start) and context length (columns; * = the training length), each cell "
              f"the mean over a candidate's confirmation seeds (seeds {', '.join(map(str, proto.seeds))}). "
              f"Green holds, red fails: a model that reads its whole context is green everywhere, a "
              f"window that forgets is red in the upper rows (needles far from the question) and "
              f"more so at longer lengths. Numbers: heatmap.csv."),
    ]
    if path is not None:
        blocks.append(("img", (str(path.relative_to(out_dir)), f"val/{metric} by depth and length")))
    blocks.append(("table", (header, rows)))
    blocks.append(("p", f"Per candidate: the mean over the grid (each cell weighs the same; "
                        f"{stats.interval_label(len(shown[0][0].seeds), proto.confidence)} over the "
                        f"seeds) and, per seed, the longest length up to which val/{metric} (mean "
                        f"over depths) holds >= {level:g} at every length (0: not even the shortest)."))
    blocks.append(("table", (["candidate", "mean over the grid", f"longest length held >= {level:g} (per seed)"],
                             summary_rows)))
    return blocks


def _heatmaps(shown: list[tuple[CandidateResult, dict[tuple[int, int], float]]], metric: str,
              proto: Protocol, path: Path) -> Path | None:
    from harness.run.plots import pyplot, save_figure

    plt = pyplot()
    cols = min(3, len(shown))
    rows = math.ceil(len(shown) / cols)
    lengths = len({n for _, c in shown for n, _ in c})
    depths = len({d for _, c in shown for _, d in c})
    fig, axes = plt.subplots(rows, cols, squeeze=False,
                             figsize=(cols * (1.6 + 0.8 * lengths), rows * (1.4 + 0.4 * depths)))
    for ax, (r, cells) in zip(axes.flat, shown, strict=False):
        grid.heatmap(cells, path, metric=metric, title=r.name, train_length=proto.train_length, ax=ax)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    return save_figure(fig, path)


# -- recall against state --------------------------------------------------------------------
@dataclass
class Point:
    base: str  # the candidate of the study file
    name: str  # the swept candidate
    width: int
    state: float  # decoding-state bytes per layer (or per sequence, all layers, when unknown)
    value: float
    ci: stats.Interval | None
    own_front: bool = False
    front: bool = False


def state_points(results: Sequence[CandidateResult], cfg: Any, proto: Protocol) -> tuple[list[Point], bool]:
    """One point per swept candidate with a value and a state size; whether the state is per
    layer (every run said its ``layers``)."""
    swept = {c.name: c.swept for c in cfg.candidates if getattr(c, "swept", None) is not None}
    points: list[Point] = []
    per_layer = True
    for r in results:
        cell = swept.get(r.name)
        states = [float(s.metrics[Metric.STATE_BYTES]) for s in r.seeds if Metric.STATE_BYTES in s.metrics]
        if cell is None or not states or not math.isfinite(r.mean):
            continue
        layers = _int(r.config.get("model.params.layers"))
        per_layer = per_layer and layers is not None
        points.append(Point(cell.base, r.name, cell.width, stats.mean(states) / (layers or 1), r.mean, r.interval))
    if not per_layer:  # one unit for every point
        for p in points:
            r = next(x for x in results if x.name == p.name)
            p.state *= _int(r.config.get("model.params.layers")) or 1
    mark_fronts(points, proto.maximize)
    return points, per_layer


def _int(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def pareto(points: Sequence[Point], maximize: bool) -> set[str]:
    """Names of the points no other point beats: as small a state and a value as good, one of
    the two strictly better."""
    better = (lambda a, b: a > b) if maximize else (lambda a, b: a < b)
    out = set()
    for p in points:
        if not any((q.state <= p.state and (better(q.value, p.value) or q.value == p.value))
                   and (q.state < p.state or better(q.value, p.value)) for q in points):
            out.add(p.name)
    return out


def mark_fronts(points: list[Point], maximize: bool) -> None:
    overall = pareto(points, maximize)
    for base in {p.base for p in points}:
        own = pareto([p for p in points if p.base == base], maximize)
        for p in points:
            if p.base == base:
                p.own_front = p.name in own
    for p in points:
        p.front = p.name in overall


def state_needed(points: Sequence[Point], level: float, maximize: bool) -> dict[str, float | None]:
    """Per base, the smallest state at which a point reaches ``level`` (None: none does)."""
    out: dict[str, float | None] = {}
    for base in dict.fromkeys(p.base for p in points):
        reached = [p.state for p in points if p.base == base
                   and (p.value >= level if maximize else p.value <= level)]
        out[base] = min(reached) if reached else None
    return out


def frontier_verdict(points: Sequence[Point], proto: Protocol, unit: str) -> str:
    """Which architecture buys the most of the metric per byte of state, in one paragraph."""
    bases = list(dict.fromkeys(p.base for p in points))
    on_front = {b: sum(p.front for p in points if p.base == b) for b in bases}
    total = sum(on_front.values())
    owners = sorted(bases, key=lambda b: -on_front[b])
    lead = (f"The front of all candidates (no point has a smaller state and a value as good) has "
            f"{total} point(s): " + ", ".join(f"{b} {on_front[b]}" for b in owners if on_front[b]) + ".")
    if not proto.maximize:
        return lead
    for level in reversed(LEVELS):
        need = {b: s for b, s in state_needed(points, level, True).items() if s is not None}
        if len(need) >= 1:
            ordered = sorted(need, key=lambda b: need[b])
            best = ordered[0]
            rest = "; ".join(f"{b} at {need[b]:,.0f} ({need[b] / need[best]:.3g}x)" for b in ordered[1:])
            never = [b for b in bases if b not in need]
            return (f"{lead} **Most {proto.metric} per byte of state: {best}**, the first to reach "
                    f"val/{proto.metric} >= {level:g}, at {need[best]:,.0f} bytes {unit}"
                    + (f"; {rest}" if rest else "")
                    + (f"; never within the widths swept: {', '.join(never)}" if never else "")
                    + ". Each point is a mean over seeds (its interval in the table): a level "
                      "reached within an interval's width of it is not resolved.")
    return (f"{lead} No candidate reaches val/{proto.metric} >= {LEVELS[0]:g} at any width "
            f"swept: the widths (or the training budget) are too small to say which buys the "
            f"most per byte.")


def frontier_blocks(results: Sequence[CandidateResult], cfg: Any, proto: Protocol, colors: dict[str, str],
                    out_dir: Path) -> tuple[list[Block], list[Point]]:
    if getattr(cfg, "sweep", None) is None:
        return [], []
    points, per_layer = state_points(results, cfg, proto)
    if not points:
        return [("h2", "Recall against state"),
                ("p", "No swept candidate has both a value and a decoding-state size (a model "
                      "that declares no state_size does not decode step by step).")], []
    unit = "per layer" if per_layer else "per sequence (all layers; a model did not say its layers)"
    path = _frontier_figure(points, proto, colors, unit, out_dir / "frontier.png")
    header = ["candidate", "width", f"state (bytes {unit})", f"val/{proto.metric}", "own front", "overall front"]
    rows = [[p.base, str(p.width), f"{p.state:,.0f}", interval(p.value, p.ci),
             "yes" if p.own_front else "", "yes" if p.front else ""]
            for p in sorted(points, key=lambda p: (p.base, p.state))]
    csv = ["base,candidate,width,state_bytes,value,ci_low,ci_high,own_front,front"] + [
        f"{p.base},{p.name},{p.width},{p.state!r},{p.value!r},"
        f"{p.ci.low if p.ci else ''},{p.ci.high if p.ci else ''},{int(p.own_front)},{int(p.front)}"
        for p in points]
    (out_dir / "frontier.csv").write_text("\n".join(csv) + "\n")
    blocks: list[Block] = [
        ("h2", "Recall against state"),
        ("p", f"val/{proto.metric} (mean over the confirmation seeds) against the decoding state "
              f"each model keeps, in bytes {unit} at the training length {proto.train_length} "
              f"(attention: its KV cache, growing with the length; a recurrent mixer: its fixed "
              f"state), one line per architecture through its widths ({', '.join(map(str, cfg.sweep.widths))}). "
              f"Filled markers: the architecture's own Pareto front; a black ring: the front of "
              f"all. Read it as Based (Arora et al. 2024, Figure 2) does: up and to the left is "
              f"more recall for less state. Numbers: frontier.csv."),
    ]
    if path is not None:
        blocks.append(("img", (str(path.relative_to(out_dir)), f"val/{proto.metric} against decoding state")))
    blocks.append(("p", frontier_verdict(points, proto, unit)))
    blocks.append(("table", (header, rows)))
    if proto.maximize:
        need = {level: state_needed(points, level, True) for level in LEVELS}
        bases = list(dict.fromkeys(p.base for p in points))
        blocks.append(("table", (["candidate"] + [f"state for >= {level:g} (bytes {unit})" for level in LEVELS],
                                 [[b] + [f"{need[lv][b]:,.0f}" if need[lv][b] is not None else "not reached"
                                         for lv in LEVELS] for b in bases])))
    return blocks, points


def _frontier_figure(points: list[Point], proto: Protocol, colors: dict[str, str], unit: str,
                     path: Path) -> Path | None:
    from harness.report.figures import palette
    from harness.run.plots import MARKERS, pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bases = list(dict.fromkeys(p.base for p in points))
    own = palette(bases)  # one colour per architecture, not per swept width
    for i, base in enumerate(bases):
        mine = sorted((p for p in points if p.base == base), key=lambda p: p.state)
        color = colors.get(base) or own[base]
        ax.plot([p.state for p in mine], [p.value for p in mine], "-", color=color, alpha=0.6, label=base)
        for p in mine:
            ax.plot(p.state, p.value, MARKERS[i % len(MARKERS)], color=color,
                    markerfacecolor=color if p.own_front else "white", markersize=7)
            if p.front:
                ax.plot(p.state, p.value, "o", markerfacecolor="none", markeredgecolor="black", markersize=13)
            if p.ci is not None and p.ci.defined:
                ax.vlines(p.state, p.ci.low, p.ci.high, color=color, alpha=0.5)
            ax.annotate(f"w{p.width}", (p.state, p.value), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if proto.metric in BOUNDED:  # a share: the axis shows its range, an interval past it is cut
        ax.set_ylim(-0.03, 1.03)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"decoding state (bytes {unit}, at length {proto.train_length})")
    ax.set_ylabel(f"val/{proto.metric}")
    ax.set_title(f"val/{proto.metric} against decoding state", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


# -- the report's section and the parent run --------------------------------------------------
def blocks(handle: Any, results: list[CandidateResult], proto: Protocol, colors: dict[str, str],
           out_dir: Path) -> tuple[list[Block], dict[str, Any]]:
    """Both sections (each only when the study has what it draws), and the numbers for the
    parent run (:func:`log_parent`): each candidate's cells and each architecture's points."""
    cfg = handle.config
    heat = heatmap_blocks(results, proto, out_dir, cfg.objective.threshold)
    front, points = frontier_blocks(results, cfg, proto, colors, out_dir)
    metrics: dict[str, float] = {}
    metric = grid_metric(results, proto)
    if metric is not None:
        for r in results:
            for (n, d), v in mean_cells(r, metric).items():
                if math.isfinite(v):
                    metrics[f"{r.name}/{val_key(depth_metric(metric, d), n)}"] = v
    series: dict[str, dict[int, float]] = {}
    for p in points:
        series.setdefault(f"{p.base}/state_front/{proto.metric}", {})[int(round(p.state))] = p.value
    return heat + front, {"metrics": metrics, "series": series}


def log_parent(handle: Any, numbers: dict[str, Any]) -> None:
    """The cells (``CANDIDATE/val/recall_depth25_len256``, means over seeds) and each
    architecture's metric against state (``BASE/state_front/<metric>``, step = state bytes)
    on the study's parent run, beside the report's figures."""
    if numbers["metrics"]:
        handle.tracker.log_metrics(handle.parent_run_id, numbers["metrics"])
    if numbers["series"]:
        handle.tracker.log_series(handle.parent_run_id, numbers["series"])


def insert(document: list[Block], extra: list[Block]) -> list[Block]:
    """``extra`` placed before the document's ranking section."""
    if not extra:
        return document
    at = next((i for i, b in enumerate(document) if b == ("h2", "Ranking")), len(document))
    return document[:at] + extra + document[at:]
