"""Stage 3 of a run: fit the model with Lightning (the system of :mod:`harness.run.system`).

Returns a :class:`Fitted`: the trainer, system and data module (evaluation reuses them) and
what fitting measured (steps, training throughput). Callbacks are top-level classes, so a
run pickles for Lightning's ``ddp_spawn``.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import MLFlowLogger

from harness import tracking
from harness.keys import Metric
from harness.run.build import Built
from harness.run.plan import Plan
from harness.run.system import HarnessDataModule, HarnessSystem

#: Lightning warnings nobody can act on here (a DataLoader over in-memory examples needs no workers).
QUIET = (".*does not have many workers.*", ".*LeafSpec.*")


class Throughput(L.Callback):
    """Training tokens per second (input tokens, padding included), skipping the first steps
    (warm-up, compilation)."""

    def __init__(self, fmt: Any, skip: int = 3) -> None:
        self.fmt, self.skip = fmt, skip
        self.tokens, self.seconds, self._t0 = 0, 0.0, 0.0

    @staticmethod
    def _sync(module: Any) -> None:
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, idx: int) -> None:
        self._sync(module)
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, module: Any, out: Any, batch: Any, idx: int) -> None:
        self._sync(module)
        if trainer.global_step > self.skip:
            self.seconds += time.perf_counter() - self._t0
            self.tokens += self.fmt.tokens(batch)

    def on_train_end(self, trainer: Any, module: Any) -> None:
        """Total tokens/s of every device, put where Lightning sends results back from
        ``ddp_spawn`` workers (``callback_metrics``)."""
        rate = torch.tensor(self.tokens / self.seconds if self.seconds > 0 else 0.0,
                            dtype=torch.float64, device=module.device)
        if trainer.world_size > 1:
            rate = trainer.strategy.reduce(rate, reduce_op="sum")
        trainer.callback_metrics[Metric.TOKENS_PER_S] = rate
        trainer.callback_metrics[Metric.TRAIN_STEPS] = torch.tensor(float(trainer.global_step))


def precision(requested: str) -> str:
    """``auto``: bf16-mixed on GPUs that support it, else full fp32."""
    if requested != "auto":
        return requested
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


@dataclass
class Fitted:
    trainer: Any
    system: HarnessSystem
    datamodule: HarnessDataModule
    steps: int
    tokens_per_s: float | None


def fit(p: Plan, built: Built, run_id: str, tracking_uri: str, callbacks: list[Any]) -> Fitted:
    """Train ``built.model`` as ``p.config.train`` says, logging to the MLflow run ``run_id``."""
    t = p.config.train
    dm = HarnessDataModule(built.task, p.fmt, t.batch_size, t.seed)
    system = HarnessSystem(built.model, built.task, p.fmt, t)
    throughput = Throughput(p.fmt)
    logger = MLFlowLogger(experiment_name=p.config.tracking.experiment, tracking_uri=tracking_uri,
                          run_id=run_id, log_model=False)
    trainer = L.Trainer(
        max_steps=t.max_steps,
        max_time={"seconds": t.max_time_s} if t.max_time_s else None,  # type: ignore[dict-item]
        val_check_interval=min(t.val_every, t.max_steps),
        check_val_every_n_epoch=None,
        accelerator=t.accelerator,
        devices=t.devices,
        strategy=t.strategy,
        precision=precision(t.precision),  # type: ignore[arg-type]
        gradient_clip_val=t.grad_clip,
        logger=logger,
        callbacks=[throughput, *callbacks],
        enable_checkpointing=t.checkpoint,
        enable_progress_bar=t.progress,
        enable_model_summary=False,
        log_every_n_steps=max(1, min(50, t.val_every // 4)),
        num_sanity_val_steps=0,
        default_root_dir=tracking.home() / "lightning",
        deterministic="warn" if t.accelerator != "cpu" else True,
    )
    with warnings.catch_warnings():
        for pattern in QUIET:
            warnings.filterwarnings("ignore", pattern)
        trainer.fit(system, datamodule=dm)
    results = trainer.callback_metrics
    rate = float(results.get(Metric.TOKENS_PER_S, 0.0))
    return Fitted(trainer, system, dm, int(results.get(Metric.TRAIN_STEPS, trainer.global_step)),
                  rate or None)
