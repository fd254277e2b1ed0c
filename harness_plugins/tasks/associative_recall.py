"""``associative_recall``: multi-query associative recall (MQAR), as defined in Zoology.

Arora, Eyuboglu et al., "Zoology: Measuring and Improving Recall in Efficient Language
Models" (ICLR 2024, arXiv:2312.04927), the MQAR definition, and the authors' reference
generator (``zoology/data/multiquery_ar.py`` in HazyResearch/zoology), which fixes the
details below. One example of ``length`` L model inputs with D = ``num_kv_pairs``:

* keys are drawn from the first half of the ``vocab`` symbols (``k0``, ``k1``, ...) and values
  from the second half (``v0``, ``v1``, ...): the two sets are disjoint. Each example binds D
  *distinct* keys to D distinct values;
* the prefix lists the bindings: ``k_1 v_1 k_2 v_2 ... k_D v_D`` (2D tokens);
* the rest is ``(L - 2D) // 2`` two-token slots. Every key is queried exactly once, in a
  slot chosen without replacement with probability proportional to ``a * i**(a - 1)`` for
  the slot's rank i = 1, 2, ... (a power law with exponent ``power_a`` = a: with the default
  a = 0.01 most queries come soon after the prefix, a few far away; a = 1 is uniform). This
  mimics how the gap between repeated bigrams is distributed in real text;
* a query is its key followed by the bound value; every other slot holds two random symbols
  (Zoology's ``random_non_queries``), which may include keys and values.

Only the answers are scored: the loss mask is True exactly at the positions whose next token
(the target) is the value that answers a query; the prefix and the noise are never scored.

Zoology's example has L + 1 tokens (inputs ``[:-1]``, labels ``[1:]``), and so does ours. One
difference in form, not in what is measured: Zoology feeds a noise token after a query and
keeps the value only as the label; here the value is the next token of the sequence (the
``lm`` format reads targets from the tokens). A causal model cannot see it when predicting it,
and since each key is queried once, a revealed answer never helps a later query.

``length`` is the number of model inputs L. Longer evaluation lengths keep D and the
vocabulary and add query slots, so queries may lie further from the bindings. Every length
must leave at least D slots: L >= 4D.
"""

from __future__ import annotations

import bisect
import itertools
import random
from dataclasses import dataclass
from typing import Annotated, Any

from harness.plugin import (
    Example,
    FloatRange,
    Ge,
    Gt,
    IntRange,
    Le,
    Task,
    TaskConfig,
    TaskSpec,
    Vocab,
    hookimpl,
)


@dataclass
class AssociativeRecallConfig(TaskConfig):
    length: Annotated[int, Ge(1), IntRange(16, 2048, log=True)] = 32  # model inputs per example
    vocab: Annotated[int, Ge(2), IntRange(16, 8192, log=True)] = 32  # symbols: half keys, half values
    num_kv_pairs: Annotated[int, Ge(1), IntRange(1, 64, log=True)] = 4
    power_a: Annotated[float, Gt(0.0), Le(1.0), FloatRange(0.01, 1.0, log=True)] = 0.01  # query-gap power law

    def __post_init__(self) -> None:
        super().__post_init__()  # evaluation lengths are >= length
        d = self.num_kv_pairs
        if self.vocab // 2 < d:
            raise ValueError(
                f"vocab={self.vocab} gives {self.vocab // 2} keys and values, fewer than "
                f"num_kv_pairs={d}; raise vocab to at least {2 * d}."
            )
        if self.length < 4 * d:
            raise ValueError(
                f"length {self.length} leaves fewer query slots than num_kv_pairs={d}: every "
                f"length must be at least 4 * num_kv_pairs = {4 * d}."
            )


def gap_weights(slots: int, power_a: float) -> list[float]:
    """Unnormalised probability of each query slot (rank 1, 2, ...): ``a * i**(a-1)``."""
    return [power_a * i ** (power_a - 1) for i in range(1, slots + 1)]


def sample_slots(rng: random.Random, cum_weights: list[float], k: int) -> list[int]:
    """``k`` distinct slot indices drawn one after another in proportion to their weights
    among the slots not yet taken (sampling without replacement, as ``numpy.random.choice``
    does). Rejecting repeats of a draw from all slots gives exactly that conditional law."""
    chosen: list[int] = []
    taken: set[int] = set()
    total = cum_weights[-1]
    while len(chosen) < k:
        slot = bisect.bisect_right(cum_weights, rng.random() * total)
        slot = min(slot, len(cum_weights) - 1)
        if slot not in taken:
            taken.add(slot)
            chosen.append(slot)
    return chosen


class AssociativeRecallTask(Task):
    """Zoology MQAR: key-value bindings, power-law-placed queries; answers scored."""

    task_kind = "lm"
    config: AssociativeRecallConfig

    def __init__(self, config: AssociativeRecallConfig, *, seed: int) -> None:
        half = config.vocab // 2
        symbols = tuple(f"k{i}" for i in range(half)) + tuple(
            f"v{i}" for i in range(config.vocab - half)
        )
        super().__init__(config, seed=seed, vocab=Vocab(symbols))
        first = self.vocab.first_symbol
        self.keys = range(first, first + half)
        self.values = range(first + half, first + config.vocab)

    def generate(self, split: str, length: int) -> list[Example]:
        rng = random.Random(self.split_seed(split, length))
        slots = (length - 2 * self.config.num_kv_pairs) // 2
        cum = list(itertools.accumulate(gap_weights(slots, self.config.power_a)))
        return [self._example(rng, length, cum) for _ in range(self.split_size(split))]

    def _example(self, rng: random.Random, length: int, cum_weights: list[float]) -> Example:
        d = self.config.num_kv_pairs
        keys = rng.sample(self.keys, d)
        values = rng.sample(self.values, d)
        tokens = [t for pair in zip(keys, values, strict=True) for t in pair]
        prefix = len(tokens)
        symbols = range(self.vocab.first_symbol, self.vocab.size)
        tokens += rng.choices(symbols, k=length + 1 - prefix)
        mask = [False] * length
        for key, value, slot in zip(keys, values, sample_slots(rng, cum_weights, d), strict=True):
            pos = prefix + 2 * slot
            tokens[pos], tokens[pos + 1] = key, value
            mask[pos] = True  # target at pos is tokens[pos + 1], the value
        return {"tokens": tokens, "loss_mask": mask}


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="associative_recall", build=AssociativeRecallTask))
