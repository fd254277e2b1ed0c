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


#: One marker per line or point series, so that series drawn on top of each other (two
#: candidates with equal values) stay visible: later ones smaller and hollow-looking.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def fit_titles(fig: Any) -> None:
    """Wrap every axes title to the figure's width (``tight_layout`` does not: a long title
    is clipped on both sides)."""
    import textwrap

    width_px = fig.get_figwidth() * 72  # in points, the unit of font sizes
    for ax in fig.axes:
        title = ax.title
        text = title.get_text()
        if not text:
            continue
        chars = max(20, int(width_px / (0.55 * title.get_fontsize())))
        title.set_text("\n".join(textwrap.fill(line, chars) for line in text.split("\n")))


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Lay the figure out (titles wrapped to its width), write it to ``path`` and close it."""
    fit_titles(fig)
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
    bands: Mapping[str, Mapping[int, tuple[float, float]]] | None = None,
    colors: Mapping[str, str] | None = None,
    band_label: str = "",
) -> Path:
    """One line per label: metric at each evaluation length, on a log-2 length axis with every
    evaluated length as a tick and the training length marked; ``bands`` (low, high) per
    length are shaded around the line (``band_label`` names them in the legend)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    lengths: set[int] = set()
    for i, (label, points) in enumerate(curves.items()):
        xs = sorted(points)
        lengths.update(xs)
        color = (colors or {}).get(label)
        (line,) = ax.plot(xs, [points[x] for x in xs], marker=MARKERS[i % len(MARKERS)],
                          markersize=max(3.0, 7.0 - i), label=label, color=color)
        band = {x: b for x, b in ((bands or {}).get(label) or {}).items() if x in points}
        if band:
            bx = sorted(band)
            ax.fill_between(bx, [band[x][0] for x in bx], [band[x][1] for x in bx],
                            color=line.get_color(), alpha=0.18, linewidth=0)
    if train_length:
        ax.axvline(train_length, color="grey", linestyle="--", linewidth=1,
                   label=f"training length ({train_length})")
        lengths.add(train_length)
    ax.set_xscale("log", base=2)
    ticks = sorted(lengths)
    ax.set_xticks(ticks, [str(n) for n in ticks])
    ax.minorticks_off()
    ax.set_xlabel("evaluation length (log scale)")
    ax.set_ylabel(metric)
    ax.set_title(title or f"{metric} vs length", fontsize=10)
    ax.grid(alpha=0.3)
    if band_label and bands:
        from matplotlib.patches import Patch

        handles, labels = ax.get_legend_handles_labels()
        handles.append(Patch(color="grey", alpha=0.18))
        labels.append(band_label)
        ax.legend(handles, labels, fontsize=8)
    else:
        ax.legend(fontsize=8)
    return save_figure(fig, path)


LABELLED = 32  # the most tokens an attention map's axis labels one by one


def attention_maps(maps: Sequence[Any], path: str | Path, title: str = "", max_heads: int = 4,
                   tokens: Sequence[str] | None = None,
                   query_tokens: Sequence[str] | None = None, text: str = "") -> Path:
    """A grid of attention maps (layers x heads) for one example; ``maps[l]`` is (H, Lq, Lk).

    Each panel is titled with its layer and head; ``tokens`` label the key axis (and the query
    axis unless ``query_tokens`` differ, as in cross-attention) wherever their number matches
    the map; ``text`` (the example) is shown under the title."""
    plt = pyplot()
    layers = len(maps)
    heads = min(max_heads, max(m.shape[0] for m in maps))
    # every token labelled up to LABELLED, then every step-th: the figure's size and its
    # rendering time (a fixed cost of every run) stay bounded at long lengths
    step = 1 if tokens is None else -(-len(tokens) // LABELLED)
    size = 2.4 if tokens is None else max(2.4, 0.16 * min(len(tokens), LABELLED) + 1.0)
    fig, axes = plt.subplots(layers, heads, figsize=(size * heads, size * layers + 0.6),
                             squeeze=False)
    queries = query_tokens if query_tokens is not None else tokens
    for i, layer in enumerate(maps):
        for h in range(heads):
            ax = axes[i][h]
            ax.set_xticks([])
            ax.set_yticks([])
            if h >= layer.shape[0]:
                ax.axis("off")
                continue
            ax.imshow(layer[h], cmap="viridis", aspect="auto", interpolation="nearest")
            lq, lk = layer[h].shape
            # tokens label the outer panels only (keys under the last layer's row, queries
            # left of the first head's column): tick labels are most of a figure's drawing time
            if i == layers - 1:
                ax.set_xlabel("key", fontsize=7)
                if tokens is not None and len(tokens) == lk:
                    ax.set_xticks(range(0, lk, step), list(tokens)[::step], rotation=90, fontsize=6)
            if h == 0:
                ax.set_ylabel("query", fontsize=7)
                if queries is not None and len(queries) == lq:
                    ax.set_yticks(range(0, lq, step), list(queries)[::step], fontsize=6)
            ax.set_title(f"layer {i} · head {h}", fontsize=8)
    heading = "\n".join(x for x in (title, _shorten(text)) if x)
    if heading:
        fig.suptitle(heading, fontsize=9)
    return save_figure(fig, path, dpi=100)


def _shorten(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
