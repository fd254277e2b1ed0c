"""``copy``: reproduce a random sequence of symbols.

Source: ``length`` symbols drawn uniformly from ``vocab`` symbols; target: the same
sequence. Decoder-only models see ``src SEP tgt`` and are scored on the target only.
The ``length`` is the number of symbols to copy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated, Any

from harness.plugin import Example, Ge, IntRange, Task, TaskConfig, TaskSpec, Vocab, hookimpl


@dataclass
class CopyConfig(TaskConfig):
    vocab: Annotated[int, Ge(1), IntRange(2, 64, log=True)] = 8  # distinct symbols


class CopyTask(Task):
    """Copy a random symbol sequence (decoder-only: src SEP tgt)."""

    task_kind = "seq2seq"
    config: CopyConfig

    def __init__(self, config: CopyConfig, *, seed: int) -> None:
        super().__init__(config, seed=seed, vocab=Vocab(tuple(f"s{i}" for i in range(config.vocab))))

    def generate(self, split: str, length: int) -> list[Example]:
        rng = random.Random(self.split_seed(split, length))
        first, n = self.vocab.first_symbol, self.config.vocab
        out = []
        for _ in range(self.split_size(split)):
            src = [first + rng.randrange(n) for _ in range(length)]
            out.append({"src": src, "tgt": list(src)})
        return out


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="copy", build=CopyTask))
