"""Training speed and peak memory of every LRA candidate on LRA's tasks, at the CPU profiles'
sizes and at longer inputs.

    python benchmarks/lra_speed.py [--settings listops-cpu pathfinder-cpu pathfinder-4096 ...]
                                   [--min-time 3] [--timeout 240] [--output PATH]

For each setting (a task at one length, a model size and a batch) and each candidate of the
LRA studies (multi-head, Linformer, Performer, Reformer, Longformer, linear attention, S4D and
Mamba both ways), a fresh process builds the model as the studies do (``transformer``, mean
pooling, LRA's MLP classifier), draws the task's examples, and times full training steps
(forward, cross-entropy, backward, AdamW) on one batch: the median over at least
``--min-time`` seconds, after one warm-up step. Reported: training tokens per second (batch x
padded width / median step) and the peak tensor memory of one step (parameters, gradients,
optimiser state, activations: :class:`harness.runtime.memory.TensorMemory`). A candidate that fails,
runs out of memory or passes ``--timeout`` is a row with the reason, never a missing row.
Writes a new dated record (``benchmarks/lra_speed_<device>_<date>.md``) with the machine, its
load and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

#: name -> (task, task params, model params, batch)
SETTINGS: dict[str, tuple[str, dict[str, Any], dict[str, Any], int]] = {
    "listops-cpu": ("listops", {"length": 64, "min_length": 16, "num_train": 64},
                    {"d_model": 32, "layers": 2, "heads": 2, "ffn_mult": 2}, 32),
    "pathfinder-cpu": ("pathfinder", {"length": 256, "contour_length": 5, "num_distractors": 2,
                                      "distractor_length": 2, "marker_radius": 0, "num_train": 32},
                       {"d_model": 32, "layers": 1, "heads": 2, "ffn_mult": 2}, 32),
    "listops-2000": ("listops", {"length": 2000, "min_length": 500, "num_train": 4},
                     {"d_model": 32, "layers": 2, "heads": 2, "ffn_mult": 2}, 4),
    "pathfinder-1024": ("pathfinder", {"length": 1024, "num_train": 8},
                        {"d_model": 32, "layers": 1, "heads": 2, "ffn_mult": 2}, 8),
    "pathfinder-4096": ("pathfinder", {"length": 4096, "num_train": 2},
                        {"d_model": 32, "layers": 1, "heads": 2, "ffn_mult": 2}, 2),
    "pathx-16384": ("pathfinder", {"length": 16384, "paddle_length": 5, "gap": 2, "num_distractors": 8,
                                   "marker_radius": 2, "num_train": 1},
                    {"d_model": 32, "layers": 1, "heads": 2, "ffn_mult": 1}, 1),
}
CANDIDATES: dict[str, dict[str, Any]] = {
    "multi_head": {"attention": "multi_head", "position": "sinusoidal"},
    "linformer": {"attention": "linformer", "position": "sinusoidal"},  # max_length: the task's
    "performer": {"attention": "performer", "position": "sinusoidal"},
    "reformer": {"attention": "reformer", "position": "sinusoidal"},
    "longformer": {"attention": "longformer", "position": "sinusoidal"},
    "linear": {"attention": "linear", "position": "sinusoidal"},
    "s4d": {"mixer": "s4d", "position": "none", "bidirectional_mixer": True},
    "mamba": {"mixer": "mamba", "position": "none", "bidirectional_mixer": True},
}


#: (setting, candidate) -> why it is not run on a shared CPU (``--force`` runs it anyway).
#: Empty: multi_head at 16,384 tokens was feared to hold 16,384 x 16,384 scores per head, but
#: PyTorch's fused kernel does not (29 MB, 2026-11-25).
NOT_RUN: dict[tuple[str, str], str] = {}


def measure(job: dict[str, Any]) -> dict[str, Any]:
    """In the worker: time training steps of one candidate on one setting."""
    import torch

    import harness
    from harness.data.formats import CLASSIFICATION
    from harness.runtime.memory import MB, TensorMemory, tensors_in

    torch.set_num_threads(1)
    task_name, task_params, model_params, batch = SETTINGS[job["setting"]]
    registry = harness.load_plugins()
    spec = registry.get("task", task_name)
    task = spec.build(spec.config(**task_params), seed=0)
    examples = list(task.examples("train", task.train_length))
    while len(examples) < batch:
        examples += examples
    b = CLASSIFICATION.collate(examples[:batch], "classification")
    b.pop("examples")
    width = int(b["tokens"].shape[1])
    kw = dict(CANDIDATES[job["candidate"]])
    if kw.get("attention") == "linformer":
        kw["attention_params"] = {"max_length": width}
    torch.manual_seed(0)
    model = harness.create_model("transformer", batch_format="classification", num_classes=task.num_classes,
                                 vocab_size=task.vocab.size, max_length=width, pool="mean",
                                 classifier="mlp", **model_params, **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        logits = model(b["tokens"], padding_mask=b["padding_mask"])
        loss = torch.nn.functional.cross_entropy(logits, b["targets"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()  # warm-up (and AdamW's state)
    meter = TensorMemory()
    meter.add(tensors_in([list(model.parameters()), [p.grad for p in model.parameters() if p.grad is not None],
                          list(opt.state.values()), b]))
    with meter:
        step()
    times: list[float] = []
    while not times or (sum(times) < job["min_time"] and len(times) < 20):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2]
    return {"width": width, "batch": batch, "step_s": median, "steps": len(times),
            "tokens_per_s": batch * width / median, "peak_mb": meter.peak / MB,
            "params": sum(p.numel() for p in model.parameters())}


def run(setting: str, candidate: str, min_time: float, timeout: float) -> tuple[dict[str, Any] | None, str]:
    job = {"setting": setting, "candidate": candidate, "min_time": min_time}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    try:
        done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], capture_output=True,
                              text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"over the {timeout:.0f} s limit (building, one warm-up and timed steps)"
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        reason = f"killed by signal {-done.returncode} (out of memory?)" if done.returncode < 0 else (
            lines[-1][:160] if lines else f"exit code {done.returncode}")
        return None, f"failed: {reason}"
    return json.loads(done.stdout.strip().splitlines()[-1]), "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=["listops-cpu", "pathfinder-cpu", "pathfinder-4096"],
                        choices=sorted(SETTINGS))
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    parser.add_argument("--min-time", type=float, default=3.0, help="seconds of timed steps per candidate")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per candidate and setting")
    parser.add_argument("--output", help="record path (default: benchmarks/lra_speed_cpu_<date>.md; - for none)")
    parser.add_argument("--force", action="store_true", help="also run what NOT_RUN skips")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(json.loads(args.worker))), flush=True)
        return
    from harness.bench import common

    started, load_before, t0 = datetime.now(UTC), common.load_line(), time.time()
    body = []
    for setting in args.settings:
        task_name, task_params, model_params, batch = SETTINGS[setting]
        body += [f"\n## {setting}\n", f"Task `{task_name}` {task_params}; model {model_params}, mean pooling, "
                 f"MLP classifier; batch {batch}; 1 thread.\n",
                 "| candidate | tokens/s | step (s) | peak tensor MB | params | width | note |",
                 "|---|---|---|---|---|---|---|"]
        for candidate in args.candidates:
            skip = None if args.force else NOT_RUN.get((setting, candidate))
            result, status = (None, skip) if skip else run(setting, candidate, args.min_time, args.timeout)
            if result is None:
                row = f"| {candidate} | — | — | — | — | — | {status} |"
            else:
                row = (f"| {candidate} | {result['tokens_per_s']:,.0f} | {result['step_s']:.3f} | "
                       f"{result['peak_mb']:,.1f} | {result['params']:,} | {result['width']} | "
                       f"median of {result['steps']} steps |")
            print(setting, row, flush=True)
            body.append(row)
    text = common.header("LRA candidates: training tokens/s and peak memory (CPU)", device="cpu",
                         command="python " + " ".join(sys.argv), started=started,
                         seconds=time.time() - t0, load_before=load_before, load_after=common.load_line())
    text += ("\nA shared 2-core machine: other sessions' processes compete for the cores (the load "
             "above), so absolute numbers are slower than on an idle machine; every candidate of a "
             "setting ran under about the same load, one after the other. Peak tensor MB counts the "
             "storages operations return (harness.runtime.memory.TensorMemory): a fused kernel's internal "
             "workspace is not seen.\n" + "\n".join(body) + "\n")
    common.write_record(common.record_path(args.output, "lra_speed", "cpu", started), text)


if __name__ == "__main__":
    main()
