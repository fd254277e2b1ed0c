"""Tokenizers of prepared corpora: ``bytes``, ``chars``, ``bpe:VOCAB`` or an existing
``tokenizer.json``.

Every tokenizer keeps the harness's special tokens at their ids (``<pad>`` 0, ``<bos>`` 1,
``<eos>`` 2, ``<sep>`` 3: :data:`harness.data.tasks.SPECIALS`) and adds an end-of-document
token ``<eod>`` at id 4, which ``harness data prepare`` puts after every document.

``bytes``       the UTF-8 bytes of the text: byte ``b`` is id ``5 + b`` (261 ids).
``chars``       the characters of the corpus's train split (sorted by code point) from id 6;
                id 5 is ``<unk>``, which a character unseen in train becomes.
``bpe:VOCAB``   a byte-level BPE (GPT-2 style pre-tokenisation) trained on the train split
                with Hugging Face ``tokenizers``; ``VOCAB`` counts every id, specials included.
a path          an existing Hugging Face ``tokenizer.json``. If its ids 0-4 are not already
                ``<pad> <bos> <eos> <sep> <eod>``, its ids are shifted up by 5 so the
                harness's specials keep theirs.

:meth:`Tokenizer.save` writes one JSON file: a Hugging Face ``tokenizer.json`` for ``bpe`` and
file tokenizers (loadable by ``tokenizers.Tokenizer.from_file`` as it is), a small JSON
object for ``bytes`` and ``chars``. :func:`load_tokenizer` reads either; a file that does not
load is a :class:`~harness.errors.ConfigError`. Nothing is unpickled.

:meth:`Tokenizer.token_bytes` gives the UTF-8 bytes each id stands for (0 for the specials),
which bits per byte needs. It is exact for ``bytes``, ``chars`` and byte-level BPE; for a
tokenizer file that is not byte-level it is the byte length of each token decoded alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from harness.data.vocab import SPECIALS
from harness.errors import ConfigError

EOD = "<eod>"
UNK = "<unk>"
#: Special tokens at ids 0-4: the harness's four, then the end-of-document token.
RESERVED = (*SPECIALS, EOD)
EOD_ID = len(SPECIALS)
#: The smallest ``bpe:VOCAB``: the 256 byte symbols, the specials and a few merges.
MIN_BPE_VOCAB = 300
#: The largest ``bpe:VOCAB`` (2^20 ids: four times the largest vocabularies in use; the
#: trainer allocates for the size asked, and past this it aborts the process).
MAX_BPE_VOCAB = 1 << 20
#: The format tag of the harness's own tokenizer files (``bytes``, ``chars``).
FORMAT_KEY = "harness_tokenizer"


class Tokenizer:
    """Text to token ids and back. Subclasses: :class:`ByteTokenizer`,
    :class:`CharTokenizer`, :class:`HFTokenizer`."""

    name: str = ""
    vocab_size: int = 0
    eod_id: int = EOD_ID

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.encode_array(text)]

    def encode_array(self, text: str) -> np.ndarray:
        """The ids of ``text`` as an integer array (the fast path of prepare; its dtype
        holds ``vocab_size`` ids but is otherwise the tokenizer's choice)."""
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [self.encode_array(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def unknown_pieces(self, text: str, ids: Sequence[int]) -> list[str]:
        """The pieces of ``text`` this tokenizer read as ``<unk>`` (``ids``: its encoding);
        none for a tokenizer that reads every text (bytes, byte-level BPE)."""
        return []

    def token_bytes(self) -> np.ndarray:
        """Per id, the UTF-8 bytes it stands for (int64; 0 for special tokens)."""
        raise NotImplementedError

    def to_json(self) -> str:
        raise NotImplementedError

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    def __repr__(self) -> str:
        return f"<tokenizer {self.name}: {self.vocab_size} ids>"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes: byte ``b`` is id ``5 + b``."""

    OFFSET = len(RESERVED)

    def __init__(self) -> None:
        self.name = "bytes"
        self.vocab_size = self.OFFSET + 256

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16) + self.OFFSET

    def decode(self, ids: Iterable[int]) -> str:
        data = bytes(int(i) - self.OFFSET for i in ids if int(i) >= self.OFFSET)
        return data.decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        out = np.ones(self.vocab_size, dtype=np.int64)
        out[: self.OFFSET] = 0
        return out

    def to_json(self) -> str:
        return json.dumps({FORMAT_KEY: 1, "kind": "bytes"})


class CharTokenizer(Tokenizer):
    """The train split's characters from id 6; id 5 is ``<unk>``."""

    OFFSET = len(RESERVED) + 1
    UNK_ID = len(RESERVED)

    def __init__(self, chars: str) -> None:
        self.chars = "".join(sorted(set(chars)))
        self.name = "chars"
        self.vocab_size = self.OFFSET + len(self.chars)
        self._points = np.array([ord(c) for c in self.chars], dtype=np.uint32)

    @classmethod
    def learn(cls, texts: Iterable[str]) -> CharTokenizer:
        seen: set[str] = set()
        for text in texts:
            seen.update(text)
        if not seen:
            raise ConfigError("the chars tokenizer found no character in the train split: the "
                              "corpus is empty or every document went to val/test.")
        return cls("".join(seen))

    def encode_array(self, text: str) -> np.ndarray:
        points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        if not len(self._points):
            return np.full(len(points), self.UNK_ID, dtype=np.int64)
        at = np.searchsorted(self._points, points).clip(max=len(self._points) - 1)
        known = self._points[at] == points
        return np.where(known, at + self.OFFSET, self.UNK_ID).astype(np.int64)

    def unknown_pieces(self, text: str, ids: Sequence[int]) -> list[str]:
        if self.UNK_ID not in ids:
            return []
        known = set(self.chars)
        return [c for c in text if c not in known]

    def decode(self, ids: Iterable[int]) -> str:
        out = []
        for i in map(int, ids):
            if i >= self.OFFSET:
                out.append(self.chars[i - self.OFFSET])
            elif i == self.UNK_ID:
                out.append("\ufffd")
        return "".join(out)

    def token_bytes(self) -> np.ndarray:
        out = np.zeros(self.vocab_size, dtype=np.int64)
        out[self.UNK_ID] = 1  # an unknown character: counted as one byte (at least that many)
        out[self.OFFSET:] = [len(c.encode("utf-8")) for c in self.chars]
        return out

    def to_json(self) -> str:
        return json.dumps({FORMAT_KEY: 1, "kind": "chars", "chars": self.chars}, ensure_ascii=False)


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's map of bytes to printable characters, inverted: character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` tokenizer; ids shifted by ``offset`` (0 or 5)."""

    def __init__(self, tok: Any, name: str) -> None:
        self.tok = tok
        self.name = name
        head = [tok.id_to_token(i) for i in range(len(RESERVED))]
        self.offset = 0 if tuple(head) == RESERVED else len(RESERVED)
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True) + self.offset

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text, add_special_tokens=False).ids, dtype=np.int64) + self.offset

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        batch = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)  # no offsets: faster
        encoded = batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) + self.offset for e in encoded]

    def decode(self, ids: Iterable[int]) -> str:
        inner = [int(i) - self.offset for i in ids if int(i) >= len(RESERVED)]
        return str(self.tok.decode(inner, skip_special_tokens=False))

    def unknown_pieces(self, text: str, ids: Sequence[int]) -> list[str]:
        unk = self.unk_id
        if unk is None or unk not in ids:
            return []
        encoded = self.tok.encode(text, add_special_tokens=False)
        return [text[a:b] for i, (a, b) in zip(encoded.ids, encoded.offsets, strict=True)
                if i + self.offset == unk]

    @cached_property
    def unk_id(self) -> int | None:
        """The id of the model's unknown token (WordPiece, a BPE with ``unk_token``), or None."""
        model = json.loads(self.tok.to_str()).get("model") or {}
        name = model.get("unk_token") if isinstance(model, dict) else None
        found = self.tok.token_to_id(name) if isinstance(name, str) else None
        return None if found is None else int(found) + self.offset

    def byte_level(self) -> bool:
        decoder = json.loads(self.tok.to_str()).get("decoder") or {}
        return decoder.get("type") == "ByteLevel"

    def token_bytes(self) -> np.ndarray:
        out = np.zeros(self.vocab_size, dtype=np.int64)
        special = {t.content for t in self.tok.get_added_tokens_decoder().values() if t.special}
        alphabet = _byte_level_alphabet() if self.byte_level() else None
        for i in range(self.vocab_size - self.offset):
            token = self.tok.id_to_token(i)
            if token is None or token in special or (self.offset == 0 and i < len(RESERVED)):
                continue
            if alphabet is not None and all(c in alphabet for c in token):
                out[i + self.offset] = len(token)
            else:
                out[i + self.offset] = len(self.tok.decode([i]).encode("utf-8"))
        return out

    def to_json(self) -> str:
        return str(self.tok.to_str())


def train_bpe(vocab_size: int, texts: Iterable[str]) -> HFTokenizer:
    """A byte-level BPE of ``vocab_size`` ids (specials included) trained on ``texts``."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(RESERVED),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    # named by the ids it learned: a small corpus supports fewer merges than asked for
    return HFTokenizer(tok, f"bpe:{tok.get_vocab_size(with_added_tokens=True)}")


def parse_spec(spec: str) -> tuple[str, int | None]:
    """``(kind, vocab)`` of a tokenizer spec: bytes, chars, bpe (with its vocab) or file."""
    if spec in ("bytes", "chars"):
        return spec, None
    if spec.startswith("bpe:"):
        try:
            vocab = int(spec[4:])
        except ValueError:
            vocab = -1
        if not MIN_BPE_VOCAB <= vocab <= MAX_BPE_VOCAB:
            raise ConfigError(f"tokenizer {spec[:40]!r}: bpe:VOCAB needs an integer VOCAB from "
                              f"{MIN_BPE_VOCAB} (256 byte symbols, specials, merges) to "
                              f"{MAX_BPE_VOCAB:,} (2^20), e.g. bpe:8192.")
        return "bpe", vocab
    if Path(spec).expanduser().is_file():
        return "file", None
    raise ConfigError(f"tokenizer {spec!r} is neither bytes, chars, bpe:VOCAB (e.g. bpe:8192) nor "
                      f"an existing tokenizer.json file. Pick one of those.")


def needs_training(spec: str) -> bool:
    """Whether ``spec`` learns from the train split (chars, bpe)."""
    return parse_spec(spec)[0] in ("chars", "bpe")


def build_tokenizer(spec: str, train_texts: Iterable[str] | None) -> Tokenizer:
    """The tokenizer ``spec`` names, trained on ``train_texts`` where it learns (chars, bpe)."""
    kind, vocab = parse_spec(spec)
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "file":
        return load_tokenizer(spec)
    if train_texts is None:
        raise ConfigError(f"tokenizer {spec!r} learns from the train split, but no text was given.")
    if kind == "chars":
        return CharTokenizer.learn(train_texts)
    assert vocab is not None
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return train_bpe(vocab, train_texts)


def tokenizer_from_json(text: str, name: str = "") -> Tokenizer:
    """A tokenizer from the text of its file (see :meth:`Tokenizer.save`)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"tokenizer {name or 'file'} is not JSON ({exc}).") from None
    if isinstance(data, dict) and FORMAT_KEY in data:
        kind = data.get("kind")
        if kind == "bytes":
            return ByteTokenizer()
        if kind == "chars" and isinstance(data.get("chars"), str):
            return CharTokenizer(data["chars"])
        raise ConfigError(f"tokenizer {name or 'file'} is a harness tokenizer of unknown kind {kind!r}.")
    from tokenizers import Tokenizer as HF

    try:
        tok = HF.from_str(text)
    except Exception as exc:  # tokenizers raises a plain Exception on a bad file
        raise ConfigError(f"tokenizer {name or 'file'} does not load as a Hugging Face "
                          f"tokenizer.json ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}). "
                          f"Give a tokenizer.json saved by tokenizers or transformers.") from None
    base = data.get("model", {}) if isinstance(data, dict) else {}
    is_bpe = isinstance(base, dict) and base.get("type") == "BPE"
    label = f"bpe:{tok.get_vocab_size(with_added_tokens=True)}" if is_bpe and _is_ours(tok) else f"file:{name}"
    return HFTokenizer(tok, label)


def _is_ours(tok: Any) -> bool:
    return tuple(tok.id_to_token(i) for i in range(len(RESERVED))) == RESERVED


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer saved at ``path`` (a ConfigError if it does not load)."""
    from harness.runtime.files import read_text

    p = Path(path).expanduser()
    text = read_text(p, "tokenizer file")
    return tokenizer_from_json(text, p.name)
