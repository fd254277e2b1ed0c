"""The harness's per-step fixed cost: ``harness.train`` against a plain PyTorch loop and a bare
Lightning Trainer training the same model, in one process, step by step interleaved.

    python benchmarks/step_cost.py [--shape tiny|w256|all] [--steps 300] [--warmup 50] [--repeats 3]

Each repeat is a fresh process (``OMP_WAIT_POLICY=PASSIVE``, one torch thread) that builds the
shape's run (``harness.run.plan``/``build``: the harness's own model, three copies of the same
initialisation) and trains it three ways, one step of each in turn (the plain loop and
Lightning alternate which follows the harness), so all three see the same machine load
second by second (the machine is shared):

- ``harness``: ``harness.train`` with the config, MLflow tracking on (a store in a temporary
  ``HARNESS_HOME``), timed by ``harness.bench.model``'s step clock, which runs the other two
  systems' steps after each of its own and leaves their time out of the harness's;
- ``plain``: a hand-written loop: forward (the format's call, as the harness makes it),
  ``F.cross_entropy`` over the scored positions, backward, gradient clipping, the harness's
  optimiser and schedule (``harness.run.optim``), on the task's own batches collated once,
  no host read of the loss;
- ``lightning``: a bare ``L.Trainer`` (no logger, no callbacks, no checkpointing, no progress
  bar) fitting a ``LightningModule`` whose ``training_step`` is the plain loop's loss, with
  the same clipping, optimiser and schedule, in a thread that runs one step per turn.

Each of the three runs in a thread of its own (:class:`Worker`: none in the main thread).

Reported: steps per second of each (the steps after ``--warmup``; each system's time from the
start of its turn to the start of the next system's: data, hooks and logging included) in two
ways: from the median step time, which a shared machine's preemptions (a few steps made many
times longer) barely move, the harness's plus its flush cost spread over its window (a
window of training metrics closes every ``train.log_every`` steps: the closing steps' median
less the others' is the flush cost, reported too; :data:`harness.run.trainlog.LOG_EVERY` is
chosen from it); and from the mean step time, every pause included. Then the ratios per
repeat and their medians over repeats, and the harness's per-run fixed cost from the step
clock (``harness.bench.model``).
Each run appends its section to ``benchmarks/step_cost.md`` (``--out``) with the machine,
its load and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    # issue 51's tiny shape: width 32, 2 layers, 2 heads, length 32, batch 8
    "tiny": {"task": {"name": "char_lm", "params": {"length": 32, "num_train": 2000, "num_val": 2}},
             "model": {"name": "transformer", "params": {"d_model": 32, "layers": 2, "heads": 2}},
             "train": {"batch_size": 8}},
    # benchmarks/configs/transformer_char_lm.yaml: width 256, 4 layers, 4,096 tokens a step
    "w256": {"task": {"name": "char_lm", "params": {"length": 256, "num_train": 2000, "num_val": 2}},
             "model": {"name": "transformer", "params": {"d_model": 256, "layers": 4, "heads": 4}},
             "train": {"batch_size": 16}},
}
TARGETS = {"tiny": {"lightning": 0.95, "plain": 0.85}, "w256": {"plain": 1.0}}
RECORD = Path(__file__).with_name("step_cost.md")


def config(shape: str, steps: int, log_every: int | None) -> dict[str, Any]:
    cfg = json.loads(json.dumps(SHAPES[shape]))
    cfg["model"].update(attention={"name": "multi_head"}, position={"name": "sinusoidal"})
    cfg["train"].update(max_steps=steps, val_every=steps, lr=1e-3, progress=False, num_threads=1,
                        accelerator="cpu", log_attention=False, save_model=False)
    if log_every:
        cfg["train"]["log_every"] = log_every
    cfg["tracking"] = {"experiment": "step_cost"}
    return cfg


def single_thread() -> None:
    """What an in-process measurement of the tiny shape sets first (benchmarks/step_cost/):
    a store of its own unless HARNESS_HOME names one, one torch thread, no library warnings."""
    import logging

    import torch

    os.environ.setdefault("HARNESS_HOME", tempfile.mkdtemp())
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)


# -- in the worker process ------------------------------------------------------------------------
class Turns:
    """Hands the turn between the main thread and the Lightning thread, one step at a time."""

    def __init__(self) -> None:
        self.go, self.done = threading.Semaphore(0), threading.Semaphore(0)
        self.times: list[float] = []
        self.error: BaseException | None = None

    def step(self) -> None:
        self.go.release()
        self.done.acquire()
        if self.error is not None:
            raise RuntimeError("the bare Lightning side failed") from self.error


class Worker:
    """A thread of its own that runs one call at a time for the caller, timed in the thread.

    Each system trains in a thread of its own, none in the main thread: the main thread's
    memory (glibc's main arena) holds everything the imports and the set-up allocated, and a
    step's many small allocations are slower there (a plain loop measured 20-40% slower in
    the main thread than in a thread of its own, interleaved with the same bare Lightning
    Trainer), which would count against whichever system ran there."""

    def __init__(self) -> None:
        self.go, self.done = threading.Semaphore(0), threading.Semaphore(0)
        self.call: Any = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            self.go.acquire()
            start = time.perf_counter()
            try:
                self.result = self.call()
            except BaseException as exc:  # raised again in the caller's thread
                self.error = exc
            self.seconds = time.perf_counter() - start
            self.done.release()

    def run(self, call: Any) -> Any:
        self.call, self.error = call, None
        self.go.release()
        self.done.acquire()
        if self.error is not None:
            raise self.error
        return self.result


class Batches:
    """Pre-collated batches as a loader (a bare list would be read as a list of loaders)."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches

    def __iter__(self) -> Any:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def bare_module(model: Any, fmt: Any, train: Any) -> Any:
    """The bare Trainer's LightningModule: the plain loop's loss, optimiser and schedule."""
    import lightning as L
    import torch.nn.functional as F

    from harness.run.optim import make_optimizer

    class Bare(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, idx: int) -> Any:
            logits = fmt.call(self.model, batch)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["ignore"].reshape(-1))

        def configure_optimizers(self) -> Any:
            opt, sched = make_optimizer(self.model, train)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    return Bare()


def collated(p: Any, built: Any, batch_size: int, count: int = 16) -> list[dict[str, Any]]:
    """``count`` training batches collated once (the plain loop's and the bare Trainer's), each
    with ``ignore``: the targets with unscored positions at -100, which cross_entropy skips."""
    examples = built.task.examples("train", built.task.train_length)
    batches = []
    for i in range(0, count * batch_size, batch_size):
        batch = p.fmt.collate(examples[i:i + batch_size], built.task.task_kind)
        batch.pop("examples", None)
        batch["ignore"] = batch["targets"].masked_fill(~batch["loss_mask"], -100)
        batches.append(batch)
    return batches


def lightning_side(model: Any, fmt: Any, train: Any, batches: list[Any], steps: int, turns: Turns) -> threading.Thread:
    """A bare Lightning Trainer in a thread, one step per turn (see the module)."""
    import lightning as L

    class Turn(L.Callback):  # type: ignore[misc]
        def on_train_start(self, trainer: Any, module: Any) -> None:
            turns.done.release()
            turns.go.acquire()
            self.t = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
            turns.times.append(time.perf_counter() - self.t)
            last = trainer.global_step >= steps
            turns.done.release()
            if not last:
                turns.go.acquire()
                self.t = time.perf_counter()

    def run() -> None:
        try:
            trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, callbacks=[Turn()],
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                gradient_clip_val=train.grad_clip, num_sanity_val_steps=0, limit_val_batches=0)
            trainer.fit(bare_module(model, fmt, train), train_dataloaders=Batches([batches[i % len(batches)] for i in range(steps)]))
        except BaseException as exc:  # handed to the main thread
            import traceback

            traceback.print_exc()
            turns.error = exc
            turns.done.release()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    turns.done.acquire()  # set up, waiting for its first turn
    if turns.error is not None:
        raise RuntimeError("the bare Lightning side failed") from turns.error
    return thread


def plain_side(model: Any, fmt: Any, train: Any, batches: list[Any]) -> Any:
    """One step of the hand-written loop per call (see the module)."""
    import torch
    import torch.nn.functional as F

    from harness.run.optim import make_optimizer

    opt, sched = make_optimizer(model, train)
    model.train()

    def step(i: int) -> None:
        batch = batches[i % len(batches)]
        logits = fmt.call(model, batch)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["ignore"].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if train.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
        opt.step()
        sched.step()

    return step


def measure(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from harness.bench.model import _harness_run
    from harness.config import parse_run_config
    from harness.run.build import build
    from harness.run.plan import load_registry, plan
    try:
        from harness.run.trainlog import log_every
    except ImportError:  # the harness before its training metrics were windowed: Lightning's interval

        def log_every(t: Any) -> int:
            return max(1, min(50, t.val_every // 4))

    torch.set_num_threads(1)
    cfg = parse_run_config(job["config"])
    p = plan(cfg, load_registry(cfg, None))
    steps, warmup = job["steps"], job["warmup"]
    batches = collated(p, build(p), cfg.train.batch_size)
    torch.manual_seed(0)
    plain_model = build(p).model
    plain_thread = Worker()
    plain = plain_thread.run(lambda: plain_side(plain_model, p.fmt, cfg.train, batches))
    _harness_run(cfg, 2, 0)  # the process's first-use costs (imports, kernels), untimed
    turns = Turns()
    thread = lightning_side(build(p).model, p.fmt, cfg.train, batches, steps, turns)
    plain_times: list[float] = []

    def between(i: int) -> None:
        if i % 2:  # the two alternate which one follows the harness's step
            turns.step()
        plain_thread.run(lambda: plain(i))
        plain_times.append(plain_thread.seconds)
        if not i % 2:
            turns.step()

    clocks: list[Any] = []
    harness = Worker().run(lambda: _harness_run(cfg, steps, warmup, between, clocks=clocks))
    thread.join(timeout=60)
    every = log_every(cfg.train)
    # each harness step's time: from its start to the next one's, less the interleaved steps
    starts = [a for a, _, _ in clocks[0].steps]
    others_time = [b - a for a, b in clocks[0].between_steps]
    per_step = [starts[i + 1] - starts[i] - others_time[i] for i in range(len(starts) - 1)]
    closing = [t for i, t in enumerate(per_step) if i >= warmup and (i + 1) % every == 0]
    steady = [t for i, t in enumerate(per_step) if i >= warmup and (i + 1) % every]
    flush = statistics.median(closing) - statistics.median(steady) if closing and steady else 0.0
    times = {"harness": per_step[warmup:], "plain": plain_times[warmup:], "lightning": turns.times[warmup:]}
    return {"mean": {k: len(v) / sum(v) for k, v in times.items()},
            # robust to a busy machine's preemptions: each side's median step, the harness's plus
            # its flush cost (the closing steps' median less the others') spread over the window
            "median": {"harness": 1 / (statistics.median(steady) + flush / every),
                       "plain": 1 / statistics.median(times["plain"]),
                       "lightning": 1 / statistics.median(times["lightning"])},
            "log_every": every, "flush_ms": 1000 * flush, "step_ms": 1000 * statistics.median(steady),
            "fixed_s": harness["fixed_s"], "before_s": harness["before_s"], "after_s": harness["after_s"]}


# -- in the parent process -----------------------------------------------------------------------
def repeat(shape: str, steps: int, warmup: int, log_every: int | None) -> dict[str, Any]:
    job = {"config": config(shape, steps, log_every), "steps": steps, "warmup": warmup}
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "HARNESS_HOME": home}
        done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], env=env,
                              capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"a {shape} repeat failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def table(shape: str, runs: list[dict[str, Any]]) -> list[str]:
    def ratios(kind: str, side: str) -> list[float]:
        return [r[kind]["harness"] / r[kind][side] for r in runs]

    verdict = []
    for side, target in TARGETS[shape].items():
        robust, mean = statistics.median(ratios("median", side)), statistics.median(ratios("mean", side))
        verdict.append(f"harness / {side} = {robust:.3f} by median steps ({'met' if robust >= target else 'NOT met'}: "
                       f"target >= {target}), {mean:.3f} by mean steps")
    lines = [f"### {shape}: `{json.dumps(SHAPES[shape], separators=(',', ':'))}`", "",
             "Steps/s by median step time (the harness's with its flush cost spread over its window) "
             "and, in brackets, by mean step time (every pause the machine imposed included):", "",
             "| repeat | harness | plain | bare Lightning | harness / plain | harness / Lightning "
             "| log_every | flush ms | harness median step ms | fixed cost s (before + after) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        m, a = r["median"], r["mean"]
        lines.append(f"| {i} | {m['harness']:.1f} ({a['harness']:.1f}) | {m['plain']:.1f} ({a['plain']:.1f}) "
                     f"| {m['lightning']:.1f} ({a['lightning']:.1f}) "
                     f"| {m['harness'] / m['plain']:.3f} ({a['harness'] / a['plain']:.3f}) "
                     f"| {m['harness'] / m['lightning']:.3f} ({a['harness'] / a['lightning']:.3f}) | {r['log_every']} "
                     f"| {r['flush_ms']:.2f} | {r['step_ms']:.2f} "
                     f"| {r['fixed_s']:.2f} ({r['before_s']:.2f} + {r['after_s']:.2f}) |")
    lines += ["", "Medians over repeats: " + "; ".join(verdict) + "."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=[*SHAPES, "all"], default="all")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (tiny: 300, w256: 12)")
    parser.add_argument("--warmup", type=int, default=None, help="steps left out (tiny: 50, w256: 3)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--log-every", type=int, default=None, help="train.log_every (unset: the default)")
    parser.add_argument("--out", default=str(RECORD), help="the record appended to ('-': none)")
    parser.add_argument("--label", default="", help="a note for the record's title (which code was measured)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(json.loads(args.worker))), flush=True)
        return
    from harness.bench import common

    load_before, body = common.load_line(), []
    for shape in SHAPES if args.shape == "all" else [args.shape]:
        steps = args.steps or (300 if shape == "tiny" else 12)
        warmup = args.warmup if args.warmup is not None else (50 if shape == "tiny" else 3)
        runs = []
        for i in range(args.repeats):
            runs.append(repeat(shape, steps, warmup, args.log_every))
            r = runs[-1]
            m = r["median"]
            print(f"{shape} repeat {i + 1}: harness {m['harness']:.1f}, plain {m['plain']:.1f}, "
                  f"lightning {m['lightning']:.1f} steps/s (medians)", flush=True)
        body += table(shape, runs) + [""]
    command = "python benchmarks/step_cost.py " + " ".join(sys.argv[1:])
    if args.out == "-":
        print("\n".join(body))
    else:
        title = "per-step fixed cost (harness, plain loop, bare Lightning)" + (f": {args.label}" if args.label else "")
        common.append_record(args.out, title, command, load_before, body)


if __name__ == "__main__":
    main()
