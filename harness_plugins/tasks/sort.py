"""``sort``: output the source symbols in ascending order.

Source: ``length`` symbols drawn uniformly, with replacement, from ``vocab`` ordered symbols
(``00`` < ``01`` < ...); target: the same multiset, sorted. Token ids follow the symbol order,
so the target is ``sorted(src)``. Unlike ``copy``, every output position depends on the whole
input (counting), so a model cannot succeed by attending to one aligned position.

The ``length`` is the number of symbols to sort; any longer evaluation length works (the
symbols are the same, only more of them). No EOS: the target length equals the source
length. Decoder-only models see ``src SEP tgt`` and are scored on the target only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from harness.plugin import Example, Ge, IntRange, Task, TaskConfig, TaskSpec, Vocab, hookimpl


@dataclass
class SortConfig(TaskConfig):
    length: Annotated[int, Ge(1), IntRange(4, 256, log=True)] = 8  # symbols to sort
    vocab: Annotated[int, Ge(2), IntRange(2, 64, log=True)] = 16  # distinct symbols


class SortTask(Task):
    """Sort a random symbol sequence (with repeats) in ascending order."""

    task_kind = "seq2seq"
    config: SortConfig

    def __init__(self, config: SortConfig, *, seed: int) -> None:
        width = len(str(config.vocab - 1))
        symbols = tuple(str(i).zfill(width) for i in range(config.vocab))
        super().__init__(config, seed=seed, vocab=Vocab(symbols))

    def generate(self, split: str, length: int) -> list[Example]:
        return self.transduction_examples(split, length, sorted)


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="sort", build=SortTask))
