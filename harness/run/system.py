"""One task-agnostic LightningModule (the *system*) and the DataModule that feeds it.

The model is a plain ``nn.Module`` built from the registry; the system owns the loss
(cross-entropy over the task's scored positions), optimisation (:mod:`harness.run.optim`),
the non-finite-loss guard and metric logging. Validation runs one dataloader per evaluation
length and logs ``val/<metric>_len<length>`` (MLflow forbids ``@`` in metric names); the
training length is also logged without suffix (``val/acc``), which is what studies optimise
by default.

**A training step that never waits for the host.** The loss is computed with masked
operations over every position (boolean indexing would ask the device how many positions are
scored); the step's ``train/loss`` and ``train/acc`` stay on the device until a window of
``train.log_every`` steps closes or :data:`~harness.run.trainlog.CHECK_EVERY` steps passed
(:mod:`harness.run.trainlog`), when they are read at once: that read is also the finiteness
guard, so a run whose loss stops being finite stops at the next read (before each
validation and when training ends too), naming the step where it diverged.
``tests/test_host_sync.py`` counts the host round trips of a few training steps.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from harness.config import TrainConfig
from harness.data.formats import BatchFormat
from harness.data.tasks import Task
from harness.errors import HarnessError
from harness.keys import val_key
from harness.run.accumulate import BATCH_TOKENS, MicroBatches, accumulation, has_length, sizes
from harness.run.batches import DeviceBatches, StreamBatches, collate_split, fits_on_device, nbytes
from harness.run.optim import make_optimizer
from harness.run.order import ShuffledOrder
from harness.run.trainlog import CHECKPOINT_KEY, TrainMetrics, log_every


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite."""


class CompileFailed(HarnessError):
    """``torch.compile`` could not compile the model (``train.compile: true``)."""


class HarnessDataModule(L.LightningDataModule):
    """Training batches from the split collated once on the device when it fits
    (:mod:`harness.run.batches`), else a ``DataLoader``; validation from ``DataLoader``s.
    Loaders pin host memory when the device is a GPU (the copy is then asynchronous)."""

    def __init__(self, task: Task, fmt: BatchFormat, batch_size: int, seed: int,
                 micro_batch_size: int | None = None, one_shape: bool = False) -> None:
        super().__init__()
        self.one_shape = one_shape  # train.cuda_graphs: batches padded per batch are refused
        self.task, self.fmt, self.batch_size, self.seed = task, fmt, batch_size, seed
        #: rows per forward pass and micro-batches per optimizer step (harness.run.accumulate)
        self.micro, self.accumulate = sizes(batch_size, micro_batch_size)
        self.val_lengths: list[int] = [task.train_length]
        self._collate = partial(fmt.collate, task_kind=task.task_kind)
        self.on_device = False  # whether the training split lives on the device
        #: the training loader's order (resumable: ``state_dict``/``load_state_dict``), and the
        #: position a resumed run restores into it (see :mod:`harness.run.checkpoint`)
        self.train_order: Any = None
        self.resume_order: dict[str, Any] | None = None

    def _device(self) -> torch.device:
        return self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")

    def _rank_world(self) -> tuple[int, int]:
        return (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)

    def train_dataloader(self) -> Any:
        device = self._device()
        if self.task.streams:  # windows drawn every step: no training split is built
            self.train_order = StreamBatches(self.task, self.batch_size, self.seed, device, *self._rank_world())
            return self._resumed(self.train_order)
        data = self.task.examples("train", self.task.train_length)
        try:
            tensors = collate_split(data, self.fmt, self.task.task_kind)
        except ValueError:  # a format without padding groups for some key: per-batch collate
            tensors = None
        self.on_device = tensors is not None and fits_on_device(nbytes(tensors), device)
        if self.on_device:
            rank, world = self._rank_world()
            loader: Any = DeviceBatches(data, self.fmt, self.task.task_kind, self.batch_size, self.seed,
                                        device, rank, world, tensors=tensors)
            self.train_order = loader
        elif self.one_shape:
            why = "cannot be collated at once" if tensors is None else "does not fit on the device"
            raise HarnessError(
                f"train.cuda_graphs: the training split of {type(self.task).__name__} {why}, so its "
                f"batches are padded one by one and change shape from step to step (each new shape "
                f"would be captured again). Set train.cuda_graphs: false, or make the split smaller.")
        else:
            self.train_order = ShuffledOrder(len(data), self.batch_size, self.seed)
            loader = DataLoader(data, batch_size=self.batch_size, sampler=self.train_order,  # type: ignore[arg-type]
                                generator=self.train_order.generator, collate_fn=self._collate,
                                pin_memory=device.type == "cuda")
        return self._resumed(loader)

    def _resumed(self, loader: Any) -> Any:
        """``loader``, at the position of the checkpoint a resumed run continues from, cut
        into micro-batches when the run accumulates gradients."""
        if self.accumulate > 1:
            rank, world = self._rank_world()
            if isinstance(loader, DataLoader) and world > 1:
                raise HarnessError(
                    "train.micro_batch_size with several devices needs the training split on the "
                    "device (it is too large here, or its format cannot be collated at once); "
                    "train on one device, or without train.micro_batch_size.")
            rows = (loader.per_rank if isinstance(loader, DeviceBatches) else
                    len(self.train_order) if has_length(loader) else None)
            loader = self.train_order = MicroBatches(loader, self.train_order, self.fmt, self.micro,
                                                     self.accumulate, rows, self.batch_size)
        if self.resume_order is not None and hasattr(self.train_order, "load_state_dict"):
            self.train_order.load_state_dict(self.resume_order)
        return loader

    def val_dataloader(self) -> list[DataLoader]:
        pin = self._device().type == "cuda"
        return [
            DataLoader(self.task.examples("val", n), batch_size=self.batch_size,  # type: ignore[arg-type]
                       collate_fn=self._collate, pin_memory=pin)
            for n in self.val_lengths
        ]


#: The target id :func:`masked_stats` gives unscored positions (``F.cross_entropy`` skips it).
IGNORE = -100


def masked_stats(logits: torch.Tensor, batch: dict[str, Any], label_smoothing: float = 0.0,
                 token_bytes: torch.Tensor | None = None, *, evaluation: bool = True) -> dict[str, torch.Tensor]:
    """Loss and counts over the scored positions of a batch; with ``token_bytes`` (per id,
    the UTF-8 bytes it stands for) also the bytes of the scored targets' text.

    ``loss`` is the mean over the scored positions, ``loss_sum`` its sum (what accumulation
    normalises by the whole optimizer batch's tokens), ``tokens`` and ``correct`` their
    counts; ``evaluation=False`` (a training step) leaves out what only validation sums
    (``nll_sum``, ``exact``, ``sequences``, ``bytes``). Masked operations only: no boolean
    indexing, so no host round trip (see the module)."""
    mask = batch["loss_mask"]
    targets = batch["targets"]
    wide = logits if logits.dtype == torch.float64 else logits.float()
    flat_logits = wide.reshape(-1, wide.shape[-1])
    scored = targets.masked_fill(~mask, IGNORE)  # the unscored positions add nothing, match nothing
    nll = F.cross_entropy(flat_logits, scored.reshape(-1), ignore_index=IGNORE, reduction="sum")
    loss_sum = nll if not label_smoothing else F.cross_entropy(
        flat_logits, scored.reshape(-1), ignore_index=IGNORE, label_smoothing=label_smoothing, reduction="sum")
    tokens = mask.sum()
    correct = logits.argmax(-1) == scored
    out = {"loss": loss_sum / tokens.clamp(min=1), "loss_sum": loss_sum, "tokens": tokens, "correct": correct.sum()}
    if not evaluation:
        return out
    # a sequence is exact when every scored position is right (classification: the label)
    exact = (correct | ~mask).all(dim=-1).float().sum() if mask.dim() > 1 else correct.float().sum()
    out.update(nll_sum=nll.detach(), exact=exact, sequences=torch.tensor(mask.shape[0]))
    if token_bytes is not None:
        out["bytes"] = torch.where(mask, token_bytes[targets.masked_fill(~mask, 0)], 0).sum()
    return out


class HarnessSystem(L.LightningModule):
    def __init__(self, model: torch.nn.Module, task: Task, fmt: BatchFormat, cfg: TrainConfig) -> None:
        super().__init__()
        self.model, self.task, self.fmt, self.cfg = model, task, fmt, cfg
        self.val_lengths: list[int] = [task.train_length]
        self._sums: dict[int, dict[str, Any]] = {}
        self._token_bytes: torch.Tensor | None = None  # on the device, made at first use
        self.accumulate = accumulation(cfg)[1]
        #: the optimizer step's summed loss, correct predictions and scored tokens so far
        self._step_sums: torch.Tensor | None = None
        self._micro = 0  # micro-batches of the current optimizer step seen, modulo accumulate
        #: the training metrics' open window, logged every log_every(cfg) steps (harness.run.trainlog)
        self.train_metrics = TrainMetrics(log_every(cfg))

    def __setattr__(self, name: str, value: Any) -> None:
        # Lightning sets ``_current_fx_name`` twice around every hook of every step (about 50
        # times a step); ``nn.Module.__setattr__`` checks parameters, modules and buffers each
        # time (about 5% of a tiny model's step: benchmarks/step_cost.md). The name is never
        # one of those, so the plain attribute store is the same result.
        if name == "_current_fx_name":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        try:
            return self.fmt.call(self.model, batch)  # type: ignore[no-any-return]
        except Exception as exc:
            if not (self.cfg.compile and _compile_error(exc)):
                raise
            cause = getattr(exc, "inner_exception", None) or exc  # the backend's own error
            first = (str(cause).strip().splitlines() or [""])[0]
            raise CompileFailed(
                f"train.compile: torch.compile could not compile model "
                f"{type(self.model).__name__} ({type(cause).__name__}: {first}). Set "
                f"train.compile: false to train it uncompiled."
            ) from None

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        if self.cfg.scheduled_sampling and self.fmt.feedback:  # targets feed back
            with torch.no_grad():
                first_pass = self(batch)
            batch = scheduled_sampling(batch, first_pass, self.fmt, self.cfg.scheduled_sampling)
        stats = masked_stats(self(batch), batch, self.cfg.label_smoothing, evaluation=False)
        loss = stats["loss"]
        self._log_training(stats)
        total = batch.get(BATCH_TOKENS)
        trainer = self._trainer  # None: a step run by hand (tests)
        world = trainer.world_size if trainer is not None else 1
        if total is None and world == 1:
            return loss
        if total is None:
            total = stats["tokens"]
        if trainer is not None and world > 1:
            # the global batch's scored tokens: every process's gradient is its summed loss
            # over them, times the world size that DDP/FSDP's gradient mean divides by, so the
            # step follows the token mean of the whole global batch, as one process at the
            # same global batch does, however the tokens fall between processes (one
            # reduction of one number per micro-batch, on the device)
            total = trainer.strategy.reduce(total.detach().to(torch.float64), reduce_op="sum")
        # a micro-batch: its share of the whole batch's token mean; Lightning divides what
        # training_step returns by the micro-batches per step, which this undoes
        return stats["loss_sum"] / total.clamp(min=1).to(stats["loss_sum"].dtype) * self.accumulate * world

    def _log_training(self, stats: dict[str, torch.Tensor]) -> None:
        """``train/loss`` and ``train/acc`` of the optimizer step: the scored tokens' summed loss
        and correct predictions over every micro-batch of the step and every process, over
        their count, so that a logged training metric means the same at any world size and
        micro-batch size. Each micro-batch's three numbers wait on the device, untouched, in the
        open window (:mod:`harness.run.trainlog`), which sums them when it reads them (with
        several processes, one reduction of the three per step, on the device, first); a
        window is logged in the step that closes it, before any callback of this step writes
        a checkpoint."""
        parts = (stats["loss_sum"].detach(), stats["correct"], stats["tokens"])
        trainer = self._trainer  # None: a step run by hand (tests)
        world = trainer.world_size if trainer is not None else 1
        step, metrics = self.global_step, self.train_metrics
        if world == 1:
            metrics.add(step, parts)
        else:  # the step's sums over its micro-batches, then over the processes
            part = torch.stack(parts).to(torch.float64)
            self._step_sums = part if self._step_sums is None else self._step_sums + part
        self._micro = (self._micro + 1) % self.accumulate  # checkpoints fall between steps: 0 on resume
        if self._micro:
            return  # not the step's last micro-batch
        if trainer is not None and world > 1:
            sums, self._step_sums = self._step_sums, None
            assert trainer is not None  # several processes: a Trainer runs them
            metrics.add(step, trainer.strategy.reduce(sums, reduce_op="sum").unbind())
        if metrics.due(step, trainer.max_steps if trainer is not None else None):
            self.flush_training(step)
        elif metrics.read_due(step):
            self.check_finite()

    def flush_training(self, step: int) -> None:
        """Log the open window's means at ``step`` (0-based: the last step trained)."""
        values = self.train_metrics.flush()
        trainer = self._trainer
        if values and trainer is not None:
            trainer.callback_metrics.update({k: torch.tensor(v) for k, v in values.items()})
            if trainer.logger is not None:
                trainer.logger.log_metrics(values, step=step)
        self.check_finite()

    def check_finite(self) -> None:
        """Raise :class:`TrainingDiverged` if a training loss so far was not finite (one read)."""
        self.train_metrics.read()
        if self.train_metrics.diverged is not None:
            step, value = self.train_metrics.diverged
            raise TrainingDiverged(
                f"training loss became {value} at step {step}; lower the learning rate, "
                f"raise warm-up, or enable gradient clipping."
            )

    def on_train_end(self) -> None:
        self.flush_training(self.global_step - 1)  # a window left open (max_time_s stopped it)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = self.train_metrics.state_dict()  # the open window

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.train_metrics.load_state_dict(checkpoint.get(CHECKPOINT_KEY))

    def on_validation_start(self) -> None:
        if self.trainer.state.fn == "fit":
            self.check_finite()
        # validation draws from the global generator (each DataLoader's base seed): put its
        # state back afterwards, so training continues the same whether or not a validation
        # ran in between (a run resumed from a checkpoint is then bit-exact)
        self._rng_before_validation = torch.get_rng_state()

    def on_validation_end(self) -> None:
        state = getattr(self, "_rng_before_validation", None)
        if state is not None:
            torch.set_rng_state(state)

    def on_validation_epoch_start(self) -> None:
        keys = SUMMED + (("bytes",) if self.task.token_bytes is not None else ())
        self._sums = {n: dict.fromkeys(keys, 0.0) for n in self.val_lengths}
        if self.task.token_bytes is not None and self._token_bytes is None:
            self._token_bytes = torch.as_tensor(self.task.token_bytes, dtype=torch.float64, device=self.device)

    def validation_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        length = self.val_lengths[dataloader_idx]
        logits = self(batch)
        stats = masked_stats(logits, batch, token_bytes=self._token_bytes)
        sums = self._sums[length]
        for key in SUMMED + (("bytes",) if "bytes" in stats else ()):  # tensors: no device sync per batch
            sums[key] = sums[key] + stats[key].double()
        for name, value in self.task.statistics(self.model, batch, self.fmt, logits).items():
            sums[f"stat:{name}"] = sums.get(f"stat:{name}", 0.0) + value
        for name, (total, count) in self.task.extra_metrics(self.model, batch, self.fmt).items():
            sums[f"extra:{name}:sum"] = sums.get(f"extra:{name}:sum", 0.0) + total
            sums[f"extra:{name}:count"] = sums.get(f"extra:{name}:count", 0.0) + count

    def on_validation_epoch_end(self) -> None:
        distributed = self.trainer.world_size > 1
        fitting = self.trainer.state.fn == "fit"
        for length in self.val_lengths:
            reduced = self._reduce(self._sums[length])
            metrics = summarize(reduced, self.task.report_perplexity)
            metrics.update(self.task.metrics_from_statistics(
                {k[len("stat:"):]: v for k, v in reduced.items() if k.startswith("stat:")}))
            for name, value in metrics.items():
                keys = [val_key(name, length)]
                if length == self.task.train_length:
                    keys.append(val_key(name))
                for key in keys:  # equal on every rank once reduced: syncing keeps Lightning quiet
                    # To MLflow: while fitting, the learning curve at the training length
                    # (``val/acc``) and not its per-length twin, which would repeat it; the final
                    # evaluation's values are recorded once, by harness.run.record.
                    self.log(key, value, prog_bar=key in (val_key("loss"), val_key("acc")),
                             sync_dist=distributed, logger=fitting and key == val_key(name))

    def _reduce(self, sums: dict[str, Any]) -> dict[str, float]:
        """Validation sums over every device's share of the examples (one reduction)."""
        keys = sorted(sums)
        values = torch.stack([torch.as_tensor(sums[k], dtype=torch.float64, device=self.device)
                              for k in keys])
        if self.trainer.world_size > 1:
            values = self.trainer.strategy.reduce(values, reduce_op="sum")
        return dict(zip(keys, values.tolist(), strict=True))

    def configure_optimizers(self) -> Any:
        opt, sched = make_optimizer(self.model, self.cfg)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _compile_error(exc: Exception) -> bool:
    from torch._dynamo.exc import TorchDynamoException

    return isinstance(exc, TorchDynamoException)


#: The per-batch counts summed over a validation set (see :func:`masked_stats`).
SUMMED = ("nll_sum", "tokens", "correct", "exact", "sequences")


def scheduled_sampling(batch: dict[str, Any], logits: torch.Tensor, fmt: BatchFormat, prob: float) -> dict[str, Any]:
    """The batch with some teacher-forced inputs replaced by the model's own predictions.

    Scheduled sampling (Bengio et al., 2015) in its two-pass form (Mihaylova & Martins,
    2019): ``logits`` come from a first, teacher-forced pass without gradients; each input
    that is a gold target token (``tgt_in[t] == targets[t-1]`` for seq2seq, ``tokens[t] ==
    targets[t-1]`` for lm, where ``loss_mask[t-1]`` is set) is replaced, independently with
    probability ``prob``, by the first pass's argmax prediction of that token. The second
    pass trains on the mixed inputs; targets are unchanged. Padding, BOS and unscored
    context (a decoder-only model's source) are never replaced.
    """
    assert fmt.feedback is not None, f"targets never feed back in the {fmt} format"
    key, padding = fmt.feedback
    inputs = batch[key]
    coin = torch.rand(inputs[:, 1:].shape, device=inputs.device) < prob
    replace = coin & batch["loss_mask"][:, :-1] & ~batch[padding][:, 1:]
    mixed = inputs.clone()
    mixed[:, 1:] = torch.where(replace, logits[:, :-1].argmax(-1), inputs[:, 1:])
    return {**batch, key: mixed}


def summarize(sums: dict[str, float], perplexity: bool) -> dict[str, float]:
    tokens = max(sums["tokens"], 1.0)
    loss = sums["nll_sum"] / tokens
    out = {
        "loss": loss,
        "acc": sums["correct"] / tokens,
        "exact": sums["exact"] / max(sums["sequences"], 1.0),
    }
    if perplexity:
        out["ppl"] = math.exp(min(loss, 50.0))
        out["bpc"] = loss / math.log(2)
    if sums.get("bytes"):  # bits per byte: total bits over the UTF-8 bytes of the scored text
        out["bpb"] = sums["nll_sum"] / math.log(2) / sums["bytes"]
    for key, total in sums.items():
        if key.startswith("extra:") and key.endswith(":sum"):
            name = key[len("extra:"): -len(":sum")]
            out[name] = total / max(sums[f"extra:{name}:count"], 1.0)
    return out
