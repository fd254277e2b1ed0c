"""Do the early rungs of a successive-halving search pick the learning rate the full run
would pick?  Trains one exported run config at a grid of learning rates x seeds for the full
step budget, reads the objective at each rung from the run's MLflow history, and prints how
well each rung's ranking of the learning rates predicts the final one (Spearman's rho over the
per-lr means, scipy.stats.spearmanr) and which lr each rung would keep.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/rung_fidelity.py \
        benchmarks/studies/attention_variants/configs/sliding_window.yaml \
        --lrs 1e-3 1.6e-3 2.5e-3 4e-3 6.3e-3 1e-2 --seeds 1 2 --rungs 100 300 600

Prints a Markdown table (append it to benchmarks/rung_fidelity.md with the machine).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--lrs", type=float, nargs="+", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rungs", type=int, nargs="+", required=True, help="steps; the last is the full budget")
    ap.add_argument("--metric", default="val/acc")
    ap.add_argument("--minimize", action="store_true", help="lower is better (loss, bpc)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra overrides, e.g. train.warmup_steps=30")
    args = ap.parse_args()
    os.environ.setdefault("HARNESS_HOME", tempfile.mkdtemp(prefix="rung-fidelity-"))

    import scipy.stats
    from mlflow.tracking import MlflowClient

    import harness
    from harness.store.tracking import tracking_uri
    from harness.yaml_io import parse_value, read_yaml

    base = read_yaml(args.config)
    base.pop("kind", None)
    client = MlflowClient(tracking_uri=tracking_uri())
    values: dict[float, list[dict[int, float]]] = {}
    t0 = time.time()
    for lr in args.lrs:
        for seed in args.seeds:
            cfg = {**base, "train": {**base["train"], "lr": lr, "seed": seed,
                                     "max_steps": args.rungs[-1], "val_every": args.rungs[0],
                                     "log_attention": False, "save_model": False}}
            for item in args.set:
                key, _, raw = item.partition("=")
                section, _, field = key.partition(".")
                cfg[section] = {**cfg[section], field: parse_value(raw, key)}
            result = harness.train(cfg)
            # MLflow's step is the 0-based index of the last batch: rung r is step r - 1
            history = {m.step + 1: m.value for m in client.get_metric_history(result.run_id, args.metric)}
            values.setdefault(lr, []).append(history)
            print(f"lr {lr:.2e} seed {seed}: " + ", ".join(
                f"{r}: {history.get(r, float('nan')):.3f}" for r in args.rungs), flush=True)
    wall = time.time() - t0

    def mean_at(lr: float, rung: int) -> float:
        return statistics.fmean(h.get(rung, float("nan")) for h in values[lr])

    final = [mean_at(lr, args.rungs[-1]) for lr in args.lrs]
    print(f"\n`{args.config}`, {args.metric}, seeds {args.seeds}, {' '.join(args.set)} "
          f"({wall / 60:.1f} min on {cpu_model()}, "
          f"{os.cpu_count()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')})\n")
    print("| lr | " + " | ".join(f"step {r}" for r in args.rungs) + " |")
    print("|---|" + "---|" * len(args.rungs))
    for lr in args.lrs:
        print(f"| {lr:.2e} | " + " | ".join(
            f"{mean_at(lr, r):.3f} (" + ", ".join(f"{h.get(r, float('nan')):.2f}" for h in values[lr]) + ")"
            for r in args.rungs) + " |")
    print("\n| rung | Spearman rho with the final ranking (p) | lr it keeps | that lr's final mean |")
    print("|---|---|---|---|")
    for r in args.rungs:
        at = [mean_at(lr, r) for lr in args.lrs]
        rho = (scipy.stats.spearmanr(at, final) if len(set(final)) > 1 and len(set(at)) > 1
               else None)  # a constant ranking has no rank correlation
        pick = min if args.minimize else max
        keep = args.lrs[pick(range(len(at)), key=at.__getitem__)]
        corr = f"{rho.statistic:.2f} ({rho.pvalue:.2f})" if rho else "n/a (a constant ranking: ties)"
        print(f"| {r} | {corr} | {keep:.2e} | "
              f"{final[args.lrs.index(keep)]:.3f} |")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


if __name__ == "__main__":
    main()
