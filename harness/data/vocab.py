"""Every task's vocabulary: the special tokens (ids 0-3: pad, bos, eos, sep), a task's symbols
after them, and an example's form (a dict of token-id lists). The bottom of the data layer:
tasks and batch formats both build on it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SPECIALS = ("<pad>", "<bos>", "<eos>", "<sep>")
PAD, BOS, EOS, SEP = range(len(SPECIALS))

Example = dict[str, Any]


@dataclass(frozen=True)
class Vocab:
    """Special tokens first (ids 0-3: pad, bos, eos, sep), then the task's symbols."""

    symbols: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(SPECIALS) + len(self.symbols)

    @property
    def first_symbol(self) -> int:
        return len(SPECIALS)

    def token(self, i: int) -> str:
        return SPECIALS[i] if i < len(SPECIALS) else self.symbols[i - len(SPECIALS)]

    def decode(self, ids: Sequence[int], sep: str = " ") -> str:
        return sep.join(self.token(int(i)) for i in ids)
