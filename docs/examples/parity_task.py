"""``parity``: classify a bit string by the parity of its ones (Hahn, 2020: a function
self-attention struggles to represent)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from harness.plugin import Example, Task, TaskConfig, TaskSpec, Vocab, hookimpl


@dataclass
class ParityConfig(TaskConfig):  # length, eval_lengths, num_train, num_val come with the base
    pass


class ParityTask(Task):
    """Parity of a random bit string: label 1 if it has an odd number of ones."""

    task_kind = "classification"

    def __init__(self, config: ParityConfig, *, seed: int) -> None:
        super().__init__(config, seed=seed, vocab=Vocab(("0", "1")), num_classes=2)

    def generate(self, split: str, length: int) -> list[Example]:
        rng = random.Random(self.split_seed(split, length))
        zero = self.vocab.first_symbol
        out = []
        for _ in range(self.split_size(split)):
            bits = [rng.randrange(2) for _ in range(length)]
            out.append({"tokens": [zero + b for b in bits], "label": sum(bits) % 2})
        return out


def parity_reference(task: ParityTask, example: dict[str, Any]) -> bool:
    """An example is right when its label is the parity of the '1' symbols it spells."""
    ones = sum(task.vocab.token(t) == "1" for t in example["tokens"])
    return bool(example["label"] == ones % 2)


@hookimpl
def harness_register_task(register):
    register(TaskSpec(name="parity", build=ParityTask, reference=parity_reference))
