"""What FlopCounterMode does not see, per token mixer: the evidence behind docs/scaling.md.

    python benchmarks/uncounted_flops.py [--d-model 64] [--layers 2] [--lengths 64,256]

For attention (multi_head, RoPE) and every registered mixer in the same pre-norm backbone on
char_lm, one training step (forward, loss, backward) is run under the harness's counter
(:func:`harness.run.flops.flop_counter`: matrix products, the fused attention kernels
included) and under a dispatch mode that adds up everything else
(:func:`harness.run.flops.probe` with ``measure_uncounted=True``: one FLOP per element an
arithmetic operation writes, 5·n·log2(n) per FFT of length n). Prints the counted FLOPs per
token, the uncounted ones and their ratio; the table is recorded in
``benchmarks/uncounted_flops.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    import torch

    from harness.config import parse_run_config
    from harness.run.flops import probe
    from harness.run.plan import load_registry, plan

    ap = argparse.ArgumentParser()
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lengths", default="64,256")
    args = ap.parse_args()
    torch.set_num_threads(1)
    started = time.time()
    registry = None
    lengths = [int(x) for x in args.lengths.split(",")]
    print(f"d_model {args.d_model}, {args.layers} layers, ffn_mult 4; FLOPs per token of one "
          f"training step\n")
    print("| layer | " + " | ".join(f"counted @{n} | uncounted @{n} | share @{n}" for n in lengths) + " |")
    print("|---|" + "---|---|---|" * len(lengths))
    base = {"name": "transformer", "params": {"d_model": args.d_model, "layers": args.layers,
                                              "heads": 4, "ffn_mult": 4, "dropout": 0.0}}
    registry = load_registry(parse_run_config({"task": {"name": "char_lm"}, "model": base}), None)
    layers = [("attention (multi_head)", {"attention": {"name": "multi_head"},
                                          "position": {"name": "rope"}})]
    layers += [(m, {"mixer": {"name": m}, "position": {"name": "none"}})
               for m in registry.names("mixer")]
    for label, parts in layers:
        cells = []
        for n in lengths:
            cfg = parse_run_config({"task": {"name": "char_lm", "params": {
                "length": n, "num_train": 64, "num_val": 4}}, "model": {**base, **parts},
                "train": {"batch_size": 4}})
            try:
                cost = probe(plan(cfg, registry), measure_uncounted=True)
            except Exception as exc:  # a mixer that cannot run at this length
                cells.append(f"{type(exc).__name__} | | ")
                continue
            share = cost.uncounted_per_token / cost.flops_per_token
            cells.append(f"{cost.flops_per_token:,.0f} | {cost.uncounted_per_token:,.0f} | {share:.1%}")
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    print(f"\n{platform.platform()}, Python {platform.python_version()}, torch {torch.__version__}; "
          f"{time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
