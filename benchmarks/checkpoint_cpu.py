"""What resumable checkpoints cost on the CPU: time and size per checkpoint and the share of
training time, for the default Transformer and a ~100M-parameter one.

    python benchmarks/checkpoint_cpu.py [--big-layers 14] [--out benchmarks/checkpoint_cpu_DATE.md]

Each model trains for real (``harness.train``, one CPU thread) with ``train.checkpoint_every``
set so that it writes several checkpoints; the run's own ``cost/checkpoint_s`` (every save:
Lightning's state dump, the generator states, ``torch.save`` to memory, SHA-256, write with
fsync, rename, pruning) and ``cost/fit_s`` give the time per checkpoint and the overhead at
that interval, and the overhead at the GPU default (one checkpoint every 30 minutes) is the
time per checkpoint / 1800 s. For the big model the parts of one save are also timed on
their own (serialise, hash, write + fsync) on the model's and AdamW's state.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import io
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")


def run(name: str, model: dict[str, Any], task: dict[str, Any], train: dict[str, Any], tmp: Path) -> dict[str, Any]:
    from harness.run import checkpoint
    from harness.run.pipeline import train as harness_train

    os.environ["HARNESS_HOME"] = str(tmp / name)
    cfg = {"task": task, "model": model, "tracking": {"uri": f"sqlite:///{tmp / name}.db"},
           "train": {"progress": False, "num_threads": 1, "log_attention": False, "checkpoint_keep": 100,
                     "checkpoint_best": False, **train}}
    result = harness_train(cfg)
    root = checkpoint.folder(result.run_id)
    files = checkpoint.step_files(root)
    sizes = [p.stat().st_size for _, p in files]
    n = len(files)
    m = result.metrics
    per = m["cost/checkpoint_s"] / n
    steps = train["max_steps"]
    step_s = (m["cost/fit_s"] - m["cost/checkpoint_s"]) / steps
    return {"name": name, "params": int(m["cost/params"]), "checkpoints": n, "size_mb": statistics.mean(sizes) / 2**20,
            "save_s": per, "fit_s": m["cost/fit_s"], "step_s": step_s, "every": train["checkpoint_every"],
            "overhead": m["cost/checkpoint_s"] / m["cost/fit_s"], "overhead_30min": per / 1800}


def parts(d_model: int, layers: int, heads: int) -> dict[str, float]:
    """One save's parts on a model's and AdamW's state (after one step, so AdamW has state)."""
    import torch

    import harness

    model = harness.create_model("transformer", vocab_size=12, max_length=32, d_model=d_model, layers=layers,
                                 heads=heads)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randint(4, 12, (2, 16))).float().mean().backward()
    opt.step()
    payload = {"state_dict": model.state_dict(), "optimizer_states": [opt.state_dict()]}
    out: dict[str, float] = {}
    started = time.perf_counter()
    buf = io.BytesIO()
    torch.save(payload, buf)
    out["serialise_s"] = time.perf_counter() - started
    data = buf.getbuffer()
    started = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    out["sha256_s"] = time.perf_counter() - started
    with tempfile.NamedTemporaryFile(dir=os.environ.get("HARNESS_BENCH_DISK")) as fh:
        started = time.perf_counter()
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
        out["write_fsync_s"] = time.perf_counter() - started
    out["mb"] = len(data) / 2**20
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big-layers", type=int, default=14)
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, to check the script runs (tests/test_benchmark_scripts.py)")
    args = parser.parse_args()
    width, heads, steps = (128, 8, 40) if args.quick else (768, 12, 400)
    if args.quick:
        args.big_layers = 1
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        rows.append(run("default transformer", {"name": "transformer"}, {"name": "copy"},
                        {"max_steps": steps, "val_every": steps // 2, "checkpoint_every": steps // 4}, tmp))
        big = {"name": "transformer", "params": {"d_model": width, "layers": args.big_layers, "heads": heads}}
        rows.append(run("~100M transformer", big,
                        {"name": "copy", "params": {"length": 16, "num_train": 64, "num_val": 8}},
                        {"max_steps": 6, "batch_size": 4, "val_every": 6, "checkpoint_every": 2}, tmp))
        split = parts(width, args.big_layers, heads)
    load_after = os.getloadavg()
    import torch

    lines = [
        f"# Checkpoint cost on the CPU ({datetime.date.today()})",
        "",
        f"Command: `OMP_NUM_THREADS=1 python {' '.join(sys.argv)}`. Machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, {platform.python_version()}, torch {torch.__version__}, one torch "
        f"thread; load average before {load_before[0]:.1f}, after {load_after[0]:.1f} (a shared "
        f"machine: times are upper bounds).",
        "",
        "| model | params | checkpoints | MB each | s per checkpoint | train s per step | "
        "every (steps) | overhead at that interval | overhead at 30 min (GPU default) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {r['params']:,} | {r['checkpoints']} | {r['size_mb']:.1f} | "
                     f"{r['save_s']:.3f} | {r['step_s']:.3f} | {r['every']} | {100 * r['overhead']:.2f}% | "
                     f"{100 * r['overhead_30min']:.4f}% |")
    lines += ["", f"Parts of one save of the ~100M model's and AdamW's state ({split['mb']:.0f} MB): "
              f"torch.save to memory {split['serialise_s']:.2f} s, SHA-256 {split['sha256_s']:.2f} s, "
              f"write + fsync {split['write_fsync_s']:.2f} s.", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
