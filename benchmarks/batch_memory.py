"""Batches bigger than memory on the CPU: what gradient accumulation costs in time per optimizer
step and saves in peak memory, and what activation checkpointing saves and costs.

    OMP_NUM_THREADS=1 python benchmarks/batch_memory.py [--quick] [--out PATH]

One optimizer batch (``--batch`` examples of the copy task at ``--length`` symbols, an lm batch of
2 x length + 1 input tokens per example) trains through the harness's own training step
(``HarnessSystem.training_step`` on the micro-batches ``harness.run.accumulate.split`` cuts,
backward, AdamW), for a Transformer (multi-head attention) and a Mamba stack:

* *accumulation*: micro-batch sizes from the whole batch down to an eighth of it;
* *checkpointing*: the whole batch with ``train.activation_checkpointing`` off and on.

Peak memory is the step's peak tensor memory counted tensor by tensor
(``harness.runtime.memory.TensorMemory``, what ``cost/peak_tensor_mb`` reports: parameters,
gradients, AdamW state, the batch and every activation), so it is exact and repeatable on a
shared machine; time is the median of ``--reps`` optimizer steps after one warm-up (upper
bounds: the machine is shared; its load is in the record).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from datetime import datetime
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

MODELS = {
    "transformer": {"name": "transformer", "params": {"d_model": 128, "layers": 4, "heads": 4}},
    "mamba": {"name": "transformer", "params": {"d_model": 128, "layers": 4, "heads": 4, "mlp": "none"},
              "mixer": {"name": "mamba"}},
}


def setup(model: dict[str, Any], batch: int, length: int, micro: int, checkpointing: bool) -> tuple[Any, ...]:
    import torch

    from harness.config import parse_run_config
    from harness.nn.checkpointing import checkpoint_blocks
    from harness.run.accumulate import split
    from harness.run.build import build
    from harness.run.optim import make_optimizer
    from harness.run.plan import load_registry, plan
    from harness.run.system import HarnessSystem

    cfg = parse_run_config({"task": {"name": "copy", "params": {"length": length, "num_train": batch,
                                                               "num_val": 4}},
                            "model": model, "train": {"batch_size": batch, "micro_batch_size": micro}})
    p = plan(cfg, load_registry(cfg, None))
    built = build(p)
    examples = built.task.examples("train", built.task.train_length)[:batch]
    whole = p.fmt.collate(examples, built.task.task_kind)
    whole.pop("examples")
    parts = split(whole, p.fmt, micro) if micro < batch else [whole]
    if checkpointing:
        checkpoint_blocks(built.model)
    system = HarnessSystem(built.model, built.task, p.fmt, p.config.train).train()
    opt, _ = make_optimizer(built.model, p.config.train)
    torch.manual_seed(0)
    return system, opt, parts, p.fmt.tokens(whole)


def optimizer_step(system: Any, opt: Any, parts: list[dict[str, Any]]) -> None:
    for i, part in enumerate(parts):
        loss = system.training_step(part, i)
        (loss / len(parts)).backward()  # what Lightning does with what training_step returns
    opt.step()
    opt.zero_grad(set_to_none=True)


def measure(model: dict[str, Any], batch: int, length: int, micro: int, checkpointing: bool,
            reps: int) -> dict[str, float]:
    from harness.run.meters import step_state
    from harness.runtime.memory import TensorMemory

    system, opt, parts, tokens = setup(model, batch, length, micro, checkpointing)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log outside a Trainer
        optimizer_step(system, opt, parts)  # warm-up; AdamW's state exists from here on
        meter = TensorMemory("cpu")
        meter.add(step_state(system, [opt], parts))
        with meter:
            optimizer_step(system, opt, parts)
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            optimizer_step(system, opt, parts)
            times.append(time.perf_counter() - started)
    step_s = statistics.median(times)
    return {"peak_mb": meter.peak / 2**20, "step_s": step_s, "tokens_per_s": tokens / step_s}


def main() -> int:
    from harness.bench.common import load_line, machine, record_path, write_record

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=None, help="record path ('-': none; default benchmarks/batch_memory_cpu_DATE.md)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the script runs")
    args = parser.parse_args()
    if args.quick:
        args.batch, args.length, args.reps = 8, 8, 1
    started, load_before = datetime.now(), load_line()
    micros = [args.batch, args.batch // 2, args.batch // 4, args.batch // 8]
    lines = ["## Gradient accumulation (one optimizer batch of "
             f"{args.batch} examples, {2 * args.length + 1} input tokens each)", "",
             "| model | micro-batch | micro-batches per step | peak tensor MB | s per optimizer step | "
             "tokens/s | time vs whole batch |", "|---|---|---|---|---|---|---|"]
    for name, model in MODELS.items():
        base = None
        for micro in micros:
            m = measure(model, args.batch, args.length, micro, False, args.reps)
            base = base or m["step_s"]
            lines.append(f"| {name} | {micro} | {-(-args.batch // micro)} | {m['peak_mb']:.1f} | "
                         f"{m['step_s']:.3f} | {m['tokens_per_s']:,.0f} | {m['step_s'] / base - 1:+.0%} |")
            print(lines[-1], flush=True)
    lines += ["", f"## Activation checkpointing (the whole batch of {args.batch})", "",
              "| model | checkpointing | peak tensor MB | saved | s per optimizer step | time cost |",
              "|---|---|---|---|---|---|"]
    for name, model in MODELS.items():
        off = measure(model, args.batch, args.length, args.batch, False, args.reps)
        on = measure(model, args.batch, args.length, args.batch, True, args.reps)
        lines.append(f"| {name} | off | {off['peak_mb']:.1f} | | {off['step_s']:.3f} | |")
        lines.append(f"| {name} | on | {on['peak_mb']:.1f} | {1 - on['peak_mb'] / off['peak_mb']:.0%} | "
                     f"{on['step_s']:.3f} | {on['step_s'] / off['step_s'] - 1:+.0%} |")
        print("\n".join(lines[-2:]), flush=True)
    seconds = (datetime.now() - started).total_seconds()
    command = "OMP_NUM_THREADS=1 python benchmarks/batch_memory.py " + " ".join(sys.argv[1:])
    text = "\n".join([
        "# Batches bigger than memory on the CPU: accumulation and activation checkpointing", "",
        f"- Machine: {machine('cpu')}; one torch thread",
        f"- Date: {started:%Y-%m-%d %H:%M}; the run took {seconds / 60:.1f} min",
        f"- Command: `{command}`",
        f"- Machine load: before {load_before}; after {load_line()} (shared: times are upper bounds)",
        "- Peak tensor memory: counted tensor by tensor over one optimizer step "
        "(harness.runtime.memory.TensorMemory): parameters, gradients, AdamW state, batch, activations.",
        "", *lines, ""])
    write_record(record_path(args.out, "batch_memory", "cpu", started), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
