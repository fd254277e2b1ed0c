"""How long a study will take on this machine, said before its first trial: a few training
steps of each candidate are timed (its first tuning configuration, built as a run builds it:
task from ``data_seed``, model, one batch, forward, backward and the optimiser's step), and
one forward pass of a validation batch at each evaluation length; the steps and evaluation
passes of the runs left are multiplied out and shared among the workers.

What it leaves out, and says so: Lightning's bookkeeping around each step, start-up and
recording, which add to it, and shorter padded batches than the first (variable-length
tasks) and pruned trials, which save. Measured on the shared 2-core machine, 2026-11-26, with
one worker (benchmarks/studies/*/RUN.md): quickstart estimated 2 min, took 4.0 min at load
~1.7 (400-step runs of a tiny model: the fixed costs weigh most; at load ~7 a 4-trial version
took 9.9 min against 4 min); lra_listops 9 min, took 7.8; lra_pathfinder 6 min, took 9.1.
Nothing here is recorded and
nothing fails a study: a candidate that cannot be timed is left out of the estimate.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

#: timed training steps per candidate, after one warm-up step
STEPS = 2


@dataclass
class Estimate:
    seconds: float  # training steps of the runs left, wall clock with the workers
    runs: int  # runs left
    per_step: dict[str, float]  # candidate -> seconds per training step
    workers: int
    left_out: list[str]  # candidates that could not be timed
    pruner: bool = True  # the study prunes tuning trials

    def line(self) -> str:
        steps = ", ".join(f"{name} {s * 1e3:.3g} ms" for name, s in self.per_step.items())
        workers = f" with {self.workers} workers" if self.workers > 1 else ""
        missing = f"; not timed: {', '.join(self.left_out)}" if self.left_out else ""
        return (f"estimate: about {duration(self.seconds)} for the {self.runs} run(s) left{workers} "
                f"on this machine, from timed steps (a training step: {steps}{missing}) and "
                f"evaluation passes (whole studies took 0.9-2.5x their estimate: start-up and "
                f"Lightning's bookkeeping add to it, shorter padded batches"
                f"{' and pruned trials' if self.pruner else ''} save)")


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def run_seconds(run: dict[str, Any], registry: Any) -> tuple[float, float]:
    """Seconds per training step of the run config ``run`` (median of :data:`STEPS`, after a
    warm-up), and the seconds of the whole run: its training steps, its validations at the
    training length (every ``val_every`` steps) and the final evaluation at every length
    (one forward pass of a validation batch timed per length)."""
    import math

    import torch

    from harness.config import parse_run_config
    from harness.run.build import build_model, build_task, task_info
    from harness.run.optim import make_optimizer
    from harness.run.pipeline import with_budget_steps
    from harness.run.plan import plan
    from harness.run.system import HarnessSystem, masked_stats
    from harness.runtime.threads import run_threads

    p = with_budget_steps(plan(parse_run_config(run), registry))
    t = p.config.train
    threads = torch.get_num_threads()
    if t.num_threads:
        torch.set_num_threads(run_threads(t.num_threads) or threads)

    def timed(fn: Any, repeat: int) -> float:
        times = []
        for _ in range(repeat + 1):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
        return statistics.median(times[1:])

    try:
        task = build_task(p, seed=t.data_seed)
        examples = task.examples("train", task.train_length)
        batch = p.fmt.collate(list(examples[: t.batch_size]), task.task_kind)
        scale = t.batch_size / max(min(t.batch_size, len(examples)), 1)  # a small sample
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(t.seed)
            system = HarnessSystem(build_model(p, task_info(p, task)), task, p.fmt, t)
            system.train()
            opt, _ = make_optimizer(system.model, t)

            def step() -> None:
                masked_stats(system(batch), batch)["loss"].backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            per_step = timed(step, STEPS) * scale
            system.eval()
            passes = {}
            with torch.no_grad():
                for n in task.eval_lengths:
                    val = task.examples("val", n)
                    if not val:
                        continue
                    vb = p.fmt.collate(list(val[: t.batch_size]), task.task_kind)
                    one = timed(lambda vb=vb: system(vb), 1)
                    passes[n] = one * math.ceil(len(val) / t.batch_size)
    finally:
        torch.set_num_threads(threads)
    validations = t.max_steps // max(1, t.val_every)
    total = (per_step * t.max_steps + validations * passes.get(task.train_length, 0.0)
             + sum(passes.values()))
    return per_step, total


def estimate(space: Any, left: dict[str, int], workers: int = 1) -> Estimate | None:
    """The estimate for ``left`` runs per candidate (None: none left, or none could be timed)."""
    per_step: dict[str, float] = {}
    seconds, runs, missing = 0.0, 0, []
    for cand in space.candidates:
        n = left.get(cand.name, 0)
        if n <= 0:
            continue
        try:
            step, whole = run_seconds(space.run_config(cand, None, seed=space.config.seed),
                                      space.registry)
        except Exception:  # an estimate never stops a study; the trial will say what is wrong
            missing.append(cand.name)
            continue
        per_step[cand.name] = step
        seconds += whole * n
        runs += n
    if not per_step:
        return None
    return Estimate(seconds / max(1, workers), runs, per_step, workers, missing,
                    space.config.pruner.name != "none")


def runs_left(handle: Any) -> dict[str, int]:
    """Per candidate, the slots not yet done (tuning and confirmation)."""
    from harness.study.progress import progress

    return {c.name: (c.tune.slots - c.tune.done) + (c.confirm.slots - c.confirm.done)
            for c in progress(handle).candidates}
