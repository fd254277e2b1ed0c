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

import math
from typing import Any

import torch

from harness.keys import Metric

#: Steps between logged training points when ``train.log_every`` is unset (and validation is
#: rarer than every ``4 N`` steps): a flush reads the device once and writes one MLflow batch
#: (tens of milliseconds on a loaded machine's SQLite store: benchmarks/step_cost.md), which
#: at this interval is a few percent of a tiny model's step time at most.
LOG_EVERY = 50

#: Steps between reads of the device when no window closes sooner: how late a non-finite
#: loss is noticed at most (the step it happened at is still the one named).
CHECK_EVERY = 50

#: Where a checkpoint keeps the open window (the system's ``on_save_checkpoint``).
CHECKPOINT_KEY = "harness_train_metrics"


def log_every(train: Any) -> int:
    """Steps per logged training point: ``train.log_every``, else a quarter of ``val_every``
    capped at :data:`LOG_EVERY` (a short run keeps a point per step)."""
    return int(train.log_every or max(1, min(LOG_EVERY, train.val_every // 4)))


class TrainMetrics:
    """The open window of per-step ``train/loss`` and ``train/acc``: the micro-batches not read
    yet, on the device as their training steps left them (no operation a step), and the
    steps read, as host sums (each step's value added one at a time in step order, in float64,
    so where the reads fall never changes a bit of the result)."""

    def __init__(self, every: int, check_every: int = CHECK_EVERY) -> None:
        self.every, self.check_every = every, check_every
        #: each micro-batch not read yet: its step and its summed loss, correct predictions and
        #: scored tokens (0-d tensors on the device)
        self.pending: list[tuple[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = []
        self.loss = self.acc = 0.0  # the read steps' sums
        self.steps = 0  # steps in the window (read)
        self.diverged: tuple[int, float] | None = None  # the first non-finite loss's step and value
        self.last: dict[str, float] = {}  # the values logged last (the progress bar shows them)

    def add(self, step: int, parts: Any) -> None:
        """A micro-batch of optimizer step ``step`` (0-based), or a whole step: ``parts`` =
        its summed loss, correct predictions and scored tokens, on the device (kept, not read)."""
        self.pending.append((step, parts))

    def due(self, step: int, max_steps: int | None) -> bool:
        """Whether the window closes at (0-based) optimizer step ``step``."""
        return (step + 1) % self.every == 0 or (max_steps is not None and 0 < max_steps <= step + 1)

    def read_due(self, step: int) -> bool:
        return (step + 1) % self.check_every == 0

    def read(self) -> None:
        """Read the pending micro-batches (one transfer) into the host sums, each step's
        micro-batches summed first; note a non-finite loss."""
        if not self.pending:
            return
        columns = [torch.stack([p[i] for _, p in self.pending]).to(torch.float64) for i in range(3)]
        loss_sums, corrects, tokens = torch.stack(columns).tolist()
        step_sums: dict[int, list[float]] = {}  # in step order (dicts keep insertion order)
        for (step, _), values in zip(self.pending, zip(loss_sums, corrects, tokens, strict=True), strict=True):
            sums = step_sums.setdefault(step, [0.0, 0.0, 0.0])
            for i, value in enumerate(values):
                sums[i] += value
        self.pending = []
        for step, (loss_sum, correct, count) in step_sums.items():
            loss = loss_sum / max(count, 1.0)
            if self.diverged is None and not math.isfinite(loss):
                self.diverged = (step, loss)
            self.loss += loss
            self.acc += correct / max(count, 1.0)
            self.steps += 1

    def flush(self) -> dict[str, float]:
        """The window's means, and a new window; {} when it is empty."""
        self.read()
        if not self.steps:
            return {}
        self.last = {Metric.TRAIN_LOSS: self.loss / self.steps, Metric.TRAIN_ACC: self.acc / self.steps}
        self.loss = self.acc = 0.0
        self.steps = 0
        return self.last

    def state_dict(self) -> dict[str, Any]:
        self.read()
        return {"loss": self.loss, "acc": self.acc, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """The window a checkpoint holds (none: an empty one)."""
        state = state or {}
        self.pending = []
        self.loss, self.acc = float(state.get("loss", 0.0)), float(state.get("acc", 0.0))
        self.steps = int(state.get("steps", 0))
