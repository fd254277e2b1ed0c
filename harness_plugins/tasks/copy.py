"""``copy``: reproduce a random sequence of symbols.

Source: ``length`` symbols drawn uniformly from ``vocab`` symbols; target: the same
sequence. Decoder-only models see ``src SEP tgt`` and are scored on the target only.
The ``length`` is the number of symbols to copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from harness.plugin import Example, Ge, IntRange, Task, TaskConfig, TaskSpec, Vocab, hookimpl


@dataclass
class CopyConfig(TaskConfig):
    vocab: Annotated[int, Ge(1), IntRange(2, 64, log=True)] = 8  # distinct symbols

    def meaningless(self) -> list[str]:
        """Legal settings that leave nothing to learn (warned about by the harness)."""
        return ["vocab=1: every sequence is the same symbol, there is nothing to learn"] if self.vocab == 1 else []


class CopyTask(Task):
    """Copy a random symbol sequence (decoder-only: src SEP tgt)."""

    task_kind = "seq2seq"
    config: CopyConfig

    def __init__(self, config: CopyConfig, *, seed: int) -> None:
        super().__init__(config, seed=seed, vocab=Vocab(tuple(f"s{i}" for i in range(config.vocab))))

    def generate(self, split: str, length: int) -> list[Example]:
        return self.transduction_examples(split, length, list)


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="copy", build=CopyTask))
