"""``induction_head``: after ``... T a ... T``, predict ``a`` (recall what followed a trigger).

The synthetic induction-head task of Fu, Dao et al., "Hungry Hungry Hippos: Towards Language
Modeling with State Space Models" (ICLR 2023, arXiv:2212.14052, Section 3.1), after the
induction heads of Olsson et al. (2022, "In-context Learning and Induction Heads"): a
sequence of random symbols contains a special trigger token ``T`` once, followed by some
symbol ``a``; the sequence ends with ``T`` again and the model must predict ``a``.

One example of ``length`` L model inputs has L + 1 tokens: ``tokens[L - 1]`` is the final
trigger and ``tokens[L]`` the answer; the first trigger sits at a position drawn uniformly
from ``0 .. L - 3`` (so the answer may be anywhere from 1 to L - 2 positions back, and is
never the token right before the final trigger), followed by the answer; every other token
is drawn uniformly from the ``vocab`` content symbols (``s0`` ...), never the trigger. Only
the last target (the answer) is scored.

Longer evaluation lengths add random context, so the trigger may lie further back.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated, Any

import harness
from harness.data import Example, Task, TaskConfig, Vocab
from harness.params import IntRange
from harness.registry import TaskSpec

TRIGGER = "T"


@dataclass
class InductionHeadConfig(TaskConfig):
    length: Annotated[int, IntRange(8, 4096, log=True)] = 32  # model inputs per example
    vocab: Annotated[int, IntRange(2, 1024, log=True)] = 16  # content symbols (without T)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vocab < 2:
            raise ValueError(f"vocab must be at least 2, got {self.vocab}")
        short = [n for n in (self.length, *self.eval_lengths) if n < 4]
        if short:
            raise ValueError(f"lengths {short} are too short: induction_head needs length >= 4")


class InductionHeadTask(Task):
    task_kind = "lm"
    config: InductionHeadConfig

    def __init__(self, config: InductionHeadConfig, *, seed: int) -> None:
        symbols = (TRIGGER, *(f"s{i}" for i in range(config.vocab)))
        super().__init__(config, seed=seed, vocab=Vocab(symbols))
        self.trigger = self.vocab.first_symbol
        self.content = range(self.trigger + 1, self.vocab.size)

    def generate(self, split: str, length: int) -> list[Example]:
        rng = random.Random(self.split_seed(split, length))
        out = []
        for _ in range(self.split_size(split)):
            tokens = rng.choices(self.content, k=length + 1)
            first = rng.randrange(length - 2)
            tokens[first] = tokens[length - 1] = self.trigger
            tokens[length] = tokens[first + 1]
            out.append({"tokens": tokens, "loss_mask": [False] * (length - 1) + [True]})
        return out


def build(config: InductionHeadConfig, *, seed: int) -> InductionHeadTask:
    return InductionHeadTask(config, seed=seed)


@harness.hookimpl
def harness_register_task(register: Any) -> None:
    register(
        TaskSpec(
            name="induction_head",
            build=build,
            config=InductionHeadConfig,
            task_kind="lm",
            description="Recall the symbol that followed the earlier trigger token (H3).",
        )
    )
