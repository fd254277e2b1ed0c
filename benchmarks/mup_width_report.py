"""The record of ``benchmarks/mup_width.py``: tables and Fig. 1-style figures from its rows.

    python benchmarks/mup_width_report.py --raw benchmarks/mup_width/{lstm,transformer}.jsonl \\
        --output benchmarks/mup_width_cpu.md --figures benchmarks/mup_width

Targets (issue 52): at every width from the base up, μP with the base-tuned values at least as
good as the standard parametrization with its lr tuned per width, within the seeds' spread
(the paired difference's 95% Student-t interval, scipy.stats.t.interval, reaches 0 or below);
under μP wider never worse (mean over seeds); μP's best lr at most one grid step from the
base's.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

Row = dict[str, Any]
#: what identifies a run (mup_width.Runs.key)
KEY = ("model", "parametrization", "width", "lr", "mults", "seed", "steps", "batch", "length")


def load(path: str) -> list[Row]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def finite(v: float) -> float:
    return v if math.isfinite(v) else math.inf


def cells(rows: list[Row], model: str, par: str, mults: dict[str, Any] | None, base: int) -> dict[tuple[int, float], dict[int, float]]:
    """(width, log2 lr) -> seed -> loss, for ``par`` (μP with ``mults``); the base width's
    standard runs are μP's with no multipliers (the same model)."""
    out: dict[tuple[int, float], dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r["model"] != model:
            continue
        std_at_base = par == "standard" and r["width"] == base and r["parametrization"] == "mup" and not r["mults"]
        if (r["parametrization"] == par and (par == "standard" or r["mults"] == mults)) or std_at_base:
            out[(r["width"], math.log2(r["lr"]))][r["seed"]] = finite(r["val_loss"])
    return out


def mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else math.nan


def sd(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else math.nan


def paired(a: dict[int, float], b: dict[int, float]) -> tuple[float, float, float, int]:
    """Mean of a - b over the seeds both have, and its 95% Student-t interval."""
    from scipy import stats

    seeds = sorted(set(a) & set(b))
    d = [a[s] - b[s] for s in seeds]
    if len(d) < 2:
        return (d[0] if d else math.nan), math.nan, math.nan, len(d)
    if statistics.stdev(d) == 0:  # the same model (μP with no multipliers at the base width)
        return d[0], d[0], d[0], len(d)
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=statistics.fmean(d), scale=statistics.stdev(d) / math.sqrt(len(d)))
    return statistics.fmean(d), float(lo), float(hi), len(d)


def fmt_seeds(by_seed: dict[int, float]) -> str:
    return ", ".join(f"{by_seed[s]:.4f}" for s in sorted(by_seed))


def model_section(rows: list[Row], model: str, plan: dict[str, Any], widths: list[int], fig_dir: Path | None) -> tuple[list[str], list[str]]:
    base = widths[0]
    tuned = plan["log2_lr"]
    mults = plan["mults"]
    mup = cells(rows, model, "mup", mults, base)
    sp = cells(rows, model, "standard", None, base)
    summary, lines = [], []
    sp_best = {}  # the standard parametrization's best lr per width, on the first seed (as the runs chose it)
    for w in widths:
        first = {e: s[0] for (ww, e), s in sp.items() if ww == w and 0 in s}
        if first:
            sp_best[w] = min(first, key=lambda e: first[e])
    mup_means, mup_best = [], {}
    for w in widths:
        lrs0 = {e: s[0] for (ww, e), s in mup.items() if ww == w and 0 in s}
        mup_best[w] = min(lrs0, key=lambda e: lrs0[e]) if lrs0 else None
        m = mup.get((w, float(tuned)), {})
        s = sp.get((w, float(sp_best.get(w, tuned))), {})
        diff, lo, hi, n = paired(m, s)
        mup_means.append(mean(list(m.values())))
        ok = (diff <= 0 or (math.isfinite(lo) and lo <= 0)) if n else None
        edge = mup_best[w] is not None and abs(mup_best[w] - tuned) >= 1 and mup_best[w] in (min(lrs0), max(lrs0))
        summary.append(
            f"| {model} | {w} | {f'{sp_best[w]:g}' if w in sp_best else '-'} | {mean(list(s.values())):.4f} ± {sd(list(s.values())):.4f} "
            f"({fmt_seeds(s)}) | {mean(list(m.values())):.4f} ± {sd(list(m.values())):.4f} ({fmt_seeds(m)}) | "
            f"{diff:+.4f} [{lo:+.4f}, {hi:+.4f}] | {'yes' if ok else 'no' if ok is not None else '-'} | "
            f"{f'{mup_best[w]:g}' if mup_best[w] is not None else '-'}{' (edge)' if edge else ''} |")
    wider = all(b <= a for a, b in zip(mup_means, mup_means[1:], strict=False) if math.isfinite(a) and math.isfinite(b))
    moves = [abs(mup_best[w] - tuned) for w in widths if mup_best[w] is not None]
    lines += [f"### {model}", "",
              f"Tuned at width {base}: lr 2^{tuned}, multipliers {mults or 'none (all 1)'} "
              f"(mean loss there {plan['loss']:.4f}). Under μP wider never worse (mean over seeds): "
              f"**{'yes' if wider else 'no'}** ({', '.join(f'{v:.4f}' for v in mup_means)}); μP's best lr "
              f"(seed 0, the base's lr ± 1 step) moves at most {f'{max(moves):g}' if moves else '-'} grid step(s) from 2^{tuned}.", ""]
    lines += grid_tables(rows, model, base)
    for name, table in (("standard parametrization", sp), ("μP (base-tuned multipliers)", mup)):
        lines += lr_table(table, widths, f"{model}, {name}: validation loss (nats/char), mean over the seeds run "
                                         f"(their number in brackets), by width and log2 lr")
    if fig_dir is not None:
        path = figure(model, sp, mup, widths, tuned, fig_dir)
        if path:
            lines += [f"![{model}: loss against log2 lr, one curve per width]({path})", ""]
    return summary, lines


def grid_tables(rows: list[Row], model: str, base: int) -> list[str]:
    grid = [r for r in rows if r["model"] == model and r["width"] == base and r["parametrization"] == "mup"
            and r.get("phase") in ("grid", "sweep", "sp", "mup")]
    outs = sorted({r["mults"].get("output_mult", 1.0) for r in grid if set(r["mults"]) <= {"output_mult"}})
    lrs = sorted({math.log2(r["lr"]) for r in grid if set(r["mults"]) <= {"output_mult"}})
    by: dict[tuple[float, float], list[float]] = defaultdict(list)
    for r in grid:
        if set(r["mults"]) <= {"output_mult"} and r["seed"] == 0:
            by[(r["mults"].get("output_mult", 1.0), math.log2(r["lr"]))].append(finite(r["val_loss"]))
    out = [f"Base width {base}, seed 0: learning rate x output multiplier (validation loss; `-` not run)", "",
           "| output_mult | " + " | ".join(f"2^{e:g}" for e in lrs) + " |", "|---|" + "---|" * len(lrs)]
    for o in outs:
        out.append(f"| {o:g} | " + " | ".join(f"{mean(by[(o, e)]):.4f}" if by.get((o, e)) else "-" for e in lrs) + " |")
    sweeps = [r for r in grid if r.get("phase") == "sweep"]
    if sweeps:
        out += ["", "One-dimensional sweeps around that optimum (seed 0):", "", "| multipliers | log2 lr | loss |",
                "|---|---|---|"]
        out += [f"| {r['mults']} | {math.log2(r['lr']):g} | {finite(r['val_loss']):.4f} |" for r in sweeps]
    return [*out, ""]


def lr_table(table: dict[tuple[int, float], dict[int, float]], widths: list[int], title: str) -> list[str]:
    lrs = sorted({e for (_, e) in table})
    out = [title, "", "| width | " + " | ".join(f"2^{e:g}" for e in lrs) + " |", "|---|" + "---|" * len(lrs)]
    for w in widths:
        row = []
        for e in lrs:
            s = table.get((w, e))
            row.append(f"{mean(list(s.values())):.4f} ({len(s)})" if s else "-")
        out.append(f"| {w} | " + " | ".join(row) + " |")
    return [*out, ""]


def figure(model: str, sp: Any, mup: Any, widths: list[int], tuned: int, fig_dir: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True, sharey=True)
    colours = plt.cm.viridis([i / max(1, len(widths) - 1) for i in range(len(widths))])
    for ax, (title, table) in zip(axes, (("standard parametrization", sp), ("μP, base-tuned multipliers", mup)), strict=True):
        for c, w in zip(colours, widths, strict=True):
            pts = sorted((e, s) for (ww, e), s in table.items() if ww == w)
            xs = [e for e, s in pts if 0 in s]
            ys = [s[0] for e, s in pts if 0 in s]
            ax.plot(xs, ys, "o-", color=c, label=f"width {w}")
            for e, s in pts:  # every seed as a point
                ax.scatter([e] * len(s), list(s.values()), color=c, s=8, alpha=0.5)
        ax.set_title(f"{model}: {title}")
        ax.set_xlabel("log2 learning rate")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation loss (nats/char)")
    axes[1].axvline(tuned, color="grey", ls=":", lw=1)
    axes[1].legend()
    lo = min(min(s.values()) for t in (sp, mup) for s in t.values())
    axes[0].set_ylim(lo - 0.02, lo + 0.5)
    fig.tight_layout()
    fig_dir.mkdir(parents=True, exist_ok=True)
    path = fig_dir / f"fig1_{model}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"{fig_dir.name}/{path.name}"  # beside the record, which lies in fig_dir's parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", nargs="+", default=["benchmarks/mup_width/lstm.jsonl",
                                                 "benchmarks/mup_width/transformer.jsonl"],
                    help="rows of mup_width.py (each beside its .plan.json: the tuned values)")
    ap.add_argument("--figures", default="benchmarks/mup_width")
    ap.add_argument("--output", default="-")
    ap.add_argument("--header", default=None, help="a Markdown file put before the tables (setup, command)")
    args = ap.parse_args()
    unique = {json.dumps([r[k] for k in KEY], sort_keys=True): r for raw in args.raw for r in load(raw)}
    rows = list(unique.values())  # a run in two files (a second process started from a copy) once
    plan = {}
    for raw in args.raw:
        path = Path(raw).with_suffix(".plan.json")
        if path.exists():
            plan.update(json.loads(path.read_text()))
    widths = sorted({r["width"] for r in rows})
    summary = ["| model | width | SP best log2 lr (seed 0) | SP tuned per width: loss mean ± sd (seeds) | "
               "μP base-tuned: loss mean ± sd (seeds) | μP − SP, paired [95% t interval] | μP at least as good | "
               "μP best log2 lr (seed 0) |", "|---|---|---|---|---|---|---|---|"]
    body: list[str] = []
    for model, tuned in plan.items():
        s, b = model_section(rows, model, tuned, widths, Path(args.figures) if args.figures else None)
        summary += s
        body += b
    head = Path(args.header).read_text().rstrip() + "\n\n" if args.header else ""
    n, secs = len(rows), sum(r["seconds"] for r in rows)
    text = (head + f"Runs: {n}, training time summed {secs / 60:.1f} min; load average (1 min) at the runs' ends "
            f"{min(r['load'] for r in rows):.1f}-{max(r['load'] for r in rows):.1f}.\n\n"
            + "\n".join(summary) + "\n\n" + "\n".join(body))
    if args.output == "-":
        print(text)
    else:
        Path(args.output).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
