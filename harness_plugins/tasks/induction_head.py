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

from harness.plugin import Example, Ge, IntRange, Task, TaskConfig, TaskSpec, Vocab, hookimpl

TRIGGER = "T"


@dataclass
class InductionHeadConfig(TaskConfig):
    # model inputs per example: >= 4 (trigger, answer, a token between, the final trigger)
    length: Annotated[int, Ge(4), IntRange(8, 4096, log=True)] = 32
    vocab: Annotated[int, Ge(2), IntRange(2, 1024, log=True)] = 16  # content symbols (without T)


class InductionHeadTask(Task):  # same shape as selective_copy.py by design: one file per variant
    """Recall the symbol that followed the earlier trigger token (H3)."""

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


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="induction_head", build=InductionHeadTask))
