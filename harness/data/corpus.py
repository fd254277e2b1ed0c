"""Prepared corpora: the folder ``harness data prepare`` writes, read by memory map.

A prepared folder holds, per split (``train``, ``val``, ``test``), token shards
(``<split>-00000.bin``, ...: flat arrays of the manifest's ``dtype``, uint16 when the
vocabulary fits, else uint32) whose concatenation is the split's token stream, and
``<split>.docs.bin`` (uint64: where each document starts in that stream); then
``tokenizer.json`` and ``manifest.json``, which is written last: a folder without it is not
prepared. Documents are packed one after another, each followed by the end-of-document token
(id 4), so a window may span documents and a document shorter than a window is not an error.

:func:`open_corpus` validates the manifest (its format version; every file it names is a
plain name inside the folder, of the size its counts imply) and fails with a
:class:`~harness.errors.ConfigError` that prints the prepare command when the folder is not
prepared. Nothing is unpickled: JSON and raw arrays only.

**Windows across ranks.** :func:`window_starts` draws a training step's windows: every rank
seeds the same generator with ``(seed, step)``, draws ``world * batch_size`` distinct start
offsets (uniform over the split's stream, repeats redrawn), and takes every ``world``-th
one from its ``rank``. The ranks of one step thus read
disjoint windows, need no communication, and a step's windows do not depend on how many
steps came before (a resumed run draws the same ones). The same holds across machines:
``rank`` and ``world`` are the global ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import ConfigError
from harness.runtime.files import read_text

FORMAT = "harness-corpus"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
SPLITS = ("train", "val", "test")
#: What a file named in a manifest may be called: a plain name, no folder, not hidden.
SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
#: Token ids checked against the vocabulary at each end of a shard when a split is opened.
CHECKED_IDS = 1 << 20


def prepare_hint(path: str | Path) -> str:
    return (f"harness data prepare YOUR_FILES... --tokenizer bytes --out {path}  (files, folders "
            f"or globs of .txt/.jsonl/.json/.csv/.parquet or a datasets.save_to_disk folder; "
            f"see docs/data.md)")


def safe_file(root: Path, name: Any) -> Path:
    """``root / name`` for a name read from a manifest, refusing any that could leave ``root``."""
    if not isinstance(name, str) or not SAFE_NAME.match(name) or ".." in name:
        raise ConfigError(f"{root / MANIFEST} names the file {name!r}, which is not a plain file "
                          f"name inside the folder; the manifest is damaged or was tampered "
                          f"with. Prepare the corpus again.")
    path = root / name
    if path.resolve().parent != root.resolve():
        raise ConfigError(f"{root / MANIFEST} names {name!r}, which resolves outside {root}.")
    return path


@dataclass
class Split:
    """One split's token stream (its shards, by memory map) and its counts."""

    name: str
    shards: list[np.ndarray]
    documents: int
    tokens: int
    bytes: int  # UTF-8 bytes of the split's documents
    doc_starts: np.ndarray  # uint64, where each document starts in the stream

    @cached_property
    def shard_starts(self) -> np.ndarray:
        return np.cumsum([0] + [len(s) for s in self.shards])

    def read(self, start: int, count: int) -> np.ndarray:
        """``count`` tokens from ``start`` of the split's stream (int64; across shards)."""
        if start < 0 or start + count > self.tokens:
            raise IndexError(f"{self.name}: tokens [{start}, {start + count}) outside [0, {self.tokens})")
        out = np.empty(count, dtype=np.int64)
        at, done = start, 0
        i = int(np.searchsorted(self.shard_starts, start, side="right")) - 1
        while done < count:
            shard = self.shards[i]
            offset = at - int(self.shard_starts[i])
            take = min(count - done, len(shard) - offset)
            out[done: done + take] = shard[offset: offset + take]
            done, at, i = done + take, at + take, i + 1
        return out


class PreparedCorpus:
    """A prepared folder, validated: its manifest, tokenizer and splits (by memory map)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()
        self.manifest = read_manifest(self.root)
        dtype = self.manifest.get("dtype")
        if dtype not in DTYPES:
            raise self.damaged(f"dtype {str(dtype)[:40]!r} is not one of {sorted(DTYPES)}")
        self.dtype = DTYPES[dtype]
        tok = self.manifest.get("tokenizer")
        if not isinstance(tok, dict):
            raise self.damaged("it has no 'tokenizer' object")
        most = 1 << (8 * np.dtype(self.dtype).itemsize)  # ids an unsigned token of this dtype holds
        self.vocab_size = self.number(tok.get("vocab_size"), "tokenizer.vocab_size", 1, most)
        self.eod_id = self.number(tok.get("eod_id", 4), "tokenizer.eod_id", 0, self.vocab_size - 1)
        self._splits: dict[str, Split] = {}

    def damaged(self, what: str) -> ConfigError:
        """The error of a damaged manifest: the file, what is wrong, the command that fixes it."""
        return ConfigError(f"{self.root / MANIFEST}: {what}; the folder is damaged. {again(self.root, self.manifest)}")

    def _check_ids(self, shard: np.ndarray, path: Path) -> None:
        """Token ids below the manifest's vocabulary size, checked on each shard's first and
        last :data:`CHECKED_IDS` (an id past it would index past the model's embedding)."""
        for part in (shard[:CHECKED_IDS], shard[-CHECKED_IDS:]):
            top = int(part.max()) if len(part) else 0
            if top >= self.vocab_size:
                raise self.damaged(f"its shard {path.name} holds token id {top:,}, but "
                                   f"tokenizer.vocab_size is {self.vocab_size:,}")

    def number(self, value: Any, field: str, low: int, high: int) -> int:
        """A whole number of the manifest in ``[low, high]`` (else :meth:`damaged` naming it)."""
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.damaged(f"{field} is {str(value)[:40]!r}, not a whole number from {low:,} to {high:,}")
        return value

    @cached_property
    def tokenizer(self) -> Any:
        from harness.data.tokenizers import load_tokenizer

        return load_tokenizer(safe_file(self.root, self.manifest["tokenizer"].get("file", TOKENIZER_FILE)))

    def split(self, name: str) -> Split:
        if name not in self._splits:
            self._splits[name] = self._open_split(name)
        return self._splits[name]

    def _open_split(self, name: str) -> Split:
        splits = self.manifest.get("splits")
        info = splits.get(name) if isinstance(splits, dict) else None
        if not isinstance(info, dict):
            raise self.damaged(f"it has no split {name!r}")
        itemsize = np.dtype(self.dtype).itemsize
        shards: list[np.ndarray] = []
        entries = info.get("shards", [])
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise self.damaged(f"splits.{name}.shards is not a list of shards")
        for i, entry in enumerate(entries):
            path = safe_file(self.root, entry.get("file"))
            count = self.number(entry.get("tokens"), f"splits.{name}.shards[{i}].tokens", 0, 2**62)
            if not path.is_file():
                raise self.damaged(f"its shard {path.name} is missing (or not a file)")
            size = path.stat().st_size
            if size != count * itemsize:
                raise self.damaged(f"its shard {path.name} holds {size:,} bytes, but the manifest says "
                                   f"{count:,} tokens of {itemsize} bytes (truncated or replaced)")
            if count:
                shard = np.memmap(path, dtype=self.dtype, mode="r", shape=(count,))
                self._check_ids(shard, path)
                shards.append(shard)
        tokens = sum(len(s) for s in shards)
        if tokens != self.number(info.get("tokens"), f"splits.{name}.tokens", 0, 2**62):
            raise self.damaged(f"split {name} counts {info.get('tokens')} tokens but its shards hold {tokens}")
        docs_path = safe_file(self.root, info.get("offsets"))
        documents = self.number(info.get("documents", 0), f"splits.{name}.documents", 0, 2**62)
        if not docs_path.is_file() or docs_path.stat().st_size != 8 * documents:
            raise self.damaged(f"{docs_path.name} does not hold the {documents:,} document offsets "
                               f"the manifest counts")
        starts = np.memmap(docs_path, dtype=np.uint64, mode="r", shape=(documents,)) if documents \
            else np.zeros(0, dtype=np.uint64)
        return Split(name, shards, documents, tokens, int(info.get("bytes", 0)), starts)

    def require(self, name: str, length: int, what: str = "a window") -> Split:
        """The split, checked to hold ``length`` tokens (else a ConfigError)."""
        split = self.split(name)
        if split.tokens < length:
            raise ConfigError(
                f"{what} of {length} tokens is longer than the {name} split of {self.root} "
                f"({split.tokens} tokens, {split.documents} documents). Lower the task's length "
                f"or eval_tokens, give the split a larger fraction (--split-fractions), or "
                f"prepare more text.")
        return split


def read_manifest(root: Path) -> dict[str, Any]:
    """The validated manifest of a prepared folder (a ConfigError if it is not one)."""
    path = root / MANIFEST
    if not path.is_file():
        what = "does not exist" if not root.exists() else "is not a prepared corpus (no manifest.json)"
        raise ConfigError(f"{root} {what}. Prepare it first: {prepare_hint(root)}")
    try:
        manifest = json.loads(read_text(path, "the corpus manifest"))
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{path} is not JSON ({exc}); prepare the corpus again: {prepare_hint(root)}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a harness corpus manifest. Prepare it: {prepare_hint(root)}")
    version = manifest.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ConfigError(f"{path}: format_version is {str(version)[:40]!r}, not a version number; the "
                          f"manifest is damaged. {again(root, manifest)}")
    if version != FORMAT_VERSION:
        raise ConfigError(
            f"{root} was prepared in corpus format version {version}, and this harness reads "
            f"version {FORMAT_VERSION}. {again(root, manifest)}")
    return manifest


def again(root: Path, manifest: dict[str, Any]) -> str:
    """How to prepare a folder again: its own recorded command (prepare notices a damaged or
    older folder and writes it anew), else the general form."""
    command = manifest.get("command") if isinstance(manifest.get("command"), str) else None
    return (f"Prepare it again with the command that made it: {command[:400]}" if command
            else f"Prepare it again: {prepare_hint(root)}")


def open_corpus(path: str | Path) -> PreparedCorpus:
    """Open and validate a prepared folder (see the module)."""
    return PreparedCorpus(path)


def window_starts(num_tokens: int, length: int, batch_size: int, *, seed: int | Sequence[int], step: int,
                  rank: int = 0, world: int = 1) -> np.ndarray:
    """This rank's start offsets of the ``batch_size`` windows of ``length + 1`` tokens it
    reads at ``step`` (see the module: the ranks of one step read disjoint windows)."""
    positions = num_tokens - length  # starts s with s + length + 1 <= num_tokens
    need = world * batch_size
    if positions < need:
        raise ConfigError(
            f"the train split has {num_tokens} tokens: too few for {need} distinct windows of "
            f"{length + 1} tokens per step ({world} process(es) x batch {batch_size}). Lower the "
            f"length or batch size, or prepare more text.")
    rng = np.random.default_rng([*([seed] if isinstance(seed, int) else seed), step])
    starts = rng.integers(0, positions, size=need)
    while True:  # redraw repeats: every window of the step distinct
        unique, first = np.unique(starts, return_index=True)
        if len(unique) == need:
            break
        repeat = np.setdiff1d(np.arange(need), first)
        starts[repeat] = rng.integers(0, positions, size=len(repeat))
    return starts[rank::world]
