"""``skip_dependency``: the next word depends on a cue word many positions back.

Modelled on "check the battery log ... it ran [down]" versus "check the program log ... it
ran [please]": the words right before the answer (``it ran``) are the same in every example,
so no short context predicts the answer; only the cue word of the opening phrase
``check the <cue> log`` does, through a fixed mapping (cue ``c<i>`` -> answer ``a<i>``) that
holds across the whole task and must be learned in training.

One example of ``length`` L model inputs has L + 1 tokens::

    [fillers] check the c<i> log [fillers, decoys] it ran a<i>

* fillers are drawn uniformly from ``num_fillers`` words (``w0`` ...), which are never frame,
  cue or answer words. The opening phrase starts after a random number of fillers, at most a
  quarter of them, so the cue lies at least ~3/4 of the sequence before the answer;
* ``num_decoys`` filler positions, anywhere before or after the opening phrase, hold *other*
  cue words (never the true cue): a model must bind the cue of the phrase, not the most
  recent or the first cue-like word;
* only the answer (the last target) is scored.

Longer evaluation lengths add fillers, pushing the cue further back. Every length must leave
room for the 7 fixed tokens and the decoys: L >= 6 + ``num_decoys``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated, Any

from harness.plugin import Example, Ge, IntRange, Task, TaskConfig, TaskSpec, Vocab, hookimpl

OPENING = ("check", "the")  # then the cue, then CLOSING
CLOSING = "log"
TRIGGER = ("it", "ran")  # then the answer
FIXED_TOKENS = len(OPENING) + 2 + len(TRIGGER) + 1


@dataclass
class SkipDependencyConfig(TaskConfig):
    length: Annotated[int, Ge(1), IntRange(8, 4096, log=True)] = 32  # model inputs per example
    num_cues: Annotated[int, Ge(2), IntRange(2, 64, log=True)] = 8  # cue words (= answer words)
    num_fillers: Annotated[int, Ge(1), IntRange(2, 1024, log=True)] = 32  # filler words
    num_decoys: Annotated[int, Ge(0), IntRange(0, 4)] = 1  # other cue words among the fillers

    def __post_init__(self) -> None:
        super().__post_init__()  # evaluation lengths are >= length
        need = FIXED_TOKENS - 1 + self.num_decoys
        if self.length < need:
            raise ValueError(
                f"length {self.length} is too short: the opening phrase, trigger, answer and "
                f"{self.num_decoys} decoy(s) need length >= {need}."
            )


class SkipDependencyTask(Task):  # same shape as selective_copy.py by design: one file per variant
    """Predict the word bound to a cue far back ('check the battery log … it ran down')."""

    task_kind = "lm"
    config: SkipDependencyConfig

    def __init__(self, config: SkipDependencyConfig, *, seed: int) -> None:
        n = config.num_cues
        symbols = (
            *OPENING, CLOSING, *TRIGGER,
            *(f"c{i}" for i in range(n)),
            *(f"a{i}" for i in range(n)),
            *(f"w{i}" for i in range(config.num_fillers)),
        )
        super().__init__(config, seed=seed, vocab=Vocab(symbols))
        ids = {s: i for i, s in enumerate(symbols, self.vocab.first_symbol)}
        self.opening = [ids[w] for w in OPENING]
        self.closing = ids[CLOSING]
        self.trigger = [ids[w] for w in TRIGGER]
        self.cues = [ids[f"c{i}"] for i in range(n)]
        self.answers = [ids[f"a{i}"] for i in range(n)]
        self.fillers = [ids[f"w{i}"] for i in range(config.num_fillers)]

    def generate(self, split: str, length: int) -> list[Example]:
        rng = random.Random(self.split_seed(split, length))
        return [self._example(rng, length) for _ in range(self.split_size(split))]

    def _example(self, rng: random.Random, length: int) -> Example:
        cue = rng.randrange(self.config.num_cues)
        free = length + 1 - FIXED_TOKENS
        filler = rng.choices(self.fillers, k=free)
        others = [c for i, c in enumerate(self.cues) if i != cue]
        for pos in rng.sample(range(free), self.config.num_decoys):
            filler[pos] = rng.choice(others)
        start = rng.randrange(free // 4 + 1)
        tokens = (
            filler[:start] + self.opening + [self.cues[cue], self.closing] + filler[start:]
            + self.trigger + [self.answers[cue]]
        )
        return {"tokens": tokens, "loss_mask": [False] * (length - 1) + [True]}


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="skip_dependency", build=SkipDependencyTask))
