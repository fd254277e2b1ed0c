"""The Lightning callback that links a trial to its MLflow run, reports the monitored metric
to Optuna at ``trainer.global_step`` after every validation, and prunes when told to.

**The objective's own metric.** A run validates at its training length while it trains; a
study whose objective is at another length (an extrapolation study: ``objective.length``)
would have its pruner rank trials by a different question than the one the study asks. The
callback therefore adds the objective's length to the validations of the run it watches
(``length``; when the model can run it), and reports the objective's metric at that length:
the rungs of successive halving and the median pruner compare trials on the objective.

Not ``optuna_integration.PyTorchLightningPruningCallback``: it reports at ``current_epoch``,
but our runs validate every ``val_every`` optimizer steps inside one epoch, so all its reports
would land on step 0 (Optuna keeps the first value of a step) and the pruner would compare
first validations only. Only rank zero talks to Optuna; the decision is broadcast so every
rank stops together under multi-device strategies. A top-level class (picklable), imported by
the worker only when a trial runs (it imports Lightning).
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import optuna

from harness.keys import Attr


class OptunaTrialCallback(L.Callback):
    def __init__(self, trial: Any, monitor: str, *, report: bool, prune: bool, max_steps: int,
                 length: int | None = None, fixed: bool = False) -> None:
        """``length``: the objective's length, validated too while training when it is not the
        training length (``fixed``: the model declares it cannot extrapolate:
        :func:`harness.run.evaluate.fixed_length`)."""
        self.trial, self.monitor = trial, monitor
        self.report, self.prune, self.max_steps = report, prune, max_steps
        self.length, self.fixed = length, fixed

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        run_id = getattr(trainer.logger, "run_id", None)
        if run_id and trainer.is_global_zero:
            self.trial.set_user_attr(Attr.RUN, run_id)
        task = module.task
        if self.report and self.length is not None and self.length != task.train_length:
            from harness.run.evaluate import lengths_run

            ok, _ = lengths_run(task, module.model, module.fmt, self.fixed, [self.length])
            if ok:  # validated from the first validation on (its loaders are made then)
                module.val_lengths = trainer.datamodule.val_lengths = [task.train_length, self.length]

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit" or not self.report:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            return
        step, value = trainer.global_step, float(value)
        stop = False
        if trainer.is_global_zero and math.isfinite(value):
            self.trial.report(value, step)
            last = min(self.max_steps, trainer.max_steps)  # a compute budget's steps: the run's own
            stop = self.prune and step < last and self.trial.should_prune()
        if trainer.strategy.broadcast(stop):
            raise optuna.TrialPruned(f"pruned at step {step} ({self.monitor} = {value:.4g})")
