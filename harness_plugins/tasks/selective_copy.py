"""``selective_copy``: copy the content tokens of a noisy sequence, in order, without the noise.

The Selective Copying task of Gu & Dao, "Mamba: Linear-Time Sequence Modeling with Selective
State Spaces" (2023, arXiv:2312.00752, Section 3.1 and Appendix E.1), a variant of the
copying task of Arjovsky et al. (2016) in which the tokens to remember sit at random
positions: a model must decide from the *content* of a token whether to keep it, which a
time-invariant (convolutional) model cannot.

Source: ``length`` tokens, of which ``num_tokens`` are content symbols (``d0`` ... drawn
uniformly, with replacement, from ``vocab`` symbols) at positions sampled uniformly without
replacement; every other position holds the noise symbol ``.``. Target: the content symbols
in their order of appearance (no EOS: the target always has ``num_tokens`` symbols).

This is a ``seq2seq`` task, like ``copy``: decoder-only models see ``src SEP tgt`` (SEP plays
the role of Mamba's marker tokens) and are scored on the target only; encoder-decoder models
read the source and write the target. ``length`` is the length of the source; longer
evaluation lengths keep ``num_tokens`` and add noise, so the content is spread further apart.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated, Any

from harness.plugin import Example, Ge, IntRange, Task, TaskConfig, TaskSpec, Vocab, hookimpl

NOISE = "."


@dataclass
class SelectiveCopyConfig(TaskConfig):
    length: Annotated[int, Ge(1), IntRange(8, 4096, log=True)] = 32  # source tokens, content + noise
    num_tokens: Annotated[int, Ge(1), IntRange(1, 64, log=True)] = 8  # content tokens to copy
    vocab: Annotated[int, Ge(1), IntRange(2, 64, log=True)] = 8  # distinct content symbols

    def __post_init__(self) -> None:
        super().__post_init__()  # evaluation lengths are >= length
        if self.length < self.num_tokens:
            raise ValueError(
                f"length {self.length} is shorter than num_tokens={self.num_tokens}: the source "
                f"must have room for every content token."
            )


class SelectiveCopyTask(Task):  # same shape as skip_dependency.py, induction_head.py by design: one file per variant
    """Mamba's selective copying: copy the content tokens, skip the noise."""

    task_kind = "seq2seq"
    config: SelectiveCopyConfig

    def __init__(self, config: SelectiveCopyConfig, *, seed: int) -> None:
        symbols = (NOISE, *(f"d{i}" for i in range(config.vocab)))
        super().__init__(config, seed=seed, vocab=Vocab(symbols))
        self.noise = self.vocab.first_symbol
        self.content = range(self.noise + 1, self.vocab.size)

    def generate(self, split: str, length: int) -> list[Example]:
        rng = random.Random(self.split_seed(split, length))
        k = self.config.num_tokens
        out = []
        for _ in range(self.split_size(split)):
            tgt = rng.choices(self.content, k=k)
            src = [self.noise] * length
            for pos, token in zip(sorted(rng.sample(range(length), k)), tgt, strict=True):
                src[pos] = token
            out.append({"src": src, "tgt": tgt})
        return out


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="selective_copy", build=SelectiveCopyTask))
