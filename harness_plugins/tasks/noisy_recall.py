"""``noisy_recall``: MAD's (noisy) in-context recall, key-value pairs among noise tokens.

Poli et al., "Mechanistic Design and Scaling of Hybrid Architectures" (2024,
arXiv:2403.17844), the in-context recall and noisy in-context recall tasks, as the authors'
generator defines them (``generate_in_context_recall_instance`` in athms/mad-lab, with
``multi_query: True`` as every MAD configuration sets it). With ``frac_noise: 0`` this *is*
MAD's in-context recall (the ``associative_recall`` plugin is Zoology's MQAR, a different
layout); with a share of noise it is noisy in-context recall. One example of ``length`` L
tokens (L - 1 model inputs, L even):

* the ``vocab`` symbols split into ``vocab - noise_vocab`` content symbols, the first half
  keys (``k0``, ``k1``, ...) and the rest values (``v0``, ...), and ``noise_vocab`` noise
  symbols (``n0``, ...): MAD's ``vocab_size`` counts the noise vocabulary too;
* the sequence is L / 2 two-token slots. Each slot but the last is, with probability
  ``frac_noise``, two noise symbols drawn uniformly; otherwise a key drawn uniformly and its
  value: a key's first appearance draws its value uniformly, and every later appearance
  repeats that value (the binding holds for the whole sequence). One slot chosen uniformly is
  never noise, so the sequence binds at least one key;
* the last slot queries a key drawn uniformly from those the sequence bound, followed by its
  value.

Scoring follows MAD: evaluation scores exactly the values of keys that appeared earlier in
the sequence (their answer is in the context), the last query's included; training scores
every next token, as MAD trains on the whole shifted sequence (``is_training``). One
difference: MAD draws its guaranteed non-noise slot among all L / 2 slots, the query slot
included, which leaves no key bound when every other slot is noise (and fails); here it is
drawn among the slots before the query.

``length`` is MAD's ``seq_len``; longer evaluation lengths add slots with the same
vocabulary, so a query may recall a binding from further back.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated, Any

from harness.plugin import (
    Example,
    FloatRange,
    Ge,
    IntRange,
    Lt,
    Task,
    TaskConfig,
    TaskSpec,
    Vocab,
    hookimpl,
)


@dataclass
class NoisyRecallConfig(TaskConfig):
    length: Annotated[int, Ge(4), IntRange(16, 4096, log=True)] = 128  # tokens (MAD's seq_len), even
    vocab: Annotated[int, Ge(4), IntRange(8, 1024, log=True)] = 32  # keys, values and noise symbols
    noise_vocab: Annotated[int, Ge(0)] = 16  # noise symbols (part of vocab)
    frac_noise: Annotated[float, Ge(0.0), Lt(1.0), FloatRange(0.0, 0.9)] = 0.2  # share of noise slots
    num_train: Annotated[int, Ge(1)] = 12_800  # MAD's baseline training set
    num_val: Annotated[int, Ge(1)] = 1_280  # MAD's test set

    def __post_init__(self) -> None:
        super().__post_init__()
        odd = [n for n in (self.length, *self.eval_lengths) if n % 2]
        if odd:
            raise ValueError(f"lengths {odd} are odd: the sequence is two-token slots; use even lengths.")
        if self.vocab - self.noise_vocab < 2:
            raise ValueError(f"vocab={self.vocab} leaves {self.vocab - self.noise_vocab} key and value "
                             f"symbols after noise_vocab={self.noise_vocab}; raise vocab to at least "
                             f"{self.noise_vocab + 2}.")
        if self.frac_noise > 0 and self.noise_vocab == 0:
            raise ValueError(f"frac_noise={self.frac_noise} needs noise symbols; set noise_vocab >= 1.")


class NoisyRecallTask(Task):
    """MAD in-context recall: bindings repeated through the sequence, among noise slots."""

    task_kind = "lm"
    config: NoisyRecallConfig

    def __init__(self, config: NoisyRecallConfig, *, seed: int) -> None:
        content = config.vocab - config.noise_vocab
        half = content // 2
        symbols = (tuple(f"k{i}" for i in range(half)) + tuple(f"v{i}" for i in range(content - half))
                   + tuple(f"n{i}" for i in range(config.noise_vocab)))
        super().__init__(config, seed=seed, vocab=Vocab(symbols))
        first = self.vocab.first_symbol
        self.keys = range(first, first + half)
        self.values = range(first + half, first + content)
        self.noise = range(first + content, first + config.vocab)

    def generate(self, split: str, length: int) -> list[Example]:
        rng = random.Random(self.split_seed(split, length))
        return [self._example(rng, length, score_all=split == "train") for _ in range(self.split_size(split))]

    def _example(self, rng: random.Random, length: int, *, score_all: bool) -> Example:
        slots = length // 2
        keep = rng.randrange(slots - 1)  # a slot before the query that is never noise
        bound: dict[int, int] = {}
        tokens: list[int] = []
        answers: list[bool] = []  # per token: a value whose key appeared before
        for i in range(slots - 1):
            if i != keep and self.config.frac_noise > 0 and rng.random() < self.config.frac_noise:
                tokens += [rng.choice(self.noise), rng.choice(self.noise)]
                answers += [False, False]
                continue
            key = rng.choice(self.keys)
            seen = key in bound
            value = bound[key] if seen else bound.setdefault(key, rng.choice(self.values))
            tokens += [key, value]
            answers += [False, seen]
        key = rng.choice(sorted(bound))
        tokens += [key, bound[key]]
        answers += [False, True]
        mask = [True] * (length - 1) if score_all else answers[1:]
        return {"tokens": tokens, "loss_mask": mask}


def reference(task: NoisyRecallTask, example: Example) -> bool:
    """The example read slot by slot: keys keep one value, and an evaluation example scores
    exactly the values of keys bound earlier (the last one among them)."""
    tokens, mask = example["tokens"], example["loss_mask"]
    bound: dict[int, int] = {}
    scored = []
    for pos in range(0, len(tokens), 2):
        a, b = tokens[pos], tokens[pos + 1]
        if a in task.noise:
            if b not in task.noise:
                return False
            scored.append(False)
            continue
        if a not in task.keys or b not in task.values or bound.setdefault(a, b) != b:
            return False
        scored.append(sum(1 for p in range(0, pos, 2) if tokens[p] == a) > 0)
    if not scored[-1]:
        return False  # the query's key must have been bound before
    if all(mask):
        return True  # a training example: every next token is scored
    expected = [s for flag in scored for s in (False, flag)][1:]
    return bool(mask == expected)


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="noisy_recall", build=NoisyRecallTask, reference=reference))
