"""Batches bigger than memory: gradient accumulation over micro-batches of one optimizer batch.

**The surface.** ``train.batch_size`` is the optimizer batch (examples per optimizer step, per
device); ``train.batch_tokens`` states it in input tokens instead (:func:`with_batch_tokens`
turns it into ``batch_size`` before anything is recorded). ``train.micro_batch_size`` is what
one forward and backward pass holds; below ``batch_size`` the run accumulates the gradients
of :func:`accumulation` micro-batches into each optimizer step. Everything that counts steps
or tokens counts optimizer batches: ``max_steps`` and ``val_every`` are optimizer steps, a
FLOP or token budget (:mod:`harness.run.flops`) divides by the tokens of the optimizer batch,
and the data order is the one a run without accumulation draws. A budget therefore buys the
same steps on the same examples at every micro-batch size; only memory and time differ.

**How.** The training loader still yields optimizer batches; :class:`MicroBatches` cuts each
into consecutive micro-batches of ``micro_batch_size`` rows (the last one smaller when it
does not divide), each sliced to its own longest row where the batch is on the host, and Lightning accumulates over them
(``accumulate_grad_batches``). Each micro-batch carries :data:`BATCH_TOKENS`, the scored
tokens of its whole optimizer batch (a device tensor: no host round trip), and the training
loss is the micro-batch's summed loss over that count (:mod:`harness.run.system`): the
accumulated gradient is the gradient of the token mean over the whole batch, however the
padding falls, not a mean of the micro-batches' means. ``tests/test_accumulate.py`` checks it
against the whole batch's gradient in float64.

**Resuming.** A checkpoint counts the micro-batches consumed; :class:`MicroBatches` hands its
loader the optimizer batches they make up (checkpoints are written at optimizer steps only).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

#: The key of a micro-batch holding its optimizer batch's scored tokens (0-dim tensor).
BATCH_TOKENS = "batch_loss_tokens"
#: How many training examples :func:`with_batch_tokens` measures tokens per example on.
MEASURED_EXAMPLES = 256


def accumulation(t: Any) -> tuple[int, int]:
    """(micro-batch size, micro-batches per optimizer step) of a :class:`TrainConfig`."""
    return sizes(t.batch_size, t.micro_batch_size)


def sizes(batch_size: int, micro_batch_size: int | None) -> tuple[int, int]:
    """(micro-batch size, micro-batches per optimizer step) of these sizes (micro unset or at
    least the batch: no accumulation)."""
    micro = min(micro_batch_size or batch_size, batch_size)
    return micro, -(-batch_size // micro)


def split(batch: dict[str, Any], fmt: Any, micro: int) -> list[dict[str, Any]]:
    """An optimizer batch as consecutive micro-batches of ``micro`` rows, each sliced to its
    own longest row per padding group and carrying :data:`BATCH_TOKENS`."""
    import torch

    from harness.run.batches import row_widths

    rows = int(batch["loss_mask"].shape[0])
    total = batch["loss_mask"].sum()
    group = {k: pad for pad, keys in fmt.padding_groups.items() for k in keys}
    out = []
    for start in range(0, rows, micro):
        part: dict[str, Any] = {}
        for key, value in batch.items():
            part[key] = value[start:start + micro]
        for pad in fmt.padding_groups:
            mask = part.get(pad)
            # trimmed on the host only: on a GPU the width would be a host round trip per
            # micro-batch (batches collated on the device keep their optimizer batch's width)
            if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.device.type == "cpu":
                width = max(int(row_widths(mask).max()), 1)
                for key, value in part.items():
                    if group.get(key) == pad and isinstance(value, torch.Tensor):
                        part[key] = value[:, :width]
        part[BATCH_TOKENS] = total
        out.append(part)
    return out


class MicroBatches:
    """The micro-batches of each optimizer batch ``loader`` yields (see the module); resumable
    when ``order`` (the loader's order) is."""

    def __init__(self, loader: Any, order: Any, fmt: Any, micro: int, accumulate: int,
                 rows: int | None, batch_size: int) -> None:
        self.loader, self.order, self.fmt = loader, order, fmt
        self.micro, self.accumulate, self.rows, self.batch_size = micro, accumulate, rows, batch_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.loader:
            yield from split(batch, self.fmt, self.micro)

    def __len__(self) -> int:
        """Micro-batches per epoch (only for a loader of known length: ``rows`` examples)."""
        if self.rows is None:
            raise TypeError("an endless stream has no length")
        full, rest = divmod(self.rows, self.batch_size)
        return full * self.accumulate + -(-rest // self.micro)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.order.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """``consumed_batches`` counts micro-batches: the loader skips the optimizer batches
        they make up (a short last one at the end of an epoch counts whole)."""
        consumed = int(state.get("consumed_batches", 0))
        self.order.load_state_dict({**state, "consumed_batches": -(-consumed // self.accumulate)})


def has_length(loader: Any) -> bool:
    try:
        len(loader)
    except TypeError:
        return False
    return True


def tokens_per_example(p: Any, task: Any) -> float:
    """Input tokens per training example (padding included, as a batch counts them),
    measured on the first :data:`MEASURED_EXAMPLES` collated in batches of ``batch_size``."""
    if task.streams:
        return float(task.train_length)
    examples = task.examples("train", task.train_length)[:MEASURED_EXAMPLES]
    if not examples:
        return float(task.train_length)
    size = max(1, min(p.config.train.batch_size, len(examples)))
    tokens = sum(p.fmt.tokens(p.fmt.collate(examples[i:i + size], task.task_kind))
                 for i in range(0, len(examples), size))
    return tokens / len(examples)


def with_batch_tokens(p: Any) -> Any:
    """The plan with ``train.batch_size`` set from ``train.batch_tokens`` (unchanged without)."""
    from harness.errors import ConfigError
    from harness.run.build import build_task

    t = p.config.train
    if t.batch_tokens is None:
        return p
    per_example = tokens_per_example(p, build_task(p, seed=t.data_seed))
    size = round(t.batch_tokens / per_example)
    if size < 1:
        raise ConfigError(f"train.batch_tokens = {t.batch_tokens} is less than one training example "
                          f"({per_example:.0f} input tokens); raise it to at least that.")
    if size > 2**20:
        raise ConfigError(f"train.batch_tokens = {t.batch_tokens} makes {size} examples per step "
                          f"({per_example:.0f} tokens each), over the limit of 1048576; lower it.")
    train = t.model_copy(update={"batch_size": int(size)})
    return replace(p, config=p.config.model_copy(update={"train": train}))
