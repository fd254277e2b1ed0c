"""Does the loss-optimal learning rate move as the model widens? Tensor Programs V, Figure 1
(Yang et al. 2022, arXiv:2203.03466), at CPU size, for the harness's parametrizations.

For each model, parametrization and width, train on ``char_lm`` (Shakespeare characters) with
every learning rate of a grid in factors of 2 and score the validation loss; the record shows,
per model and parametrization, the optimum per width and how far it moves (in factors of 2),
and whether wider was ever worse at the best lr. μP's base width is the smallest width, where
both parametrizations build the same model and the runs are shared.

The runs use the harness's own model building (``harness.run.build.build_model_from``: μP's
roles, initialisation and multipliers) and optimiser (``harness.run.optim.make_optimizer``: μP's
per-role learning rates) in a plain training loop (no Lightning, no MLflow: a few seconds less
per run over hundreds of runs). Each finished run is appended to ``--raw`` (JSON lines) so an
interrupted benchmark resumes where it stopped::

    OMP_NUM_THREADS=1 python benchmarks/mup_transfer.py --output benchmarks/mup_transfer_cpu.md

Defaults: widths 32 64 128 256; lr 2^-10 .. 2^-7 first, then a factor of 2 more on the side of
the best until it is bracketed; 2 layers, 120 AdamW steps (12 warm-up, cosine to 0.1), batch
16 x 32 characters, one seed.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MODELS = {
    "transformer": {"name": "transformer", "params": {"layers": 2, "heads": 4},
                    "attention": {"name": "multi_head"}},
    "gla": {"name": "transformer", "params": {"layers": 2, "heads": 4}, "mixer": {"name": "gla"}},
    "mamba2": {"name": "transformer", "params": {"layers": 2, "heads": 4, "mlp": "none"},
               "mixer": {"name": "mamba2", "params": {"headdim": 16}}},
    "lstm": {"name": "lstm", "params": {"layers": 2, "tie_embeddings": False}},
}
WIDTH_PARAM = {"lstm": "width"}


def run_config(model: str, width: int, parametrization: str, base: int, lr: float, args: Any) -> dict[str, Any]:
    m = json.loads(json.dumps(MODELS[model]))
    key = WIDTH_PARAM.get(model, "d_model")
    m["params"][key] = width
    if parametrization == "mup":
        m["parametrization"], m["base"] = "mup", {key: base}
    return {"task": {"name": "char_lm", "params": {"length": args.length, "num_train": args.steps * args.batch,
                                                   "num_val": args.val}},
            "model": m,
            "train": {"max_steps": args.steps, "batch_size": args.batch, "lr": lr, "warmup_steps": args.warmup,
                      "seed": args.seed}}


def train_one(cfg: dict[str, Any], registry: Any) -> dict[str, Any]:
    """Train one configuration; the validation loss (nats per character) at the end."""
    import torch
    import torch.nn.functional as F

    from harness.config import parse_run_config
    from harness.data.formats import FORMATS
    from harness.run.build import build_model_from, build_task, task_info
    from harness.run.optim import make_optimizer
    from harness.run.plan import plan

    p = plan(parse_run_config(cfg), registry)
    t = p.config.train
    task = build_task(p, seed=t.data_seed)
    info = task_info(p, task)
    torch.manual_seed(t.seed)
    model = build_model_from(p.parts, info)
    opt, sched = make_optimizer(model, t)
    fmt = FORMATS["lm"]
    train = task.examples("train", task.train_length)
    val = fmt.collate(task.examples("val", task.train_length), "lm")
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(t.seed)).tolist()
    started, last = time.perf_counter(), []
    model.train()
    for step in range(t.max_steps):
        rows = [train[order[(step * t.batch_size + i) % len(order)]] for i in range(t.batch_size)]
        batch = fmt.collate(rows, "lm")
        out = fmt.call(model, batch)
        mask = batch["loss_mask"]
        loss = F.cross_entropy(out[mask], batch["targets"][mask])
        if not torch.isfinite(loss):
            return {"val_loss": math.inf, "train_loss": math.inf, "seconds": time.perf_counter() - started,
                    "diverged_at": step}
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if t.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        sched.step()
        last = (last + [float(loss)])[-20:]
    model.eval()
    with torch.no_grad():
        out = fmt.call(model, val)
        mask = val["loss_mask"]
        val_loss = float(F.cross_entropy(out[mask], val["targets"][mask]))
    return {"val_loss": val_loss if math.isfinite(val_loss) else math.inf,
            "train_loss": sum(last) / len(last), "seconds": time.perf_counter() - started}


def bracket(loss: Any, args: Any) -> list[float]:
    """The learning rates tried for one width: the ``--start`` powers of 2, then one more
    factor of 2 beyond whichever end is best until the best lies inside (at most
    ``--log2-lr``'s range), so every optimum is bracketed by a worse lr on each side."""
    lo, hi = args.start
    tried = {e: loss(2.0**e) for e in range(lo, hi + 1)}
    while True:
        best = min(tried, key=lambda e: tried[e])
        if best == min(tried) and best > args.log2_lr[0]:
            e = best - 1
        elif best == max(tried) and best < args.log2_lr[1]:
            e = best + 1
        else:
            return [2.0**e for e in sorted(tried)]
        tried[e] = loss(2.0**e)


def optimum(losses: dict[float, float]) -> tuple[float | None, float | None]:
    """The grid's best log2 lr and a parabola through it and its neighbours (log2 lr); None
    when every run diverged."""
    finite = {math.log2(k): v for k, v in losses.items() if math.isfinite(v)}
    if not finite:
        return None, None
    xs = sorted(finite)
    best = min(xs, key=lambda x: finite[x])
    i = xs.index(best)
    if 0 < i < len(xs) - 1:
        (x0, x1, x2), (y0, y1, y2) = xs[i - 1:i + 2], (finite[xs[i - 1]], finite[best], finite[xs[i + 1]])
        denom = (x0 - x1) * (x0 - x2) * (x1 - x2)
        a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / denom
        b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / denom
        if a > 0:
            return best, -b / (2 * a)
    return best, best


def report(results: list[dict[str, Any]], args: Any) -> list[str]:
    lines: list[str] = []
    summary = ["| model | parametrization | best log2 lr per width (grid; parabola) | optimum moves, factors of 2 (grid; parabola) | best val loss per width | wider never worse |",
               "|---|---|---|---|---|---|"]
    for model in args.models:
        for par in args.parametrizations:
            rows = [r for r in results if r["model"] == model and (r["parametrization"] == par or r["width"] == args.base)]
            if not rows:
                continue
            lrs = sorted({r["lr"] for r in rows})
            lines += [f"### {model}, {par}", "", "validation loss (nats/char) by width (rows) and lr (columns); "
                      "`-` not run, `inf` diverged; **bold**: the width's best", "",
                      "| width | " + " | ".join(f"2^{math.log2(lr):g}" for lr in lrs) + " |",
                      "|---|" + "---|" * len(lrs)]
            bests, fits, best_loss = [], [], []
            for width in args.widths:
                by_lr = {r["lr"]: r["val_loss"] for r in rows if r["width"] == width}
                grid, fit = optimum(by_lr)
                bests.append(grid)
                fits.append(fit)
                best_loss.append(min(by_lr.values()) if by_lr else math.inf)
                cells = []
                for lr in lrs:
                    v = by_lr.get(lr)
                    text = "-" if v is None else ("inf" if not math.isfinite(v) else f"{v:.3f}")
                    cells.append(f"**{text}**" if grid is not None and v is not None and math.log2(lr) == grid else text)
                lines.append(f"| {width} | " + " | ".join(cells) + " |")
            lines.append("")
            found = [b for b in bests if b is not None]
            moves = (max(found) - min(found)) if found else float("nan")
            fitted = [f for f in fits if f is not None]
            fit_moves = (max(fitted) - min(fitted)) if fitted else float("nan")
            never_worse = all(b2 <= b1 + 0.005 for b1, b2 in zip(best_loss, best_loss[1:], strict=False))
            summary.append(
                f"| {model} | {par} | " + ", ".join(
                    f"{w}: {b:g}; {f:.2f}" if b is not None and f is not None else f"{w}: -"
                    for w, b, f in zip(args.widths, bests, fits, strict=True))
                + f" | {moves:g}; {fit_moves:.1f} | " + ", ".join(f"{v:.3f}" for v in best_loss)
                + f" | {'yes' if never_worse else 'no'} |")
    return summary + [""] + transferred(results, args) + [""] + lines


def base_optimum(results: list[dict[str, Any]], model: str, base: int) -> float | None:
    """The grid's best log2 lr at the base width (where both parametrizations coincide)."""
    return optimum({r["lr"]: r["val_loss"] for r in results if r["model"] == model and r["width"] == base})[0]


def transfer_lrs(results: list[dict[str, Any]], model: str, args: Any) -> dict[str, dict[int, float]]:
    """What a study tuning at the base width runs at each width: the base's best lr unchanged
    (standard, and μP), and the ``scaled`` rule's lr x base / width (standard)."""
    best = base_optimum(results, model, args.base)
    if best is None:
        return {}
    return {"standard, same lr": {w: 2.0**best for w in args.widths},
            "standard, rule scaled (lr x base/width)": {w: 2.0**best * args.base / w for w in args.widths},
            "mup, same lr": {w: 2.0**best for w in args.widths}}


def transferred(results: list[dict[str, Any]], args: Any) -> list[str]:
    """The loss a study that tunes at the base width gets at each width, per transfer."""
    out = ["### Tuned at the base width, run at each width", "",
           f"The lr that is best at width {args.base} (both parametrizations coincide there), carried to "
           "each width as a study would carry it; validation loss, and in brackets how far it lies "
           "above that width's best over the grid of the same parametrization.", "",
           "| model | transfer | " + " | ".join(f"w={w}" for w in args.widths) + " |",
           "|---|---|" + "---|" * len(args.widths)]
    for model in args.models:
        for how, lrs in transfer_lrs(results, model, args).items():
            par = how.split(",")[0]
            cells = []
            for w in args.widths:
                here = [r for r in results if r["model"] == model and r["width"] == w
                        and (r["parametrization"] == par or w == args.base)]
                v = next((r["val_loss"] for r in here if r["lr"] == lrs[w]), None)
                best = min((r["val_loss"] for r in here), default=math.inf)
                cells.append("-" if v is None else f"{v:.3f} (+{v - best:.3f})")
            out.append(f"| {model} | {how} | " + " | ".join(cells) + " |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--parametrizations", nargs="+", default=["standard", "mup"], choices=["standard", "mup"])
    ap.add_argument("--widths", nargs="+", type=int, default=[32, 64, 128, 256])
    ap.add_argument("--log2-lr", nargs=2, type=int, default=[-14, -2], metavar=("LO", "HI"),
                    help="the range the grid may extend to")
    ap.add_argument("--start", nargs=2, type=int, default=[-10, -7], metavar=("LO", "HI"),
                    help="the powers of 2 every width tries first")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--warmup", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--val", type=int, default=64, help="validation windows of --length characters")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--raw", default="benchmarks/mup_transfer_raw.jsonl", help="finished runs (JSON lines)")
    ap.add_argument("--output", default="-", help="the Markdown record ('-': print only)")
    ap.add_argument("--report-only", action="store_true", help="no training: the record from --raw's runs")
    args = ap.parse_args()
    args.base = min(args.widths)

    import torch

    import harness
    from harness.bench.common import load_line, machine

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    registry = harness.load_plugins()
    started, load_before = datetime.now(UTC), load_line()
    raw = Path(args.raw)
    done = [json.loads(line) for line in raw.read_text().splitlines()] if raw.exists() else []
    key = lambda r: (r["model"], r["parametrization"], r["width"], r["lr"], r["steps"], r["seed"])  # noqa: E731
    finished = {key(r): r for r in done}

    def run(model: str, par: str, width: int, lr: float) -> tuple[float, dict[str, Any]]:
        job = {"model": model, "parametrization": par, "width": width, "lr": lr, "steps": args.steps,
               "seed": args.seed}
        if key(job) in finished:
            row = finished[key(job)]
            return row["val_loss"], row
        if args.report_only:
            return math.inf, job
        out = train_one(run_config(model, width, par, args.base, lr, args), registry)
        row = {**job, **out}
        finished[key(row)] = row
        done.append(row)
        with raw.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{model:12s} {par:9s} w={width:4d} lr=2^{math.log2(lr):g}: val {out['val_loss']:.4f} "
              f"({out['seconds']:.1f} s)", flush=True)
        return out["val_loss"], row

    for model in args.models:
        for par in args.parametrizations:
            for width in args.widths:
                if par == "mup" and width == args.base and "standard" in args.parametrizations:
                    continue  # the same model as the standard one at the base width
                bracket(functools.partial(lambda m, p, w, lr: run(m, p, w, lr)[0], model, par, width), args)
    for model in args.models:  # what a study tuning at the base width would run, where not run yet
        for how, lrs in transfer_lrs(done, model, args).items():
            par = how.split(",")[0]
            if par not in args.parametrizations:
                continue
            for width, lr in lrs.items():
                if not (width == args.base and par == "mup" and "standard" in args.parametrizations):
                    run(model, par, width, lr)
    results = [r for r in done if r["steps"] == args.steps and r["seed"] == args.seed]
    seconds = (datetime.now(UTC) - started).total_seconds()
    text = "\n".join([
        "# Learning-rate transfer across width: standard parametrization and μP (CPU)", "",
        f"- Machine: {machine('cpu')}",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC; this invocation took {seconds / 60:.1f} min "
        f"(runs already in {args.raw} were not repeated); run time summed over the runs "
        f"{sum(r['seconds'] for r in results) / 60:.1f} min",
        f"- Command: `OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '?')} OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY', '?')} python {' '.join(sys.argv)}`",
        f"- Machine load: before {load_before}; after {load_line()} (a shared 2-core machine: other "
        f"sessions' tests and benchmarks ran; the losses do not depend on the load)",
        f"- Setup: char_lm, {args.length} characters per example, batch {args.batch}, {args.steps} AdamW steps "
        f"({args.warmup} warm-up, cosine to 0.1 x lr, weight decay 0.01, clip 1.0), seed {args.seed}, "
        f"validation on {args.val} x {args.length} characters; μP base width {args.base}.", "",
        *report(results, args)])
    print(text)
    if args.output != "-":
        Path(args.output).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
