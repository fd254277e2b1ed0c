"""Training batches that never wait for the host: the split collated once, on the device.

**Where the training split lives.** When a run starts, the whole training split is collated
once into padded tensors (:meth:`BatchFormat.collate` over every example) and, when it fits
(:func:`fits_on_device`), moved to the training device. Each step then indexes rows with a
shuffled permutation and slices each padding group to its longest row: the same tensors a
per-batch collate of those examples gives (``tests/test_cost_data.py`` checks this for
every batch format), without a Python collate or a host-to-device copy per step. On a GPU
the split must take at most :data:`DEVICE_SHARE` of the free memory; otherwise (and for
validation, which also needs the raw examples for task metrics) batches come from a
``DataLoader`` with pinned memory, copied with ``non_blocking=True`` (Lightning's transfer
does so for CUDA tensors), so the copy overlaps the previous step's work. On the CPU the
split always fits: its examples are already in host memory, as Python lists several times
larger than the tensors.

**Streaming tasks** (``Task.streams``) never build a training split: :class:`StreamBatches`
turns each array the task's ``train_batches`` yields (a step's windows of ``length + 1``
tokens, this process's share) into an ``lm`` batch on the device (pinned and copied
asynchronously on a GPU). The stream is endless; ``train.max_steps`` ends training.

**Order.** Every epoch draws a fresh permutation from a generator seeded with
``train.seed``; with several devices, each process takes every ``world``-th index of the same
permutation (wrapped to equal shares, as Lightning's ``DistributedSampler`` pads), so all
processes run the same number of steps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from harness.data.formats import BatchFormat
from harness.data.tasks import Task
from harness.data.vocab import Example
from harness.runtime import devices

#: The largest share of a GPU's free memory the training split may take on the device.
DEVICE_SHARE = 0.125


def fits_on_device(nbytes: int, device: torch.device) -> bool:
    """Whether a collated split of ``nbytes`` should live on ``device`` (see the module)."""
    free = devices.free_bytes(device)
    return free is None or nbytes <= DEVICE_SHARE * free


def row_widths(padding: torch.Tensor) -> torch.Tensor:
    """Per row, one past its last non-padding position (0 for an all-padding row)."""
    positions = torch.arange(1, padding.shape[1] + 1, device=padding.device)
    return torch.where(padding, 0, positions).amax(dim=1)


class DeviceBatches:
    """An iterable of shuffled training batches sliced from tensors on the device."""

    def __init__(self, examples: Sequence[Example], fmt: BatchFormat, task_kind: str,
                 batch_size: int, seed: int, device: torch.device, rank: int = 0, world: int = 1,
                 tensors: dict[str, torch.Tensor] | None = None) -> None:
        full = tensors if tensors is not None else collate_split(examples, fmt, task_kind)
        self.examples, self.batch_size, self.rank, self.world = examples, batch_size, rank, world
        self.widths = {key: row_widths(full[key]) for key in fmt.padding_groups}  # host
        self.group = {k: pad for pad, keys in fmt.padding_groups.items() for k in keys}
        self.tensors = {k: v.to(device) for k, v in full.items()}
        self.device = device
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch_start, self.skip = self.generator.get_state(), 0  # the resumable position

    @property
    def per_rank(self) -> int:
        return -(-len(self.examples) // self.world)

    def __len__(self) -> int:
        return -(-self.per_rank // self.batch_size)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for rows in self.epoch():
            yield self.batch(rows)

    def epoch(self) -> list[torch.Tensor]:
        """The rows of this process's batches in the next epoch (a fresh permutation)."""
        n = len(self.examples)
        self.epoch_start = self.generator.get_state()
        order = torch.randperm(n, generator=self.generator)
        if self.world > 1:  # equal shares: wrap around to a multiple of world
            order = torch.cat([order, order[: self.per_rank * self.world - n]])[self.rank::self.world]
        skip, self.skip = self.skip, 0
        return list(order.split(self.batch_size))[skip:]

    def state_dict(self) -> dict[str, Any]:
        """The position to resume from: the order's state at the start of this epoch (the
        batches consumed are counted by the caller: :mod:`harness.run.checkpoint`)."""
        return {"generator": self.epoch_start.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state``: the next epoch repeats the saved one's permutation without
        its first ``consumed_batches`` batches (a finished epoch: the next permutation)."""
        self.generator.set_state(state["generator"])
        self.skip = int(state.get("consumed_batches", 0))
        if self.skip >= len(self):
            torch.randperm(len(self.examples), generator=self.generator)
            self.skip = 0

    def batch(self, rows: torch.Tensor) -> dict[str, Any]:
        """The batch of these rows (host indices): what ``fmt.collate`` of them returns,
        less the raw ``examples`` (only validation metrics decode them; Lightning's transfer
        to the device would walk every token of them each step)."""
        width = {pad: int(w[rows].max()) for pad, w in self.widths.items()}
        index = rows.to(self.device, non_blocking=True)
        out: dict[str, Any] = {}
        for key, full in self.tensors.items():
            picked = full.index_select(0, index)
            pad = self.group.get(key)
            out[key] = picked[:, : width[pad]] if pad is not None else picked
        return out


def collate_split(examples: Sequence[Example], fmt: BatchFormat, task_kind: str) -> dict[str, torch.Tensor]:
    """Every example of a split in one padded batch (host tensors, without ``examples``)."""
    full = fmt.collate(examples, task_kind)
    full.pop("examples")
    unknown = [k for k, v in full.items() if v.dim() > 1 and k not in
               {key for keys in fmt.padding_groups.values() for key in keys}]
    if unknown:
        raise ValueError(f"batch format {fmt} pads {unknown} but declares no padding group for them")
    return full


def nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class StreamBatches:
    """An endless iterable of ``lm`` batches from a streaming task's ``train_batches``."""

    def __init__(self, task: Task, batch_size: int, seed: int, device: torch.device,
                 rank: int = 0, world: int = 1) -> None:
        self.task, self.batch_size, self.seed = task, batch_size, seed
        self.device, self.rank, self.world = device, rank, world

    def __iter__(self) -> Iterator[dict[str, Any]]:
        stream = self.task.train_batches(self.task.train_length, self.batch_size, seed=self.seed,
                                         rank=self.rank, world=self.world)
        skip, self.skip = getattr(self, "skip", 0), 0
        for windows in stream:
            if skip:  # a resumed run: the stream is replayed to where it stopped
                skip -= 1
                continue
            yield self.batch(windows)

    def state_dict(self) -> dict[str, Any]:
        """The resumable position (:mod:`harness.run.checkpoint`): one endless epoch, so the
        batches consumed (counted by the caller) are the position."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skip = int(state.get("consumed_batches", 0))

    def batch(self, windows: Any) -> dict[str, Any]:
        rows = torch.as_tensor(windows, dtype=torch.long)
        if self.device.type == "cuda":
            rows = rows.pin_memory()
        rows = rows.to(self.device, non_blocking=True)
        tokens = rows[:, :-1]
        return {"tokens": tokens, "targets": rows[:, 1:],
                "padding_mask": torch.zeros_like(tokens, dtype=torch.bool),
                "loss_mask": torch.ones_like(tokens, dtype=torch.bool)}
