"""What a run shows on the terminal while it trains: its MLflow run id as training starts (so
a run that is killed can be resumed with ``harness train --resume RUN_ID``), the step a
resumed run continues from, and a progress bar over the whole training (``401/1000``, with
the rate of the steps this process trained, not ``401/?``: a streaming task has no epochs
and a resumed run does not start at 0).

Both are Lightning callbacks, top-level classes (a run pickles for ``ddp_spawn``); only the
first process prints.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

#: Seconds between redraws of the progress bar (and at the last step).
REFRESH_S = 0.2


def banner(run_id: str, checkpoint_every: Any, max_steps: int | None,
           resumed_step: int | None = None) -> str:
    """The line a run prints as training starts: its id and how to continue it, or the step a
    resumed run continues from."""
    steps = f"{max_steps:,} steps" if max_steps and max_steps > 0 else "steps"
    if resumed_step is not None:
        return (f"run {run_id}: resumed from its checkpoint at step {resumed_step:,} of "
                f"{steps}; training continues from there")
    if checkpoint_every not in (None, "off", 0):
        return (f"run {run_id} started ({steps}, a checkpoint every {checkpoint_every}); if it "
                f"stops, continue it with `harness train --resume {run_id}`")
    return (f"run {run_id} started ({steps}; no checkpoints: set train.checkpoint_every to make "
            f"a run resumable, else a stopped run is trained again from the start)")


class StepBar(TQDMProgressBar):
    """Lightning's bar counting optimizer steps over the whole training: total ``max_steps``,
    starting at the step a resumed run continues from (tqdm's rate then counts only the
    steps trained here), one bar across epochs."""

    _drawn = 0.0  # when the bar was last redrawn (time.monotonic)

    def init_train_tqdm(self) -> Any:
        trainer = self.trainer
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        return Tqdm(desc="training steps", total=total, initial=trainer.global_step,
                    position=2 * self.process_position, disable=self.is_disabled, leave=True,
                    dynamic_ncols=True, file=sys.stdout, smoothing=0, bar_format=self.BAR_FORMAT)

    def on_train_epoch_start(self, trainer: Any, *args: Any) -> None:
        return None  # one bar over every epoch

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        n = trainer.global_step
        bar = self.train_progress_bar
        now = time.monotonic()  # redrawn at most every REFRESH_S: a tiny model's step is shorter
        if bar is not None and not bar.disable and (now - self._drawn >= REFRESH_S or n == bar.total):
            self._drawn = now
            bar.n = n
            bar.refresh()
            bar.set_postfix(self.get_metrics(trainer, pl_module))

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        """Lightning's, with the training metrics last logged (harness.run.trainlog)."""
        last = getattr(getattr(pl_module, "train_metrics", None), "last", {})
        return {**super().get_metrics(trainer, pl_module), **{k: f"{v:.3g}" for k, v in last.items()}}

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))


class Announce(Callback):
    """Prints :func:`banner` as training starts (the first process only); ``harness train``
    passes it."""

    def __init__(self, checkpoint_every: Any = None) -> None:
        self.every = checkpoint_every

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero:
            run_id = getattr(trainer.logger, "run_id", None) or "?"
            resumed = trainer.global_step if trainer.global_step > 0 else None
            print(banner(run_id, self.every, trainer.max_steps, resumed), file=sys.stdout, flush=True)
