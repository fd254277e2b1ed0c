"""Figures logged with runs: metric versus evaluation length, attention maps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib's pyplot on the non-interactive backend (imported when a figure is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Lay the figure out, write it to ``path`` and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return Path(path)


def extrapolation_curve(
    curves: Mapping[str, Mapping[int, float]],
    *,
    metric: str,
    train_length: int | None,
    path: str | Path,
    title: str = "",
) -> Path:
    """One line per label: metric at each evaluation length (log-2 x axis)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in curves.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=label)
    if train_length:
        ax.axvline(train_length, color="grey", linestyle="--", linewidth=1, label="train length")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation length")
    ax.set_ylabel(metric)
    ax.set_title(title or f"{metric} vs length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def attention_maps(maps: Sequence[Any], path: str | Path, title: str = "", max_heads: int = 4) -> Path:
    """A grid of attention maps (layers x heads) for one example; ``maps[l]`` is (H, Lq, Lk)."""
    plt = pyplot()
    layers = len(maps)
    heads = min(max_heads, max(m.shape[0] for m in maps))
    fig, axes = plt.subplots(layers, heads, figsize=(2.4 * heads, 2.4 * layers), squeeze=False)
    for i, layer in enumerate(maps):
        for h in range(heads):
            ax = axes[i][h]
            if h < layer.shape[0]:
                ax.imshow(layer[h], cmap="viridis", aspect="auto", interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {i}", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    return save_figure(fig, path, dpi=100)
