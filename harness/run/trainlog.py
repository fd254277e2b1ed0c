"""Training metrics at no per-step host cost, and never lost or repeated by a kill.

**Accumulated on the device, logged every N steps.** Each optimizer step adds its
``train/loss`` and ``train/acc`` (the step's scored tokens' summed loss and correct
predictions over their count, over every micro-batch and process: :mod:`harness.run.system`)
to a window's sums, on the device; every ``N`` steps (:func:`log_every`) the window's means
are read once and logged at the window's last step. A logged point is therefore the mean of
the per-step values of the steps since the previous point (with ``N = 1``: each step's own).
Between flushes a step makes no host round trip and calls no logger.

**When.** A window closes at every step ``s`` with ``(s + 1) % N == 0`` and at the last
step (``max_steps``): by step number, so a resumed run closes the same windows as one that
never stopped. The window still open when training ends otherwise (``max_time_s``) is logged
then.

**What a checkpoint holds.** The open window (its sums and step count) is part of the
system's checkpoint state (:meth:`TrainMetrics.state_dict`, under :data:`CHECKPOINT_KEY`),
and a window is logged in the training step that closes it, before any callback of that
step writes a checkpoint. A kill at any instant then loses no point and repeats none: a
checkpoint is never newer than the points logged up to it, the points logged after it are
logged again identically by the resumed run and dropped as already logged
(:class:`harness.run.resume.OncePerStep`), and the open window continues from the
checkpoint's sums. ``tests/test_trainlog.py`` kills a run at the exact instant between a
checkpoint's write and the step's log.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.keys import Metric

#: Steps between logged training points when ``train.log_every`` is unset (and validation is
#: rarer than every ``4 N`` steps): a flush reads the device once and writes one MLflow batch,
#: which at this interval is under 1% of a tiny model's step time
#: (benchmarks/step_cost_cpu.md).
LOG_EVERY = 50

#: Where a checkpoint keeps the open window (the system's ``on_save_checkpoint``).
CHECKPOINT_KEY = "harness_train_metrics"


def log_every(train: Any) -> int:
    """Steps per logged training point: ``train.log_every``, else a quarter of ``val_every``
    capped at :data:`LOG_EVERY` (a short run keeps a point per step)."""
    return int(train.log_every or max(1, min(LOG_EVERY, train.val_every // 4)))


class TrainMetrics:
    """The open window's per-step ``train/loss`` and ``train/acc`` sums, on the device."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.sums: torch.Tensor | None = None  # float64 [loss, acc] summed over the window's steps
        self.steps = 0  # steps in the window
        self.last: dict[str, float] = {}  # the values logged last (the progress bar shows them)

    def add(self, step_sums: torch.Tensor) -> None:
        """One optimizer step: ``step_sums`` = its [summed loss, correct, scored tokens]."""
        per_step = step_sums[:2] / step_sums[2].clamp(min=1)
        if self.sums is None:
            self.sums = per_step
        else:
            if self.sums.device != per_step.device:  # restored from a checkpoint, on the CPU
                self.sums = self.sums.to(per_step.device)
            self.sums.add_(per_step)
        self.steps += 1

    def due(self, step: int, max_steps: int | None) -> bool:
        """Whether the window closes at (0-based) optimizer step ``step``."""
        return (step + 1) % self.every == 0 or (max_steps is not None and 0 < max_steps <= step + 1)

    def flush(self) -> dict[str, float]:
        """The window's means (one read of the device), and a new window; {} when empty."""
        if self.sums is None or not self.steps:
            return {}
        loss, acc = (self.sums / self.steps).tolist()
        self.sums, self.steps = None, 0
        self.last = {Metric.TRAIN_LOSS: loss, Metric.TRAIN_ACC: acc}
        return self.last

    def state_dict(self) -> dict[str, Any]:
        return {"sums": None if self.sums is None else self.sums.detach().cpu().clone(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """The window a checkpoint holds (none: an empty one; moved to the device by :meth:`add`)."""
        state = state or {}
        sums = state.get("sums")
        self.sums = None if sums is None else sums.to(torch.float64)
        self.steps = int(state.get("steps", 0))
