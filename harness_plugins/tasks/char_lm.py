"""``char_lm``: character-level language modelling on the works of Shakespeare.

The corpus ships with the project (``data/shakespeare.txt.bz2``: the 42 works in modern
spelling from the ``shakespeare`` 0.6 package, public domain; provenance, licence and the
recipe that rebuilds it byte for byte are in ``data/README.md``). Its sha256 is checked on
every load. Tokens are the corpus's characters (84 distinct, ASCII, newline included).

Splits are fixed and contiguous by character offset: train the first 90% of the text, val
the next 5%, test the last 5%; no character is in two splits, on any machine.

``length`` is the number of characters the model reads per example (it predicts each next
character: all positions are scored; perplexity and bits per character are logged).

* train: ``num_train`` windows of ``length + 1`` characters at offsets drawn uniformly (from
  the task seed) in the train split. Random offsets rather than consecutive windows, so a
  small ``num_train`` samples all the plays instead of the first few pages.
* val / test: the first ``num_val * length`` predicted characters of the split are scored at
  *every* evaluation length, so the extrapolation curve compares the same text. Protocols
  (``eval_protocol``), at every length n:

  - ``windows``: consecutive non-overlapping windows of n characters, all scored; early
    characters of each window see little context.
  - ``sliding``: windows of n characters advancing by ``score_last`` = k, scoring only their
    last k characters, so every scored character sees at least n - k characters of context
    (the sliding evaluation of Press et al., 2022, "Train Short, Test Long", ALiBi). The
    first windows take that context from the characters just before the split (unscored).
"""

from __future__ import annotations

import bz2
import hashlib
import random
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Annotated, Any

from harness.plugin import (
    Choice,
    Example,
    Ge,
    IntRange,
    PluginError,
    Task,
    TaskConfig,
    TaskSpec,
    Vocab,
    hookimpl,
    lm_windows,
)

DATA_FILE = "shakespeare.txt.bz2"
DATA_SHA256 = "a9661b5ed59bf7d0a5152c9d70579090fccb42323836a7b3c800ec048e918273"
SPLIT_FRACTIONS = {"train": (0.0, 0.90), "val": (0.90, 0.95), "test": (0.95, 1.0)}


@dataclass
class CharLMConfig(TaskConfig):
    length: Annotated[int, Ge(1), IntRange(16, 4096, log=True)] = 128  # characters read per example
    num_train: Annotated[int, Ge(1)] = 10_000  # training windows
    num_val: Annotated[int, Ge(1)] = 64  # scored text per evaluation: num_val * length characters
    eval_protocol: Annotated[str, Choice(("windows", "sliding"))] = "windows"
    score_last: Annotated[int, Ge(1)] = 32  # sliding protocol: characters scored per window

    def __post_init__(self) -> None:
        super().__post_init__()  # evaluation lengths are >= length
        if self.eval_protocol not in ("windows", "sliding"):
            raise ValueError(f"eval_protocol must be 'windows' or 'sliding', got {self.eval_protocol!r}")
        if self.eval_protocol == "sliding" and self.score_last > self.length:
            raise ValueError(
                f"score_last={self.score_last} must lie in [1, {self.length}] (the shortest "
                f"evaluation length): a sliding window cannot score more than it reads."
            )
        longest = max((self.length, *self.eval_lengths))
        if longest > self.num_val * self.length:
            raise ValueError(
                f"evaluation length {longest} is longer than the scored text (num_val * length "
                f"= {self.num_val * self.length} characters); raise num_val."
            )


@cache
def corpus() -> str:
    """The shipped corpus, decompressed, after checking the file's sha256."""
    data = resources.files(__package__).joinpath("data", DATA_FILE).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != DATA_SHA256:
        raise PluginError(
            f"{DATA_FILE} has sha256 {digest}, expected {DATA_SHA256}: the shipped corpus is "
            f"corrupt or was changed. Reinstall the package or rebuild the file as "
            f"harness_plugins/tasks/data/README.md describes."
        )
    return bz2.decompress(data).decode("ascii")


def split_offsets(total: int) -> dict[str, tuple[int, int]]:
    """Character offsets ``[start, end)`` of each split of a text of ``total`` characters."""
    return {name: (int(total * lo), int(total * hi)) for name, (lo, hi) in SPLIT_FRACTIONS.items()}


class CharLMTask(Task):
    """Character-level LM on Shakespeare (shipped, 90/5/5 contiguous splits)."""

    task_kind = "lm"
    report_perplexity = True
    config: CharLMConfig

    def __init__(self, config: CharLMConfig, *, seed: int) -> None:
        text = corpus()
        chars = sorted(set(text))
        super().__init__(config, seed=seed, vocab=Vocab(tuple(chars)))
        table = bytearray(range(256))
        for i, ch in enumerate(chars, self.vocab.first_symbol):
            table[ord(ch)] = i
        self.stream = text.encode("ascii").translate(bytes(table))  # token ids, one byte each
        self.offsets = split_offsets(len(self.stream))
        scored = config.num_val * config.length
        for split in ("val", "test"):
            start, end = self.offsets[split]
            if scored + 1 > end - start:
                raise ValueError(
                    f"num_val * length = {scored} characters exceeds the {split} split "
                    f"({end - start - 1} predictable characters); lower num_val or length."
                )

    def split_tokens(self, split: str) -> bytes:
        """The token ids of one split (a ``bytes`` object: a sequence of ints)."""
        start, end = self.offsets[split]
        return self.stream[start:end]

    def generate(self, split: str, length: int) -> list[Example]:
        if split == "train":
            return self._random_windows(length)
        start, _ = self.offsets[split]
        end = start + self.config.num_val * self.config.length + 1
        if self.config.eval_protocol == "windows":
            return lm_windows(self.stream[start:end], length)
        k = self.config.score_last
        context = length - k
        if start < context:
            raise ValueError(f"the {split} split has no {context} characters of context before it")
        return lm_windows(self.stream[start - context:end], length, score_last=k)

    def _random_windows(self, length: int) -> list[Example]:
        rng = random.Random(self.split_seed("train", length))
        start, end = self.offsets["train"]
        out = []
        for _ in range(self.config.num_train):
            at = rng.randrange(start, end - length)
            out.append({"tokens": list(self.stream[at: at + length + 1]), "loss_mask": [True] * length})
        return out


@hookimpl
def harness_register_task(register: Any) -> None:
    register(TaskSpec(name="char_lm", build=CharLMTask))
