"""Text in, text out through a trained run's own tokenizer.

A run trained on a prepared corpus (``corpus_lm``) reads text through the corpus's tokenizer
(``bytes``, ``chars``, ``bpe:VOCAB`` or a ``tokenizer.json``): its token ids are the model's
ids. A folder written by ``harness export --format hf`` carries that tokenizer as
``tokenizer.json``. A run on a symbol task (``copy``, ``associative_recall``...) has no
tokenizer: its text is its vocabulary's symbols, separated by spaces (or one character each
when every symbol is one character); the special tokens are written ``<sep>``, ``<eos>``...

:func:`codec_of` finds the right one for a :class:`~harness.run.trained.Trained`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.data.vocab import BOS, EOS, SPECIALS, Vocab
from harness.errors import ConfigError

#: The tokenizer file beside a model's weights (the Hugging Face name).
TOKENIZER_FILE = "tokenizer.json"


@dataclass
class TokenizerCodec:
    """A corpus tokenizer (:mod:`harness.data.tokenizers`); ids are the model's ids."""

    tokenizer: Any

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
        return self.tokenizer.encode(text)

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
    """The codec of a trained run: the tokenizer saved beside its weights, else its task's
    (the corpus's, built again from the recorded config), else its vocabulary's symbols."""
    source = Path(trained.source)
    saved = source / TOKENIZER_FILE if source.is_dir() else None
    if saved is not None and saved.is_file():
        return codec_from_json(saved.read_text(encoding="utf-8"), trained.vocab, str(saved))
    tokenizer = task_tokenizer(trained.config)
    if tokenizer is not None:
        return TokenizerCodec(tokenizer)
    return SymbolCodec(trained.vocab)


def task_tokenizer(config: dict[str, Any]) -> Any:
    """The tokenizer of a run's task (``Task.tokenizer``), the task built again from its config;
    None for a task without one."""
    from harness.config import parse_run_config
    from harness.run.build import build_task
    from harness.run.plan import load_registry, plan

    data = dict(config)
    data["tracking"] = {k: v for k, v in (data.get("tracking") or {}).items() if k != "uri"}
    cfg = parse_run_config(data, "the trained model's config")
    p = plan(cfg, load_registry(cfg, None))
    task = build_task(p, seed=cfg.train.data_seed)
    return getattr(task, "tokenizer", None)
