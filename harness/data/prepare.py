"""``harness data prepare``: raw files to a prepared corpus (see :mod:`harness.data.corpus`).

:func:`prepare` reads the sources' records (:mod:`harness.data.readers`), assigns each
document to a split, learns the tokenizer on the train split where it learns (``chars``,
``bpe:VOCAB``; at most ``tokenizer_train_bytes`` of train text), tokenises in parallel and
writes the folder.

* **Splits by document**, from a hash of the document's UTF-8 bytes (BLAKE2b, 8 bytes, as a
  fraction of 2^64, against the cumulative fractions): the same on every machine and every
  re-run, never inside a document, and identical documents always land in the same split.
* **Packing**: each split's documents are concatenated in source order, each followed by the
  end-of-document token (id 4). An empty document is skipped (and counted).
* **Streaming, bounded memory**: records are cut into chunks of about ``chunk_bytes`` of
  text and tokenised by ``workers`` processes (spawned; each gets the tokenizer's JSON),
  with at most two chunks per worker in flight; results are appended to the shard files in
  order. Memory depends on the chunk size and the worker count, not on the corpus. By
  default ``bpe`` and tokenizer files use every usable core, ``bytes`` and ``chars`` one
  process (they encode faster than a chunk is shipped to a worker and back).
* **Atomic**: everything is written into a temporary folder of its own beside the output
  (:mod:`harness.runtime.paths`: ``.<name>.harness-partial-<pid>-<random>``, marked as the
  harness's), ``manifest.json`` last, then renamed to the output. An interrupted run (Ctrl-C,
  SIGKILL) leaves at most that folder, which no task accepts (its name differs and it has no
  manifest) and which the next run removes once its process is gone. A folder the harness did
  not make (``.out.partial-notes``) is never touched.
* **Reuse**: a re-run whose sources (paths, sizes, sha256) and options match the existing
  manifest returns it without tokenising, if the folder is whole (every shard, offsets file
  and the tokenizer as the manifest says); a damaged folder is prepared again.
* **Refused**: split fractions that are not finite, or leave the train split without a
  document; a corpus with no text (every document empty); ``--workers`` beyond
  :data:`MAX_WORKERS_PER_CORE` per core; an ``--out`` that cannot be written.
* **Progress** on stderr: bytes of text read, MB/s and ETA (against the sources' total size
  on disk; without an ETA when a source is compressed).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from harness.data.corpus import FORMAT, FORMAT_VERSION, MANIFEST, SPLITS, TOKENIZER_FILE
from harness.data.readers import COMPRESSED, ReadStats, file_digest, iter_records, resolve_sources
from harness.data.tokenizers import Tokenizer, build_tokenizer, parse_spec, tokenizer_from_json
from harness.errors import ConfigError, warning
from harness.runtime import paths

#: ``--workers`` at most this many per usable core (each is a process with the tokenizer).
MAX_WORKERS_PER_CORE = 4
PARTIAL = "partial"

DEFAULT_FRACTIONS = (0.9, 0.05, 0.05)
#: Tokens per shard file (1 GiB at uint32, 512 MiB at uint16).
SHARD_TOKENS = 1 << 28
#: Train text the chars and bpe tokenizers learn from, at most.
TOKENIZER_TRAIN_BYTES = 100_000_000
#: Text per chunk sent to a worker.
CHUNK_BYTES = 1 << 22
#: Sources smaller than this many chunks are tokenised in one process (starting processes
#: would cost more than they save).
FEW_CHUNKS = 4


@dataclass
class Prepared:
    """What :func:`prepare` made (or found): the folder, its manifest, whether reused."""

    path: Path
    manifest: dict[str, Any]
    reused: bool
    seconds: float = 0.0

    def summary(self) -> str:
        m = self.manifest
        lines = [f"{'reused' if self.reused else 'prepared'} {self.path} "
                 f"(tokenizer {m['tokenizer']['name']}, {m['tokenizer']['vocab_size']} ids, {m['dtype']})"]
        for name in SPLITS:
            s = m["splits"][name]
            lines.append(f"  {name:5s} {s['documents']:>10,} documents {s['tokens']:>14,} tokens "
                         f"{s['bytes']:>14,} bytes")
        replaced = sum(src["replaced_bytes"] for src in m["sources"])
        if replaced:
            files = [f"{src['path']} ({src['replaced_bytes']})" for src in m["sources"] if src["replaced_bytes"]]
            lines.append(f"  {replaced} bytes that are not UTF-8 were replaced by U+FFFD: {', '.join(files[:5])}"
                         + (" ..." if len(files) > 5 else ""))
        if m.get("empty_documents"):
            lines.append(f"  {m['empty_documents']} empty documents skipped")
        if not self.reused and self.seconds:
            mb = sum(m["splits"][name]["bytes"] for name in SPLITS) / 1e6
            lines.append(f"  {mb:.1f} MB of text in {self.seconds:.1f} s ({mb / self.seconds:.1f} MB/s)")
        return "\n".join(lines)


def check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    values = tuple(float(f) for f in fractions)
    if len(values) != 3 or not all(math.isfinite(f) and f >= 0 for f in values) \
            or abs(sum(values) - 1.0) > 1e-6 or not values[0] > 0 or not values[1] > 0:
        raise ConfigError(f"split fractions {list(fractions)} must be three numbers train,val,test "
                          f"that sum to 1, train and val above 0, e.g. 0.9,0.05,0.05.")
    return values  # type: ignore[return-value]


def split_of(text: str, cumulative: Sequence[float]) -> int:
    """The split index of a document: its hash as a fraction against the cumulative fractions."""
    h = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big") / 2.0**64
    for i, bound in enumerate(cumulative):
        if h < bound:
            return i
    return len(cumulative) - 1


def _cumulative(fractions: Sequence[float]) -> list[float]:
    return [float(x) for x in np.cumsum(fractions)]


# --- workers -------------------------------------------------------------------------------

_worker_tokenizer: Tokenizer | None = None


def _init_worker(tokenizer_json: str, parent: int) -> None:
    global _worker_tokenizer
    import signal

    from harness.runtime.children import die_with_parent

    die_with_parent(signal.SIGKILL)  # a killed prepare leaves no orphan printing BrokenPipeError
    if os.getppid() != parent:  # it died while this worker started, before the line above
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker_tokenizer = tokenizer_from_json(tokenizer_json)


@dataclass
class Chunk:
    """One chunk's output per split: packed tokens, document lengths, bytes, empties."""

    tokens: list[np.ndarray]
    lengths: list[np.ndarray]
    nbytes: list[int]
    empty: int
    read: int  # UTF-8 bytes of the chunk's text


def tokenize_chunk(texts: Sequence[str], cumulative: Sequence[float], dtype: str,
                   tokenizer: Tokenizer | None = None) -> Chunk:
    """Tokenise and pack one chunk of documents (in a worker, or in-process)."""
    tok = tokenizer or _worker_tokenizer
    assert tok is not None
    per: list[list[str]] = [[] for _ in SPLITS]
    nbytes = [0] * len(SPLITS)
    empty = read = 0
    for text in texts:
        size = len(text.encode("utf-8"))
        read += size
        if not text:
            empty += 1
            continue
        i = split_of(text, cumulative)
        per[i].append(text)
        nbytes[i] += size
    tokens, lengths = [], []
    for docs in per:
        encoded = tok.encode_batch(docs) if docs else []
        lens = np.array([len(e) + 1 for e in encoded], dtype=np.int64)
        packed = np.empty(int(lens.sum()), dtype=dtype)
        at = 0
        for e in encoded:
            packed[at: at + len(e)] = e
            packed[at + len(e)] = tok.eod_id
            at += len(e) + 1
        tokens.append(packed)
        lengths.append(lens)
    return Chunk(tokens, lengths, nbytes, empty, read)


# --- output ------------------------------------------------------------------------------


class SplitWriter:
    """Appends one split's packed tokens to shard files and its document starts."""

    def __init__(self, folder: Path, name: str, dtype: str, shard_tokens: int) -> None:
        self.folder, self.name, self.dtype, self.shard_tokens = folder, name, dtype, shard_tokens
        self.shards: list[dict[str, Any]] = []
        self.tokens = self.documents = self.bytes = 0
        self.offsets_name = f"{name}.docs.bin"
        self._offsets = open(folder / self.offsets_name, "wb")  # noqa: SIM115 - closed in close()
        self._file: Any = None

    def _next_shard(self) -> None:
        if self._file is not None:
            self._file.close()
        name = f"{self.name}-{len(self.shards):05d}.bin"
        self.shards.append({"file": name, "tokens": 0})
        self._file = open(self.folder / name, "wb")  # noqa: SIM115 - closed in close()

    def write(self, tokens: np.ndarray, lengths: np.ndarray, nbytes: int) -> None:
        starts = self.tokens + np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else lengths
        self._offsets.write(np.asarray(starts, dtype=np.uint64).tobytes())
        self.documents += len(lengths)
        self.bytes += nbytes
        at = 0
        while at < len(tokens):
            if self._file is None or self.shards[-1]["tokens"] >= self.shard_tokens:
                self._next_shard()
            room = self.shard_tokens - self.shards[-1]["tokens"]
            part = tokens[at: at + room]
            self._file.write(part.tobytes())
            self.shards[-1]["tokens"] += len(part)
            at += len(part)
        self.tokens += len(tokens)

    def close(self) -> dict[str, Any]:
        if self._file is None:
            self._next_shard()  # an empty split still has one (empty) shard
        for f in (self._file, self._offsets):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        return {"shards": self.shards, "offsets": self.offsets_name, "documents": self.documents,
                "tokens": self.tokens, "bytes": self.bytes}


class Progress:
    """``prepare: 12.0/200.0 MB  40.1 MB/s  ETA 5s`` on stderr, at most once a second."""

    def __init__(self, total: int | None, enabled: bool, what: str = "tokenising") -> None:
        self.total, self.enabled, self.what = total, enabled, what
        self.done = 0
        self.started = self.shown = time.perf_counter()

    def add(self, n: int) -> None:
        self.done += n
        now = time.perf_counter()
        if self.enabled and now - self.shown >= 1.0:
            self.shown = now
            self._print(now)

    def _print(self, now: float, end: str = "") -> None:
        rate = self.done / max(now - self.started, 1e-9)
        if self.total is None:  # compressed sources: their text's size is unknown
            where = f"{self.done / 1e6:,.1f} MB  {rate / 1e6:.1f} MB/s"
        else:
            eta = max(self.total - self.done, 0) / rate if rate > 0 else float("inf")
            where = f"{self.done / 1e6:,.1f}/{self.total / 1e6:,.1f} MB  {rate / 1e6:.1f} MB/s  ETA {eta:.0f}s"
        sys.stderr.write(f"\rprepare: {self.what} {where}   {end}")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            self._print(time.perf_counter(), end="\n")


# --- the command -----------------------------------------------------------------------------


def _chunks(texts: Iterable[str], chunk_bytes: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    size = 0
    for text in texts:
        chunk.append(text)
        size += len(text)
        if size >= chunk_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def remove_stale_partials(out: Path) -> None:
    """Remove the partial folders of ``out`` that runs which died left (SIGKILL, power loss):
    only folders the harness made (:mod:`harness.runtime.paths`)."""
    paths.remove_stale(out, PARTIAL)


def _existing(out: Path) -> dict[str, Any] | None:
    """The manifest of a prepared ``out``; None when ``out`` is absent or an empty folder;
    a ConfigError when it holds something else (it is never overwritten)."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise ConfigError(f"--out {out} is a file; name a folder to create.")
    manifest = out / MANIFEST
    if manifest.is_file():
        try:
            data = json.loads(manifest.read_text(encoding="utf-8"))
            if isinstance(data, dict) and data.get("format") == FORMAT:
                return data
        except (ValueError, UnicodeDecodeError, RecursionError):
            pass
    if _written_by_prepare(out):
        return {}  # a prepared folder whose manifest is damaged: prepared again
    if any(out.iterdir()):
        raise ConfigError(f"--out {out} is a folder that holds files but is not a prepared corpus; "
                          f"it is left alone. Name a new folder (prepare creates it).")
    return None


_OUTPUT_FILE = re.compile(rf"^({'|'.join(SPLITS)})(-\d{{5}}\.bin|\.docs\.bin)$")


def _written_by_prepare(out: Path) -> bool:
    """Whether ``out`` holds a manifest and only files prepare writes (a damaged corpus)."""
    names = {p.name for p in out.iterdir()}
    return MANIFEST in names and all(n in (MANIFEST, TOKENIZER_FILE) or _OUTPUT_FILE.match(n) for n in names)


def _options(tokenizer: str, field: str, fractions: Sequence[float], shard_tokens: int,
             tokenizer_train_bytes: int) -> dict[str, Any]:
    opts: dict[str, Any] = {"tokenizer": tokenizer, "field": field, "split_fractions": list(fractions),
                            "shard_tokens": shard_tokens}
    kind, _ = parse_spec(tokenizer)
    if kind == "file":
        opts["tokenizer"] = str(Path(tokenizer).expanduser().resolve())
        opts["tokenizer_sha256"] = file_digest(tokenizer)
    if kind in ("chars", "bpe"):
        opts["tokenizer_train_bytes"] = tokenizer_train_bytes
    return opts


def _train_texts(sources: Sequence[Path], field: str, cumulative: Sequence[float], limit: int,
                 progress: Progress) -> Iterator[str]:
    taken = 0
    for record in iter_records(sources, [field]):
        text = record.values[field]
        progress.add(len(text))
        if text and split_of(text, cumulative) == 0:
            yield text
            taken += len(text)
            if taken >= limit:
                return


def prepare(sources: Sequence[str | Path], out: str | Path, *, tokenizer: str = "bytes",
            field: str = "text", split_fractions: Sequence[float] = DEFAULT_FRACTIONS,
            workers: int | None = None, progress: bool = True, shard_tokens: int = SHARD_TOKENS,
            tokenizer_train_bytes: int = TOKENIZER_TRAIN_BYTES, chunk_bytes: int = CHUNK_BYTES,
            command: str | None = None, on_chunk: Callable[[int], None] | None = None) -> Prepared:
    """Prepare ``sources`` into the folder ``out`` (see the module); returns what it made,
    or the existing folder when the sources and options are unchanged."""
    started = time.perf_counter()
    fractions = check_fractions(split_fractions)
    cumulative = _cumulative(fractions)
    if shard_tokens < 1:
        raise ConfigError(f"shard_tokens must be at least 1, got {shard_tokens}.")
    out = Path(out).expanduser()
    check_workers(workers)
    files = resolve_sources(sources)
    options = _options(tokenizer, field, fractions, shard_tokens, tokenizer_train_bytes)
    digests = [{"path": str(p.resolve()), "size": p.stat().st_size, "sha256": file_digest(p)} for p in files]
    old = _existing(out)
    if _same(old, options, digests) and whole(out):
        assert old is not None
        return Prepared(out, old, reused=True)
    _make_parent(out)
    remove_stale_partials(out)
    try:
        with paths.temp_folder(out, PARTIAL) as tmp:
            manifest = _write(files, tmp, options, digests, tokenizer, field, cumulative, workers,
                              progress, chunk_bytes, on_chunk)
            manifest["command"] = command or _command(sources, out, tokenizer, field, fractions)
            manifest["created"] = datetime.now(UTC).isoformat(timespec="seconds")
            _write_manifest(tmp, manifest)
            _publish(tmp, out, options, digests)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot be written ({exc.strerror or exc}). Name a folder in "
                          f"a place you can write.") from None
    final = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    _say_smaller_vocabulary(final)
    return Prepared(out, final, reused=False, seconds=time.perf_counter() - started)


def _say_smaller_vocabulary(manifest: dict[str, Any]) -> None:
    """A BPE that learned fewer ids than asked is kept (every pair of tokens in the train text
    is merged: no larger vocabulary exists for it), and said in one ``warning:`` line on every
    path that prepares (the command, ``harness.prepare_corpus``, a task preparing its source)."""
    tok = manifest["tokenizer"]
    kind, asked = parse_spec(tok["spec"]) if str(tok.get("spec", "")).startswith("bpe:") else ("", None)
    if kind == "bpe" and asked is not None and tok["vocab_size"] < asked:
        warning(f"tokenizer {tok['spec']}: the train text supports only {tok['vocab_size']:,} ids (no "
                f"pair of tokens left to merge), so the corpus is prepared with {tok['name']}. Prepare "
                f"more text for a larger vocabulary, or ask for {tok['name']} to say what you get.")


def check_workers(workers: int | None) -> None:
    """``--workers`` from 1 to :data:`MAX_WORKERS_PER_CORE` per usable core."""
    from harness.runtime.threads import usable_cores

    most = MAX_WORKERS_PER_CORE * usable_cores()
    if workers is not None and not 1 <= workers <= most:
        raise ConfigError(f"--workers must be from 1 to {most} ({MAX_WORKERS_PER_CORE} per usable "
                          f"core of this machine), got {workers:,}. Leave it unset to use every core.")


def _make_parent(out: Path) -> None:
    """``out``'s parent folder, made if missing; refused when ``out`` cannot be written there."""
    if out.is_symlink():
        raise ConfigError(f"--out {out} is a symbolic link (to {os.readlink(out)}); name a new folder.")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out}: its folder {out.parent} cannot be made ({exc.strerror or exc}). "
                          f"Name a folder in a place you can write.") from None
    if not out.parent.is_dir() or not os.access(out.parent, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: {out.parent} is not a folder this user can write in. Name "
                          f"a folder in a place you can write.")


def whole(out: Path) -> bool:
    """Whether a prepared folder holds every file its manifest names, at the sizes it says."""
    from harness.data.corpus import open_corpus

    try:
        corpus = open_corpus(out)
        for name in SPLITS:
            corpus.split(name)
        corpus.tokenizer  # noqa: B018 - loads the tokenizer file
    except (ConfigError, OSError, ValueError, KeyError, TypeError):
        return False
    return True


def _command(sources: Sequence[str | Path], out: Path, tokenizer: str, field: str,
             fractions: Sequence[float]) -> str:
    parts = ["harness data prepare", *map(str, sources), "--tokenizer", tokenizer, "--out", str(out)]
    if field != "text":
        parts += ["--field", field]
    if tuple(fractions) != DEFAULT_FRACTIONS:
        parts += ["--split-fractions", ",".join(f"{f:g}" for f in fractions)]
    return " ".join(parts)


def _write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    path = folder / MANIFEST
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _same(manifest: dict[str, Any] | None, options: dict[str, Any], digests: list[dict[str, Any]]) -> bool:
    """Whether a manifest was prepared from these sources with these options."""
    return manifest is not None and manifest.get("format_version") == FORMAT_VERSION and \
        manifest.get("options") == options and \
        [{k: s.get(k) for k in ("path", "size", "sha256")} for s in manifest.get("sources", [])] == digests


def _publish(tmp: Path, out: Path, options: dict[str, Any], digests: list[dict[str, Any]]) -> None:
    """Rename the finished partial folder to ``out`` (replacing an older prepared one). When
    another process published the same corpus meanwhile (two study workers preparing on
    first use), its folder is kept and this one dropped."""
    old = paths.temp_name(out, "old")
    if _same(_existing(out), options, digests) and whole(out):
        shutil.rmtree(tmp)
        return
    if out.exists():
        os.rename(out, old)
    (tmp / paths.MARK).unlink(missing_ok=True)  # published: no longer a temporary folder
    try:
        os.rename(tmp, out)
    except OSError:
        if not _same(_existing(out), options, digests):
            raise
        shutil.rmtree(tmp)  # lost the race to an identical corpus: keep the winner's
    shutil.rmtree(old, ignore_errors=True)


def _write(files: list[Path], tmp: Path, options: dict[str, Any], digests: list[dict[str, Any]],
           spec: str, field: str, cumulative: Sequence[float], workers: int | None, show: bool,
           chunk_bytes: int, on_chunk: Callable[[int], None] | None) -> dict[str, Any]:
    compressed = any(p.suffix.lower() in COMPRESSED for p in files)
    total = None if compressed else sum(d["size"] for d in digests)
    if workers is None and sum(d["size"] for d in digests) < FEW_CHUNKS * chunk_bytes:
        workers = 1  # a few chunks: starting processes would cost more than it saves
    train_texts = None
    learn = Progress(total, show, "learning the tokenizer:")
    if parse_spec(spec)[0] in ("chars", "bpe"):
        train_texts = _train_texts(files, field, cumulative, options["tokenizer_train_bytes"], learn)
    tok = build_tokenizer(spec, train_texts)
    if train_texts is not None:
        learn.finish()
    tok.save(tmp / TOKENIZER_FILE)
    dtype = "uint16" if tok.vocab_size <= 1 << 16 else "uint32"
    writers = [SplitWriter(tmp, name, dtype, options["shard_tokens"]) for name in SPLITS]
    stats = ReadStats()
    texts = (r.values[field] for r in iter_records(files, [field], stats))
    bar = Progress(total, show)
    empty = 0
    for index, chunk in enumerate(_tokenized(_chunks(texts, chunk_bytes), tok, cumulative, dtype, workers)):
        for w, tokens, lengths, nbytes in zip(writers, chunk.tokens, chunk.lengths, chunk.nbytes, strict=True):
            w.write(tokens, lengths, nbytes)
        empty += chunk.empty
        bar.add(chunk.read)
        if on_chunk is not None:
            on_chunk(index)
    bar.finish()
    splits = {w.name: w.close() for w in writers}
    _check_splits(splits, empty, files, [cumulative[0], *np.diff(cumulative)])
    sources = [{**d, "records": stats.records.get(str(p), 0), "replaced_bytes": stats.replaced.get(str(p), 0)}
               for d, p in zip(digests, files, strict=True)]
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "options": options, "sources": sources,
        "tokenizer": {"spec": spec, "name": tok.name, "file": TOKENIZER_FILE, "vocab_size": tok.vocab_size,
                      "eod_id": tok.eod_id, "sha256": file_digest(tmp / TOKENIZER_FILE)},
        "dtype": dtype, "splits": splits, "empty_documents": empty,
        "packing": "documents in source order, each followed by the end-of-document token",
        "utf8_policy": "invalid UTF-8 bytes are replaced by U+FFFD and counted per source",
    }


def _check_splits(splits: dict[str, Any], empty: int, files: list[Path], fractions: Sequence[float]) -> None:
    """A corpus without text, or a split that was given a fraction and got no document (a
    train split cannot be trained on, an empty val or test split cannot be scored), is
    refused, nothing written."""
    if not any(s["tokens"] for s in splits.values()):
        raise ConfigError(
            f"the sources hold no text: {empty:,} documents, every one empty or null "
            f"({', '.join(map(str, files[:3]))}{' ...' if len(files) > 3 else ''}). Check --field "
            f"(the field that holds the text) and the files.")
    docs = sum(s["documents"] for s in splits.values())
    for name, fraction in zip(SPLITS, fractions, strict=True):
        if fraction > 0 and not splits[name]["tokens"]:
            raise ConfigError(
                f"the {name} split got no text: --split-fractions gives it {fraction:.6g} of the "
                f"{docs:,} documents (about {fraction * docs:.3g}), and documents go to a split by a "
                f"hash of their text. Give the {name} split a larger fraction (e.g. 0.9,0.05,0.05) "
                f"or prepare more documents.")


def _tokenized(chunks: Iterator[list[str]], tok: Tokenizer, cumulative: Sequence[float], dtype: str,
               workers: int | None) -> Iterator[Chunk]:
    """Tokenised chunks in order: in-process with one worker, else a pool of processes with
    at most two chunks per worker in flight (memory stays bounded)."""
    from harness.runtime.threads import usable_cores

    # bytes and chars encode faster than a chunk travels to a process and back (measured:
    # benchmarks/data.md): one process unless asked; the others use every usable core
    cheap = tok.name in ("bytes", "chars")
    n = workers if workers is not None else 1 if cheap else usable_cores()
    check_workers(n)
    if n == 1:
        for chunk in chunks:
            yield tokenize_chunk(chunk, cumulative, dtype, tok)
        return
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    pool = ctx.Pool(n, initializer=_init_worker, initargs=(tok.to_json(), os.getpid()))
    try:
        pending: deque[Any] = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(tokenize_chunk, (chunk, cumulative, dtype)))
            if len(pending) >= 2 * n:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
