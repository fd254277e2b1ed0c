"""The depth x length grid of a long-context evaluation: its cells read from a run's metrics,
its two summaries, and its heatmap.

A task that places needles at depths (``needle``, ``variable_tracking``) logs, at every
evaluation length ``L``, one metric per depth ``d``: ``val/recall_depth{d}_len{L}``
(:func:`harness.keys.depth_metric`). Those are the grid's cells; a task without depths has
one cell per length (``val/recall_len{L}``).

Summaries (what a study can rank by, ``objective.over``):

* ``grid``: the mean over every cell (each depth and length weighs the same);
* ``longest``: the longest evaluation length up to which the metric holds at or above a
  threshold at *every* length, the metric at a length being its mean over the depths (RULER's
  "effective context length", which takes the score averaged over its tasks). 0 when even
  the shortest length falls below; a length the model could not run (not applicable) ends
  the run of held lengths.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.keys import split_val_key

_DEPTH = re.compile(r"(.+)_depth(\d+)")


def cells(metrics: Mapping[str, float], metric: str) -> dict[tuple[int, int], float]:
    """``{(length, depth): value}`` of ``metric``'s depth cells (empty: none logged)."""
    out: dict[tuple[int, int], float] = {}
    for key, value in metrics.items():
        split = split_val_key(key)
        if split is None:
            continue
        m = _DEPTH.fullmatch(split[0])
        if m and m[1] == metric:
            out[(split[1], int(m[2]))] = float(value)
    return out


def by_length(metrics: Mapping[str, float], metric: str) -> dict[int, float]:
    """``{length: value}`` of ``metric`` (``val/<metric>_len<L>``)."""
    out = {}
    for key, value in metrics.items():
        split = split_val_key(key)
        if split is not None and split[0] == metric:
            out[split[1]] = float(value)
    return dict(sorted(out.items()))


def grid_mean(metrics: Mapping[str, float], metric: str) -> float | None:
    """The mean over every depth x length cell (over the lengths where there are no depths)."""
    values = list(cells(metrics, metric).values()) or list(by_length(metrics, metric).values())
    values = [v for v in values if math.isfinite(v)]
    return sum(values) / len(values) if values else None


def longest_held(metrics: Mapping[str, float], metric: str, threshold: float,
                 lengths: list[int] | None = None) -> float | None:
    """The longest length up to which ``metric`` (mean over depths) stays >= ``threshold`` at
    every length (0: not even the shortest); None when nothing was logged. ``lengths``: the
    evaluation lengths planned (a planned length without a value breaks the run)."""
    values = by_length(metrics, metric)
    grid = cells(metrics, metric)
    for length in {n for n, _ in grid}:  # the mean over the depths, where there are depths
        row = [v for (n, _), v in grid.items() if n == length]
        values[length] = sum(row) / len(row)
    if not values:
        return None
    held = 0
    for length in sorted(set(lengths or []) | set(values)):
        value = values.get(length)
        if value is None or not math.isfinite(value) or value < threshold:
            break
        held = length
    return float(held)


def summary(metrics: Mapping[str, float], metric: str, over: str, threshold: float | None = None,
            lengths: list[int] | None = None) -> float | None:
    """The summary ``over`` (``grid`` or ``longest``) of ``metric`` in a run's metrics."""
    if over == "grid":
        return grid_mean(metrics, metric)
    if over == "longest":
        assert threshold is not None
        return longest_held(metrics, metric, threshold, lengths)
    raise ValueError(f"unknown summary {over!r}")


def metrics_with_cells(metrics: Mapping[str, float]) -> list[str]:
    """The metrics that have depth cells in a run's metrics (``recall``)."""
    names = set()
    for key in metrics:
        split = split_val_key(key)
        m = _DEPTH.fullmatch(split[0]) if split else None
        if m:
            names.add(m[1])
    return sorted(names)


def heatmap(grid: Mapping[tuple[int, int], float], path: str | Path, *, metric: str,
            title: str = "", train_length: int | None = None, ax: Any = None) -> Path | None:
    """The picture of a needle test: depth (rows, 0% = start of the context at the top)
    against context length (columns), each cell coloured by its value on a fixed 0..1 scale
    (red low, green high) and written in it; the training length's column is marked. With
    ``ax``, drawn there and not saved (a figure of several candidates)."""
    from harness.run.plots import pyplot, save_figure

    if not grid:
        return None
    lengths = sorted({n for n, _ in grid})
    depths = sorted({d for _, d in grid})
    plt = pyplot()
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 1.2 + 0.45 * len(depths)))
    data = [[grid.get((n, d), math.nan) for n in lengths] for d in depths]
    image = ax.imshow(data, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    for i, row in enumerate(data):
        for j, value in enumerate(row):
            text = "n/a" if math.isnan(value) else f"{value:.2f}"
            dark = not math.isnan(value) and (value > 0.85 or value < 0.15)  # the map's dark ends
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
    ax.set_xticks(range(len(lengths)), [f"{n}{'*' if n == train_length else ''}" for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d}%" for d in depths])
    ax.set_xlabel("context length (tokens)" + (" (* trained)" if train_length in lengths else ""))
    ax.set_ylabel("needle depth")
    ax.set_title(title or metric, fontsize=9)
    if not own:
        return None
    fig.colorbar(image, ax=ax, label=metric, fraction=0.05)
    return save_figure(fig, path)
