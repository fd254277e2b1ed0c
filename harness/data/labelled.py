"""Labelled files: records with a text and a label (classification) or a source and a target
(sequence-to-sequence pairs), read with :mod:`harness.data.readers` and tokenized with
:mod:`harness.data.tokenizers` when the task is built.

**Splits.** ``train``, ``val`` and ``test`` name files (or folders, or globs) of records. A
split whose file is not given is cut from the training records by a hash of the record's
key (its text, or its source): ``sha1(key)`` as a fraction in [0, 1) below
``val_fraction`` goes to val, below ``val_fraction + test_fraction`` to test. The hash depends
on the key alone, so the split is the same on every machine and for every seed, and
duplicate texts always land in the same split (never one copy in train and one in val).

**Caps.** ``num_train`` / ``num_val`` cap a split's records; where a split has more, it keeps
those with the smallest hashes (a fixed sample, not the file's first lines: files are often
sorted by label), in file order.

**Memory.** Records are read as a stream; a split's token ids are held as flat arrays (4
bytes a token, plus 8 bytes a record: :class:`TokenColumn`) and examples are built on
access, truncated to the length asked for. So a labelled set costs about 4 bytes per token
kept (1 M records of 128 tokens: about 0.5 GB); the training run then collates the train
split into padded int64 tensors (8 bytes a position). Texts longer than the longest length
evaluated are truncated when read (and counted), so nothing past it is stored.

**Tokens.** The tokenizer's ids are used as they are: every tokenizer of
:mod:`harness.data.tokenizers` keeps the harness's specials at ids 0-3 (PAD, BOS, EOS, SEP)
and never emits them for text.

**Reuse.** A study's worker builds the task again for every trial: the last set read is kept
(:func:`cached_read`, one per process) and reused while the config and every file's size and
modification time are unchanged.

**Bytes that are not UTF-8** are replaced by U+FFFD when read (the readers' policy) and
counted: a warning names each file with replaced bytes.
"""

from __future__ import annotations

import hashlib
import warnings
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, overload

import numpy as np
from annotated_types import Ge, Lt

from harness.data.tasks import TaskConfig
from harness.data.vocab import Vocab
from harness.errors import ConfigError, HarnessWarning
from harness.params import IntRange

SPLITS = ("train", "val", "test")


@dataclass
class LabelledConfig(TaskConfig):
    """What every task on labelled files takes (the fields of the records are the task's)."""

    length: Annotated[int, Ge(1), IntRange(16, 1024, log=True)] = 128  # tokens read per text; longer texts are truncated (counted)
    num_train: Annotated[int, Ge(1)] = 1_000_000  # at most this many training records (see the caps)
    num_val: Annotated[int, Ge(1)] = 10_000  # at most this many val (and test) records
    train: str = field(default="", metadata={"doc": "the training records: a .jsonl/.json/.csv/.parquet file, a folder or a glob"})
    val: str = field(default="", metadata={"doc": "validation records; empty: cut val_fraction of train by hash"})
    test: str = field(default="", metadata={"doc": "test records; empty: cut test_fraction of train by hash (0: no test split)"})
    val_fraction: Annotated[float, Ge(0.0), Lt(1.0)] = 0.1  # share of train cut for val when val is empty
    test_fraction: Annotated[float, Ge(0.0), Lt(1.0)] = 0.0  # share of train cut for test when test is empty
    tokenizer: str = field(default="bytes", metadata={"doc": "bytes, chars, bpe:VOCAB or the path of a tokenizer.json"})

    def __post_init__(self) -> None:
        super().__post_init__()
        cut = (0.0 if self.val else self.val_fraction) + (0.0 if self.test else self.test_fraction)
        if cut >= 1.0:
            raise ValueError(
                f"val_fraction + test_fraction = {cut:g} leaves no training records; lower them "
                f"or give val / test files."
            )
        if not self.val and self.val_fraction == 0.0:
            raise ValueError("val is empty and val_fraction is 0: give a val file or a val_fraction > 0.")

    def require_train(self) -> None:
        """The check a task makes before reading (the defaults name no file, so a config
        without one is valid until the task is built)."""
        if not self.train:
            raise ConfigError(
                "task.params.train is empty: set it to the file (or folder, or glob) of your "
                "training records, e.g. train: data/train.jsonl (see docs/data.md, 'Labelled data')."
            )

    @property
    def longest(self) -> int:
        """The longest length evaluated: what is kept of a text when it is read."""
        return max((self.length, *self.eval_lengths))


def key_fraction(key: str) -> float:
    """A fraction in [0, 1) from the key's sha1: the same in every process and on every
    machine (unlike Python's salted ``hash``)."""
    return int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:12], 16) / 16**12


def split_of(key: str, config: LabelledConfig) -> str:
    """The split a record of the training source belongs to by its key's hash (a split given
    by its own file takes no records from train)."""
    x = key_fraction(key)
    val = 0.0 if config.val else config.val_fraction
    test = 0.0 if config.test else config.test_fraction
    return "val" if x < val else "test" if x < val + test else "train"


class TokenColumn:
    """A column of token-id lists stored flat: ``array('I')`` ids and ``array('q')`` offsets
    (4 bytes a token, 8 a row). ``column[i]`` is row i as a list of ints."""

    def __init__(self) -> None:
        self.ids = array("I")
        self.offsets = array("q", [0])

    def append(self, ids: Iterable[int]) -> None:
        if isinstance(ids, np.ndarray):
            self.ids.frombytes(ids.astype(np.uint32).tobytes())
        else:
            self.ids.extend(ids)
        self.offsets.append(len(self.ids))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def row(self, i: int, limit: int | None = None) -> list[int]:
        start, end = self.offsets[i], self.offsets[i + 1]
        if limit is not None:
            end = min(end, start + limit)
        return self.ids[start:end].tolist()

    def lengths(self) -> list[int]:
        return [self.offsets[i + 1] - self.offsets[i] for i in range(len(self))]

    def take(self, rows: Sequence[int]) -> TokenColumn:
        out = TokenColumn()
        for i in rows:
            out.append(self.ids[self.offsets[i]: self.offsets[i + 1]])
        return out


class LazyExamples(Sequence[dict[str, Any]]):
    """A split's examples at one length, built on access from token columns (see the module);
    equal to another sequence with the same examples."""

    def __init__(self, make: Any, size: int) -> None:
        self._make, self._size = make, size

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self._make(j) for j in range(*i.indices(self._size))]
        if not -self._size <= i < self._size:
            raise IndexError(i)
        return self._make(i % self._size)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self._make(j) for j in range(self._size))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]


#: The last labelled set read in this process: (key, what the task read). A study's worker
#: builds the same task for every trial; the key holds the config and each file's size and
#: modification time, so a changed file (or config) is read again. One entry: memory holds
#: at most the set in use.
_LAST: list[Any] = []


def cached_read(config: LabelledConfig, read: Callable[[], Any]) -> Any:
    """``read()``, or what it returned for the same config and unchanged files earlier in
    this process (the task is read-only once built, so tasks may share it)."""
    from harness.data.readers import resolve_sources

    stamps = []
    for path in (config.train, config.val, config.test):
        if path:
            for f in resolve_sources([path]):
                st = f.stat()
                stamps.append((str(f.resolve()), st.st_size, st.st_mtime_ns))
    key = (type(config).__qualname__, repr(config), tuple(stamps))
    if _LAST and _LAST[0] == key:
        return _LAST[1]
    _LAST.clear()  # the old set is garbage before the new one is read
    value = read()
    _LAST[:] = [key, value]
    return value


def records(path: str, fields: Sequence[str], stats: Any = None) -> Iterator[Any]:
    """The records of ``path`` (files, folders or globs) with ``fields``, as a stream of
    :class:`harness.data.readers.Record` (errors: :class:`ConfigError` naming file and line);
    ``stats``: a :class:`harness.data.readers.ReadStats` that counts replaced bytes."""
    from harness.data.readers import iter_records

    return iter_records([path], list(fields), stats)


def stream_splits(config: LabelledConfig, fields: Sequence[str], key_field: str) -> Iterator[tuple[str, Any]]:
    """``(split, record)`` for every record: the training source's records, each in the split
    its key's hash gives, then the records of the val and test files (where given). A record
    whose key field is empty is an error naming its file and line."""
    from harness.data.readers import ReadStats

    sources = [("train", config.train)] + [(s, getattr(config, s)) for s in ("val", "test") if getattr(config, s)]
    stats = ReadStats()
    for given, path in sources:
        for record in records(path, fields, stats):
            key = record.values[key_field]
            if not key.strip():
                raise ConfigError(
                    f"{where(record)}: the field '{key_field}' is empty (or only whitespace); "
                    f"every record needs a text there. Remove the record or fill the field."
                )
            yield (split_of(key, config) if given == "train" else given), record
    bad = {f: n for f, n in stats.replaced.items() if n}
    if bad:
        warnings.warn(
            "bytes that are not UTF-8 were replaced by U+FFFD (the readers' policy): "
            + ", ".join(f"{n} in {f}" for f, n in bad.items()), HarnessWarning, stacklevel=2)


def encoded(tokenizer: Any, stream: Iterable[tuple[str, Any]], fields: Sequence[str],
            chunk: int = 1024) -> Iterator[tuple[str, Any, list[Any]]]:
    """``(split, record, ids)`` for each record of ``stream``: ``ids`` holds the token ids
    (integer arrays) of each of ``fields``, encoded ``chunk`` records at a time
    (``Tokenizer.encode_batch``: one call into a Hugging Face tokenizer per chunk)."""
    batch: list[tuple[str, Any]] = []

    def flush() -> Iterator[tuple[str, Any, list[Any]]]:
        columns = [tokenizer.encode_batch([r.values[f] for _, r in batch]) for f in fields]
        for i, (split, record) in enumerate(batch):
            yield split, record, [column[i] for column in columns]
        batch.clear()

    for item in stream:
        batch.append(item)
        if len(batch) == chunk:
            yield from flush()
    if batch:
        yield from flush()


def train_texts(config: LabelledConfig, fields: Sequence[str], key_field: str,
                text_fields: Sequence[str]) -> Iterator[str]:
    """The texts a tokenizer is trained on: ``text_fields`` of the train split's records
    (read lazily: a tokenizer that needs no training never reads them)."""
    for record in records(config.train, fields):
        if split_of(record.values[key_field], config) == "train":
            for field in text_fields:
                yield record.values[field]


def where(record: Any) -> str:
    return f"{record.source}, line {record.line}"


def tokenizer_for(config: LabelledConfig, train_texts: Iterable[str]) -> Any:
    """The task's tokenizer: loaded from a path, else built from the training texts."""
    from harness.data.tokenizers import build_tokenizer

    try:
        return build_tokenizer(config.tokenizer, train_texts)
    except ConfigError as exc:
        raise ConfigError(f"task.params.tokenizer: {exc}") from None


def vocab_of(tokenizer: Any) -> Vocab:
    """A :class:`Vocab` as large as the tokenizer's vocabulary (its ids 0-3 are the specials)."""
    return Vocab(tuple(f"<{i}>" for i in range(4, int(tokenizer.vocab_size))))


def keep_smallest_hashes(hashes: Sequence[float], cap: int) -> list[int]:
    """Indices of the ``cap`` records with the smallest hashes (:func:`key_fraction` of
    their keys), in their original order."""
    if len(hashes) <= cap:
        return list(range(len(hashes)))
    return sorted(sorted(range(len(hashes)), key=lambda i: (hashes[i], i))[:cap])


def note_truncated(what: str, counts: dict[str, int], totals: dict[str, int], limit: str) -> None:
    """Say how many texts were truncated (a warning, never silent)."""
    parts = [f"{counts[s]} of {totals[s]} {s}" for s in SPLITS if counts.get(s)]
    if parts:
        warnings.warn(f"{what}: {', '.join(parts)} records were longer than {limit} tokens and "
                      f"were truncated.", HarnessWarning, stacklevel=3)


def empty_split_error(split: str, config: LabelledConfig) -> ConfigError:
    given = getattr(config, split)
    if given:
        return ConfigError(f"task.params.{split}: {given} has no records.")
    fraction = getattr(config, f"{split}_fraction")
    return ConfigError(
        f"the {split} split is empty: {split}_fraction={fraction:g} of the training records "
        f"({config.train}) by hash gave none. Give a {split} file (task.params.{split}) or raise "
        f"{split}_fraction."
    )
