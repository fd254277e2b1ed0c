"""The order of training examples when batches come from a ``DataLoader``: a shuffling
sampler whose position can be saved and restored (:mod:`harness.run.checkpoint`).

Every epoch draws ``torch.randperm(n)`` from a generator seeded with ``train.seed`` (the
order ``DataLoader(shuffle=True, generator=...)`` gives). ``state_dict()`` is the generator's
state at the start of the current epoch; ``load_state_dict`` takes it back with
``consumed_batches`` (batches of that epoch already trained on), and the next epoch then
repeats that permutation without its first ``consumed_batches * batch_size`` examples.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler


class ShuffledOrder(Sampler[int]):
    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        self.n, self.batch_size = n, batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch_start = self.generator.get_state()
        self._resume: tuple[torch.Tensor, int] | None = None

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        skip = 0
        if self._resume is not None:
            state, skip = self._resume
            self._resume = None
            self.generator.set_state(state)
        self.epoch_start = self.generator.get_state()
        order = torch.randperm(self.n, generator=self.generator).tolist()
        yield from order[skip * self.batch_size:]

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.epoch_start.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        consumed = int(state.get("consumed_batches", 0))
        batches = -(-self.n // self.batch_size)
        self.generator.set_state(state["generator"])
        if consumed >= batches:  # saved at the end of an epoch: the next one starts afresh
            torch.randperm(self.n, generator=self.generator)
            consumed = 0
        self._resume = (self.generator.get_state(), consumed)
