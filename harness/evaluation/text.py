"""Text in, text out through a trained run's own tokenizer.

A run trained on a prepared corpus (``corpus_lm``) reads text through the corpus's tokenizer
(``bytes``, ``chars``, ``bpe:VOCAB`` or a ``tokenizer.json``): its token ids are the model's
ids. The run keeps that tokenizer beside its weights and every exported folder carries it as
``tokenizer.json``; a run recorded before that reads it from its corpus, checked to be the
one it trained with (:mod:`harness.run.identity`). A run on a symbol task (``copy``,
``associative_recall``...) has no tokenizer: its text is its vocabulary's symbols, separated
by spaces (or one character each when every symbol is one character); the special tokens are
written ``<sep>``, ``<eos>``...

**Unknown characters.** A tokenizer with an ``<unk>`` token (``chars``; a ``tokenizer.json``
with one) reads a character it never saw in training as ``<unk>``, so two texts that differ
only in such characters score the same. :class:`TokenizerCodec` counts them
(:meth:`TokenizerCodec.unknown_report`): ``harness eval`` and ``harness generate`` warn with one
``warning:`` line, and ``harness eval`` logs the count (``eval/unknown_chars``) and the tag
``harness.eval_unknown``.

:func:`codec_of` finds the right one for a :class:`~harness.run.trained.Trained`.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from harness.data.vocab import BOS, EOS, SPECIALS, Vocab
from harness.errors import ConfigError

#: Distinct unknown characters a report names.
SHOWN_UNKNOWN = 12


@dataclass
class TokenizerCodec:
    """A corpus tokenizer (:mod:`harness.data.tokenizers`); ids are the model's ids, below
    ``vocab_size`` (the model's) when given."""

    tokenizer: Any
    vocab_size: int | None = None
    #: characters read as <unk> (each with how often), and the texts they came in
    unknown: Counter[str] = field(default_factory=Counter)
    texts_with_unknown: int = 0

    @property
    def name(self) -> str:
        return str(self.tokenizer.name)

    @property
    def prefix_id(self) -> int:
        """What precedes a document in training: the end of the one before (``<eod>``)."""
        return int(self.tokenizer.eod_id)

    @property
    def stop_ids(self) -> frozenset[int]:
        return frozenset({EOS, int(self.tokenizer.eod_id)})

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text)
        pieces = self.tokenizer.unknown_pieces(text, ids)
        if pieces:
            self.unknown.update(pieces)
            self.texts_with_unknown += 1
        if self.vocab_size is not None and ids and max(ids) >= self.vocab_size:
            from harness.run.identity import DataChanged

            raise DataChanged(
                f"the tokenizer {self.name} gives token id {max(ids):,}, and the model knows "
                f"{self.vocab_size:,} ids: it is not the tokenizer the model trained with (its "
                f"vocabulary grew). Use the run's own tokenizer (runs keep it beside their weights; "
                f"`harness export RUN_ID --out DIR` carries it).")
        return ids

    def unknown_report(self) -> str | None:
        """One sentence on the characters read as ``<unk>`` so far, or None when there were none."""
        if not self.unknown:
            return None
        total = sum(self.unknown.values())
        shown = ", ".join(repr(c) for c, _ in self.unknown.most_common(SHOWN_UNKNOWN))
        more = f" and {len(self.unknown) - SHOWN_UNKNOWN} more" if len(self.unknown) > SHOWN_UNKNOWN else ""
        return (f"{total:,} character{'s' if total != 1 else ''} in {self.texts_with_unknown:,} "
                f"text{'s' if self.texts_with_unknown != 1 else ''} are not in the run's vocabulary "
                f"(tokenizer {self.name}) and were read as <unk>: {shown}{more}. Texts that differ only "
                f"in them score the same; a choice written in them is not judged on its own text.")

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))

    def to_json(self) -> str:
        return str(self.tokenizer.to_json())


@dataclass
class SymbolCodec:
    """A symbol task's vocabulary as text: symbols separated by spaces, or characters."""

    vocab: Vocab

    @property
    def name(self) -> str:
        return "symbols"

    @property
    def chars(self) -> bool:
        return all(len(s) == 1 for s in self.vocab.symbols)

    @property
    def prefix_id(self) -> int:
        return BOS

    @property
    def stop_ids(self) -> frozenset[int]:
        return frozenset({EOS})

    def _ids(self) -> dict[str, int]:
        ids = {s: i for i, s in enumerate(SPECIALS)}
        ids.update({s: self.vocab.first_symbol + i for i, s in enumerate(self.vocab.symbols)})
        return ids

    def encode(self, text: str) -> list[int]:
        ids = self._ids()
        if self.chars:
            pieces = list(text) if " " in ids else list(text.replace(" ", ""))
        else:
            pieces = text.split()
        unknown = [p for p in pieces if p not in ids]
        if unknown:
            shown = ", ".join(repr(s) for s in list(self.vocab.symbols)[:12])
            raise ConfigError(
                f"{unknown[0]!r} is not in the run's vocabulary "
                f"({len(self.vocab.symbols)} symbols: {shown}"
                f"{' ...' if len(self.vocab.symbols) > 12 else ''}; specials {', '.join(SPECIALS)}). "
                f"This run was trained on a symbol task: write its text in those symbols"
                f"{', separated by spaces' if not self.chars else ''}.")
        return [ids[p] for p in pieces]

    def decode(self, ids: list[int]) -> str:
        shown = [i for i in ids if i >= self.vocab.first_symbol]
        return self.vocab.decode(shown, sep="" if self.chars else " ")

    def to_json(self) -> str:
        return json.dumps({"harness_symbols": list(self.vocab.symbols)})


Codec = TokenizerCodec | SymbolCodec


def codec_from_json(text: str, vocab: Vocab, name: str) -> Codec:
    """The codec saved by :meth:`to_json` (a tokenizer file, or a symbol list)."""
    from harness.data.tokenizers import tokenizer_from_json

    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and "harness_symbols" in data:
        return SymbolCodec(vocab)
    return TokenizerCodec(tokenizer_from_json(text, name))


def codec_of(trained: Any) -> Codec:
    """The codec of a trained run: its tokenizer (saved beside its weights, else its task's,
    checked: :func:`harness.run.saved.tokenizer_of`), else its vocabulary's symbols."""
    from harness.run.saved import tokenizer_of

    tokenizer = tokenizer_of(trained)
    if tokenizer is not None:
        return TokenizerCodec(tokenizer, int(trained.info.vocab_size))
    return SymbolCodec(trained.vocab)
