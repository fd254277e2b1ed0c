"""One task-agnostic LightningModule (the *system*) and the DataModule that feeds it.

The model is a plain ``nn.Module`` built from the registry; the system owns the loss
(cross-entropy over the task's scored positions), optimisation (:mod:`harness.run.optim`), the non-finite-loss guard and metric logging. Validation runs one
dataloader per evaluation length and logs ``val/<metric>_len<length>`` (MLflow forbids ``@``
in metric names); the training length is also logged without suffix (``val/acc``), which is
what studies optimise by default.
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
from harness.keys import Metric, val_key
from harness.run.batches import DeviceBatches, StreamBatches, collate_split, fits_on_device, nbytes
from harness.run.optim import make_optimizer
from harness.run.order import ShuffledOrder


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite."""


class CompileFailed(HarnessError):
    """``torch.compile`` could not compile the model (``train.compile: true``)."""


class HarnessDataModule(L.LightningDataModule):
    """Training batches from the split collated once on the device when it fits
    (:mod:`harness.run.batches`), else a ``DataLoader``; validation from ``DataLoader``s.
    Loaders pin host memory when the device is a GPU (the copy is then asynchronous)."""

    def __init__(self, task: Task, fmt: BatchFormat, batch_size: int, seed: int) -> None:
        super().__init__()
        self.task, self.fmt, self.batch_size, self.seed = task, fmt, batch_size, seed
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
        else:
            self.train_order = ShuffledOrder(len(data), self.batch_size, self.seed)
            loader = DataLoader(data, batch_size=self.batch_size, sampler=self.train_order,  # type: ignore[arg-type]
                                generator=self.train_order.generator, collate_fn=self._collate,
                                pin_memory=device.type == "cuda")
        return self._resumed(loader)

    def _resumed(self, loader: Any) -> Any:
        """``loader``, at the position of the checkpoint a resumed run continues from."""
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


def masked_stats(logits: torch.Tensor, batch: dict[str, Any], label_smoothing: float = 0.0,
                 token_bytes: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Loss and counts over the scored positions of a batch; with ``token_bytes`` (per id,
    the UTF-8 bytes it stands for) also the bytes of the scored targets' text."""
    mask = batch["loss_mask"]
    targets = batch["targets"]
    flat_logits = logits[mask].float()
    flat_targets = targets[mask]
    nll = F.cross_entropy(flat_logits, flat_targets, reduction="sum")
    loss = F.cross_entropy(flat_logits, flat_targets, label_smoothing=label_smoothing)
    pred = logits.argmax(-1)
    correct = (pred == targets) & mask
    # a sequence is exact when every scored position is right (classification: the label)
    exact = (correct | ~mask).all(dim=-1).float().sum() if mask.dim() > 1 else correct.float().sum()
    out = {
        "loss": loss,
        "nll_sum": nll.detach(),
        "tokens": mask.sum(),
        "correct": correct.sum(),
        "exact": exact,
        "sequences": torch.tensor(mask.shape[0]),
    }
    if token_bytes is not None:
        out["bytes"] = token_bytes[flat_targets].sum()
    return out


class HarnessSystem(L.LightningModule):
    def __init__(self, model: torch.nn.Module, task: Task, fmt: BatchFormat, cfg: TrainConfig) -> None:
        super().__init__()
        self.model, self.task, self.fmt, self.cfg = model, task, fmt, cfg
        self.val_lengths: list[int] = [task.train_length]
        self._sums: dict[int, dict[str, Any]] = {}
        self._token_bytes: torch.Tensor | None = None  # on the device, made at first use

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
        stats = masked_stats(self(batch), batch, self.cfg.label_smoothing)
        loss = stats["loss"]
        if not torch.isfinite(loss):
            raise TrainingDiverged(
                f"training loss became {loss.item()} at step {self.global_step}; lower the "
                f"learning rate, raise warm-up, or enable gradient clipping."
            )
        bs = batch["targets"].shape[0]
        self.log(Metric.TRAIN_LOSS, loss, on_step=True, prog_bar=True, batch_size=bs)
        acc = stats["correct"].float() / stats["tokens"].clamp(min=1)
        self.log(Metric.TRAIN_ACC, acc, on_step=True, batch_size=bs)
        return loss

    def on_validation_start(self) -> None:
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
