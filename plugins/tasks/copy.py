"""``copy``: reproduce a random sequence of symbols.

Source: ``length`` symbols drawn uniformly from ``vocab`` symbols; target: the same
sequence. Decoder-only models see ``src SEP tgt`` and are scored on the target only.
The ``length`` is the number of symbols to copy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated, Any

import harness
from harness.data import Example, Task, TaskConfig, Vocab
from harness.params import IntRange
from harness.registry import TaskSpec


@dataclass
class CopyConfig(TaskConfig):
    vocab: Annotated[int, IntRange(2, 64, log=True)] = 8  # distinct symbols


class CopyTask(Task):
    task_kind = "seq2seq"

    def __init__(self, config: CopyConfig, *, seed: int) -> None:
        super().__init__(config, seed=seed, vocab=Vocab(tuple(f"s{i}" for i in range(config.vocab))))

    def generate(self, split: str, length: int) -> list[Example]:
        rng = random.Random(self.split_seed(split, length))
        first, n = self.vocab.first_symbol, self.config.vocab  # type: ignore[attr-defined]
        out = []
        for _ in range(self.split_size(split)):
            src = [first + rng.randrange(n) for _ in range(length)]
            out.append({"src": src, "tgt": list(src)})
        return out


def build(config: CopyConfig, *, seed: int) -> CopyTask:
    return CopyTask(config, seed=seed)


@harness.hookimpl
def harness_register_task(register: Any) -> None:
    register(
        TaskSpec(
            name="copy",
            build=build,
            config=CopyConfig,
            task_kind="seq2seq",
            description="Copy a random symbol sequence (decoder-only: src SEP tgt).",
        )
    )
