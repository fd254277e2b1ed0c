"""``fuzzy_recall``: MAD's fuzzy in-context recall, keys and values spelt by several tokens.

Poli et al., "Mechanistic Design and Scaling of Hybrid Architectures" (2024,
arXiv:2403.17844), the fuzzy in-context recall task, as the authors' generator defines it
(``generate_fuzzy_in_context_recall_instance`` in athms/mad-lab, ``multi_query: True`` and no
noise, as MAD's configuration sets them). One example of ``length`` L tokens (L - 1 inputs):

* the ``vocab`` symbols are a padding symbol ``_`` and ``vocab - 1`` content symbols, the
  first half keys (``k0``, ...) and the rest values (``v0``, ...);
* a key is a *motif* of 1 to ``key_tokens`` distinct key symbols, a value a motif of 1 to
  ``value_tokens`` distinct value symbols (ordered tuples without repeats, MAD's
  permutations). Training examples draw each key's size uniformly from 1 .. ``key_tokens``;
  evaluation examples always use keys of ``key_tokens`` symbols (MAD's "we always prompt at
  the maximum key motif size"). Each value's size is drawn uniformly;
* a probe pair (key and value) is drawn first and placed at a uniformly drawn position;
  the rest of the sequence is key-value pairs: a key drawn uniformly among motifs of its
  size, followed by the value it is bound to in this sequence (drawn on its first
  appearance; the probe's key always takes the probe's value);
* the last pair queries the probe key and its value; the sequence is left-padded with ``_``
  to L tokens.

Scoring follows MAD: evaluation scores exactly the value tokens of keys that appeared
earlier (their answer is in the context), the last query's included; training scores every
next token, padding included, as MAD trains on the whole shifted sequence. One difference:
MAD draws the probe's position in a range that can lie past the last pair it writes, so the
query's key is sometimes never bound before it is asked; here the position is drawn among
those the pairs reach, so every query is answerable.

``length`` is MAD's ``seq_len``; longer evaluation lengths hold more pairs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated, Any

from harness.plugin import Example, Ge, IntRange, Task, TaskConfig, TaskSpec, Vocab, hookimpl

PAD_SYMBOL = "_"
Motif = tuple[int, ...]


@dataclass
class FuzzyRecallConfig(TaskConfig):
    length: Annotated[int, Ge(8), IntRange(32, 4096, log=True)] = 128  # tokens (MAD's seq_len)
    vocab: Annotated[int, Ge(5), IntRange(8, 256, log=True)] = 16  # keys, values and the padding symbol
    key_tokens: Annotated[int, Ge(1), IntRange(1, 4)] = 3  # MAD's k_motif_size
    value_tokens: Annotated[int, Ge(1), IntRange(1, 4)] = 3  # MAD's v_motif_size
    num_train: Annotated[int, Ge(1)] = 12_800  # MAD's baseline training set
    num_val: Annotated[int, Ge(1)] = 1_280  # MAD's test set

    def __post_init__(self) -> None:
        super().__post_init__()
        content = self.vocab - 1
        if content // 2 < self.key_tokens or content - content // 2 < self.value_tokens:
            raise ValueError(
                f"vocab={self.vocab} gives {content // 2} key and {content - content // 2} value "
                f"symbols, too few for motifs of key_tokens={self.key_tokens} and "
                f"value_tokens={self.value_tokens} distinct symbols; raise vocab.")
        pair = self.key_tokens + self.value_tokens
        if self.length < 3 * pair + 1:
            raise ValueError(f"length {self.length} has no room for a bound pair and its query "
                             f"(pairs of up to {pair} tokens): use length >= {3 * pair + 1}.")


def motif(rng: random.Random, symbols: range, size: int) -> Motif:
    """``size`` distinct symbols in a uniformly drawn order (one of MAD's permutations)."""
    return tuple(rng.sample(symbols, size))


class FuzzyRecallTask(Task):
    """MAD fuzzy recall: multi-token keys bound to multi-token values, queried again."""

    task_kind = "lm"
    config: FuzzyRecallConfig

    def __init__(self, config: FuzzyRecallConfig, *, seed: int) -> None:
        content = config.vocab - 1
        half = content // 2
        symbols = ((PAD_SYMBOL,) + tuple(f"k{i}" for i in range(half))
                   + tuple(f"v{i}" for i in range(content - half)))
        super().__init__(config, seed=seed, vocab=Vocab(symbols))
        first = self.vocab.first_symbol
        self.pad = first
        self.keys = range(first + 1, first + 1 + half)
        self.values = range(first + 1 + half, first + 1 + content)

    def generate(self, split: str, length: int) -> list[Example]:
        rng = random.Random(self.split_seed(split, length))
        train = split == "train"
        return [self._example(rng, length, train=train) for _ in range(self.split_size(split))]

    def _key(self, rng: random.Random, train: bool) -> Motif:
        k = self.config.key_tokens
        return motif(rng, self.keys, rng.randint(1, k) if train else k)

    def _example(self, rng: random.Random, length: int, *, train: bool) -> Example:
        cfg = self.config
        probe_key = self._key(rng, train)
        probe_value = motif(rng, self.values, rng.randint(1, cfg.value_tokens))
        probe = len(probe_key) + len(probe_value)
        pair = cfg.key_tokens + cfg.value_tokens
        stop = length - probe - pair  # pairs start below this
        at = rng.randrange(stop - pair + 1)  # a pair starts within `pair` tokens after it
        bound: dict[Motif, Motif] = {probe_key: probe_value}
        presented: set[Motif] = set()
        tokens: list[int] = []
        answers: list[bool] = []
        while len(tokens) < stop:
            if probe_key not in presented and len(tokens) >= at:
                key = probe_key  # placed here unless it came up by chance before
            else:
                key = self._key(rng, train)
            fresh = motif(rng, self.values, rng.randint(1, cfg.value_tokens))
            value = bound.setdefault(key, fresh)
            tokens += [*key, *value]
            answers += [False] * len(key) + [key in presented] * len(value)
            presented.add(key)
        tokens += [*probe_key, *probe_value]
        answers += [False] * len(probe_key) + [True] * len(probe_value)
        pad = length + 1 - len(tokens)
        tokens = [self.pad] * pad + tokens
        answers = [False] * pad + answers
        mask = [True] * length if train else answers[1:]
        return {"tokens": tokens, "loss_mask": mask}


def reference(task: FuzzyRecallTask, example: Example) -> bool:
    """An evaluation example read as runs of key symbols and runs of value symbols after the
    padding (its keys all have ``key_tokens`` symbols): every key keeps one value, the last
    pair's key was bound before, and the scored tokens are exactly the values of keys seen
    earlier. A training example (every token scored) is checked for its padding and its
    last pair's key being bound before, the motifs' sizes varying."""
    tokens, mask = example["tokens"], example["loss_mask"]
    body = tokens[next(i for i, t in enumerate(tokens) if t != task.pad):]
    runs: list[tuple[bool, list[int]]] = []  # (is_key, symbols)
    for t in body:
        if t not in task.keys and t not in task.values:
            return False
        is_key = t in task.keys
        if runs and runs[-1][0] == is_key:
            runs[-1][1].append(t)
        else:
            runs.append((is_key, [t]))
    if not runs[0][0] or runs[-1][0] or len(runs) % 2:
        return False
    pairs = [(tuple(runs[i][1]), tuple(runs[i + 1][1])) for i in range(0, len(runs), 2)]
    train = all(mask)  # training scores every next token
    k = task.config.key_tokens
    bound: dict[tuple[int, ...], tuple[int, ...]] = {}
    expected = [False] * (len(tokens) - len(body))
    for key, value in pairs:
        size_ok = 1 <= len(key) <= k if train else len(key) == k
        seen = key in bound
        if not size_ok or len(value) > task.config.value_tokens or bound.setdefault(key, value) != value:
            return False
        expected += [False] * len(key) + [seen] * len(value)
    if not expected[-1]:
        return False  # the query's key must have been bound before
    return train or mask == expected[1:]


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="fuzzy_recall", build=FuzzyRecallTask, reference=reference))
