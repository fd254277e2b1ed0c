"""μP against the standard parametrization across width, as Tensor Programs V does it (Yang et
al. 2022, arXiv:2203.03466, Fig. 1 and section 7), at CPU size.

Phases, per model (each finished run appended to ``--raw`` as a JSON line, so an interrupted
benchmark resumes where it stopped and nothing finished is lost):

1. ``grid``: at the base width, μP (the standard model when every multiplier is 1) over the
   learning rate x output multiplier (``model.mup.output_mult``), ``--grid-seeds`` seeds;
2. ``sweep``: at that optimum, one-dimensional sweeps of the other multipliers
   (``input_mult``, ``attn_mult`` where the model has attention, ``init_std_mult``,
   ``zero_readout``); each kept where it lowers the mean loss by more than ``--keep``;
3. ``mup``: μP at every width with the base-tuned multipliers, over the learning rates around
   the base's best (``--lr-steps`` grid steps each side) on the first seed, and the other
   seeds at the base's best (``--all-lrs``: at every lr);
4. ``sp``: the standard parametrization at every width over its learning-rate grid (bracketed
   on the first seed until the best lies inside), the other seeds at that best.

A width at a time, smallest first: what an interrupted run leaves is complete up to a width.

The same steps, batch and tokens at every width; validation on ``--val`` windows. Widths grow
the Transformer by heads at a fixed head dimension (``--head-dim``; ``model.base`` names the
heads), so its attention keeps the standard 1/sqrt(d_head) scale at every width.
``benchmarks/mup_width_report.py`` writes the record and figures from the rows::

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/mup_width.py --models transformer lstm
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from mup_transfer import train_one  # noqa: E402

MODELS = {
    "transformer": {"name": "transformer", "params": {"layers": 2},
                    "attention": {"name": "multi_head"}, "position": {"name": "rope"}},
    "lstm": {"name": "lstm", "params": {"layers": 2, "tie_embeddings": False}},
    "gla": {"name": "transformer", "params": {"layers": 2}, "mixer": {"name": "gla"}},
    "mamba2": {"name": "transformer", "params": {"layers": 2, "mlp": "none"},
               "mixer": {"name": "mamba2", "params": {"headdim": 16}}},
}
WIDTH_PARAM = {"lstm": "width"}
HAS_ATTENTION = {"transformer", "gla"}
SWEEPS = {"input_mult": [0.5, 2.0], "attn_mult": [0.5, 2.0], "init_std_mult": [0.5, 2.0], "zero_readout": [True]}


def model_config(model: str, width: int, par: str, base: int, mults: dict[str, Any], args: Any) -> dict[str, Any]:
    m = json.loads(json.dumps(MODELS[model]))
    key = WIDTH_PARAM.get(model, "d_model")
    m["params"][key] = width
    grown = {key: base}
    if key == "d_model":  # heads grow with width at a fixed head dimension
        m["params"]["heads"] = width // args.head_dim
        grown["heads"] = base // args.head_dim
    if par == "mup":
        m["parametrization"], m["base"] = "mup", grown
        if mults:
            m["mup"] = mults
    return m


def run_config(model: str, width: int, par: str, lr: float, mults: dict[str, Any], seed: int,
               args: Any) -> dict[str, Any]:
    return {"task": {"name": "char_lm", "params": {"length": args.length, "num_train": args.steps * args.batch,
                                                   "num_val": args.val}},
            "model": model_config(model, width, par, args.base, mults, args),
            "train": {"max_steps": args.steps, "batch_size": args.batch, "lr": lr,
                      "warmup_steps": args.warmup, "seed": seed}}


class Runs:
    """The finished runs (``--raw``), keyed by what was run; runs what is missing."""

    def __init__(self, args: Any, registry: Any) -> None:
        self.args, self.registry, self.path = args, registry, Path(args.raw)
        self.done: dict[str, dict[str, Any]] = {}
        self.read()

    def read(self) -> None:
        """The rows in ``--raw`` (again before each run: another process may share the file)."""
        rows = [json.loads(line) for line in self.path.read_text().splitlines()] if self.path.exists() else []
        self.done.update({self.key(r): r for r in rows})

    @staticmethod
    def key(r: dict[str, Any]) -> str:
        return json.dumps([r["model"], r["parametrization"], r["width"], r["lr"], r["mults"], r["seed"],
                           r["steps"], r["batch"], r["length"]], sort_keys=True)

    def loss(self, model: str, par: str, width: int, lr: float, mults: dict[str, Any], seed: int,
             phase: str) -> float:
        a = self.args
        if par == "standard" and width == a.base:  # μP with no multipliers is the standard model there
            par, mults = "mup", {}
        job = {"model": model, "parametrization": par, "width": width, "lr": lr, "mults": mults, "seed": seed,
               "steps": a.steps, "batch": a.batch, "length": a.length}
        if self.key(job) not in self.done:
            self.read()
        if self.key(job) in self.done:
            return float(self.done[self.key(job)]["val_loss"])
        if a.dry_run:
            return math.nan
        out = train_one(run_config(model, width, par, lr, mults, seed, a), self.registry)
        row = {**job, "phase": phase, "val": a.val, **out, "load": os.getloadavg()[0], "finished": time.time()}
        self.done[self.key(row)] = row
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{phase:5s} {model:11s} {par:8s} w={width:4d} lr=2^{math.log2(lr):g} {mults} s{seed}: "
              f"{out['val_loss']:.4f} ({out['seconds']:.0f} s, load {row['load']:.1f})", flush=True)
        return float(out["val_loss"])

    def mean(self, model: str, par: str, width: int, lr: float, mults: dict[str, Any], seeds: int,
             phase: str) -> float:
        vals = [self.loss(model, par, width, lr, mults, s, phase) for s in range(seeds)]
        vals = [v if math.isfinite(v) else 10.0 for v in vals]  # a diverged run counts as very bad
        return statistics.fmean(vals)


def cache_tasks() -> None:
    """Every run reads the same task (its params and data seed): build it once (2 s a run)."""
    import harness.run.build as build

    built: dict[str, Any] = {}
    plain = build.build_task

    def cached(p: Any, seed: int) -> Any:
        key = json.dumps([p.task.as_dict(), seed], sort_keys=True, default=str)
        if key not in built:
            built[key] = plain(p, seed)
        return built[key]

    build.build_task = cached  # type: ignore[assignment]


def best_lr(losses: dict[int, float]) -> int:
    return min(losses, key=lambda e: losses[e])


def bracket(loss: Any, start: list[int], limits: tuple[int, int]) -> dict[int, float]:
    """log2 lr -> loss over ``start``, extended a step at a time beyond the best end until the
    best lies inside (within ``limits``)."""
    tried = {e: loss(e) for e in start}
    while True:
        b = best_lr(tried)
        if b == min(tried) and b > limits[0]:
            e = b - 1
        elif b == max(tried) and b < limits[1]:
            e = b + 1
        else:
            return tried
        tried[e] = loss(e)


def tune_base(runs: Runs, model: str, args: Any) -> dict[str, Any]:
    """Phases 1 and 2 at the base width: the lr and multipliers μP carries to every width."""
    base, seeds = args.base, args.grid_seeds
    losses = {}
    for out in args.output_mults:
        mults = {} if out == 1 else {"output_mult": out}
        got = bracket(lambda e, m=mults: runs.mean(model, "mup", base, 2.0**e, m, seeds, "grid"),
                      list(range(args.lr_start[0], args.lr_start[1] + 1)), tuple(args.lr_limits))
        losses.update({(e, out): v for e, v in got.items()})
    (lr, out), best = min(losses.items(), key=lambda kv: kv[1])
    standard = min((k for k in losses if k[1] == 1), key=lambda k: losses[k], default=(lr, 1))[0]
    mults: dict[str, Any] = {} if out == 1 else {"output_mult": out}
    for field, values in SWEEPS.items():
        if field == "attn_mult" and model not in HAS_ATTENTION:
            continue
        tried = {v: runs.mean(model, "mup", base, 2.0**lr, {**mults, field: v}, seeds, "sweep") for v in values}
        v, loss = min(tried.items(), key=lambda kv: kv[1])
        if loss < best - args.keep:
            mults, best = {**mults, field: v}, loss
    return {"log2_lr": lr, "mults": mults, "loss": best, "log2_lr_standard": standard}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["transformer", "lstm"], choices=list(MODELS))
    ap.add_argument("--widths", nargs="+", type=int, default=[64, 128, 256])
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--output-mults", nargs="+", type=float, default=[1.0, 4.0, 16.0])
    ap.add_argument("--lr-start", nargs=2, type=int, default=[-7, -5], metavar=("LO", "HI"))
    ap.add_argument("--lr-limits", nargs=2, type=int, default=[-12, -1], metavar=("LO", "HI"))
    ap.add_argument("--lr-steps", type=int, default=1, help="μP at each width: the base's best lr +- this many steps")
    ap.add_argument("--all-lrs", action="store_true", help="every seed at every lr (default: the seeds after the "
                    "first at μP's base-tuned lr and the standard parametrization's best lr of the first seed)")
    ap.add_argument("--keep", type=float, default=0.005, help="a swept multiplier is kept if it gains more (nats)")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--val", type=int, default=512, help="validation windows of --length characters")
    ap.add_argument("--grid-seeds", type=int, default=1, help="seeds per cell of the base's grid and sweeps")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per cell across width")
    ap.add_argument("--phases", nargs="+", default=["base", "mup", "sp"], choices=["base", "mup", "sp"])
    ap.add_argument("--raw", default="benchmarks/mup_width_raw.jsonl")
    ap.add_argument("--dry-run", action="store_true", help="train nothing: what the rows so far give")
    args = ap.parse_args()
    args.base = min(args.widths)

    import torch

    import harness

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cache_tasks()
    runs = Runs(args, harness.load_plugins())
    started = time.time()
    plan = {}
    for model in args.models:
        plan[model] = tuned = tune_base(runs, model, args)
        print(f"{model}: tuned at width {args.base}: lr 2^{tuned['log2_lr']}, {tuned['mults']}", flush=True)
        Path(args.raw).with_suffix(".plan.json").write_text(json.dumps(plan, indent=1) + "\n")
        sp_best: dict[int, int] = {}
        for width in args.widths:  # a width at a time, so that what finishes is complete to that width
            mup = lambda e, s, w=width, m=model, x=tuned["mults"]: runs.loss(m, "mup", w, 2.0**e, x, s, "mup")  # noqa: E731
            sp = lambda e, s, w=width, m=model: runs.loss(m, "standard", w, 2.0**e, {}, s, "sp")  # noqa: E731
            if "mup" in args.phases:
                mup(tuned["log2_lr"], 0)
            if "sp" in args.phases:  # bracketed on the first seed, starting from the last width's best
                last = sp_best[max(sp_best)] if sp_best else tuned["log2_lr_standard"]
                sp_best[width] = best_lr(bracket(lambda e, f=sp: f(e, 0), [last - 1, last, last + 1],
                                                 tuple(args.lr_limits)))
            for seed in range(args.seeds):
                lrs = args.lr_steps if seed == 0 or args.all_lrs else 0
                for d in range(-lrs, lrs + 1):
                    if "mup" in args.phases:
                        mup(tuned["log2_lr"] + d, seed)
                    if "sp" in args.phases and (seed > 0 or args.all_lrs):
                        sp(sp_best[width] + d, seed)
        plan[model]["sp_log2_lr"] = sp_best
        Path(args.raw).with_suffix(".plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    print(f"done in {(time.time() - started) / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
