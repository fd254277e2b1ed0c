"""Readers of a researcher's files: records streamed from files, folders and globs.

:func:`iter_records` yields one :class:`Record` per document or row, with the requested
fields as strings, the file it came from and its 1-based line (or row) number, so every
error can name both. Supported sources (a compressed ``.gz``, ``.bz2`` or ``.xz`` variant of
the four text formats is read the same way, e.g. ``corpus.txt.bz2``):

``.txt``      documents separated by one or more blank lines (a blank-line-separated block
              is one document, so a single large file streams and splits into many
              documents); the one field is ``text``; ``line`` is the block's first line.
``.jsonl``    one JSON object per line (blank lines skipped).
``.json``     a list of objects (read whole: use ``.jsonl`` for large files); ``line`` is the
              object's 1-based position in the list.
``.csv``      a header row, then one record per row (``line`` is the file's line number).
``.parquet``  streamed by row group with pyarrow; ``line`` is the 1-based row number.
``.arrow``    Arrow IPC (stream or file) record batches; a folder written by
              ``datasets.save_to_disk`` (one with ``state.json``, or a ``DatasetDict`` with
              ``dataset_dict.json``) is read through its ``.arrow`` files directly, without
              the ``datasets`` package.

A folder is read recursively in sorted path order, taking the files with a supported
suffix (hidden files are skipped). Field values are converted to strings; a null value is
the empty string.

**Bytes that are not UTF-8** are decoded with replacement (each invalid sequence becomes
U+FFFD) rather than refused, so one bad byte in a large corpus does not stop a run; the
number of replaced bytes per file is counted in :class:`ReadStats` and reported by
``harness data prepare``.

Errors are :class:`~harness.errors.ConfigError` (exit 2) naming the file and line: no file
matched, an empty file or folder, a JSONL line that is not JSON, a missing field (listing the
fields present).
"""

from __future__ import annotations

import bz2
import codecs
import csv
import glob
import gzip
import hashlib
import io
import json
import lzma
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from harness.errors import ConfigError
from harness.runtime import files as user_files

TEXT_SUFFIXES = (".txt", ".jsonl", ".json", ".csv")
BINARY_SUFFIXES = (".parquet", ".arrow")
#: Each compressed suffix's reader of an open binary file.
COMPRESSED: dict[str, Any] = {".gz": lambda f: gzip.GzipFile(fileobj=f, mode="rb"),
                              ".bz2": lambda f: bz2.BZ2File(f, "rb"), ".xz": lambda f: lzma.LZMAFile(f, "rb")}  # noqa: SIM115
#: Files ``datasets.save_to_disk`` writes beside its ``.arrow`` files (metadata, not data).
DATASETS_METADATA = frozenset({"state.json", "dataset_info.json", "dataset_dict.json"})
#: The one field of a ``.txt`` record.
TXT_FIELD = "text"
DIGEST_CHUNK = 1 << 20


@dataclass(frozen=True)
class Record:
    """One document or row: the requested fields as strings, where it came from."""

    values: dict[str, str]
    source: str  # the file's path
    line: int  # 1-based line (jsonl, csv, txt block start), object (json) or row (parquet, arrow)


@dataclass
class ReadStats:
    """What reading found, per file: records and bytes that were not UTF-8 (replaced)."""

    records: dict[str, int] = field(default_factory=dict)
    replaced: dict[str, int] = field(default_factory=dict)  # invalid bytes replaced by U+FFFD

    @property
    def replaced_total(self) -> int:
        return sum(self.replaced.values())


class _Replacements:
    """The count of invalid bytes the decoder replaced in the file being read."""

    count = 0


def _count_and_replace(exc: UnicodeError) -> tuple[str, int]:
    assert isinstance(exc, UnicodeDecodeError)
    _Replacements.count += exc.end - exc.start
    return "\ufffd", exc.end


ERRORS = "harness.count_replace"
codecs.register_error(ERRORS, _count_and_replace)


def format_of(path: Path) -> str | None:
    """The reader a file needs (its suffix, compression stripped), or None if unsupported."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSED:
        suffixes = suffixes[:-1]
        return suffixes[-1] if suffixes and suffixes[-1] in TEXT_SUFFIXES else None
    if suffixes and suffixes[-1] in TEXT_SUFFIXES + BINARY_SUFFIXES:
        return suffixes[-1]
    return None


def _datasets_folder(folder: Path) -> list[Path] | None:
    """The ``.arrow`` files of a folder written by ``datasets.save_to_disk``, else None (each
    named file must lie inside the folder: :func:`harness.runtime.files.inside`)."""
    state = folder / "state.json"
    if state.is_file():
        try:
            files = [str(f["filename"]) for f in json.loads(user_files.read_text(state))["_data_files"]]
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ConfigError(f"{state} is not a datasets state file ({type(exc).__name__}: "
                              f"{str(exc)[:200]}); the folder looks like one written by "
                              f"datasets.save_to_disk but is damaged.") from None
        paths = []
        for name in files:
            path = user_files.inside(folder, name, f"the data file named in {state}")
            if Path(name).name != name or not path.is_file():
                raise ConfigError(f"{state} names the data file {name!r}, which is not a file in "
                                  f"{folder}.")
            paths.append(path)
        return paths
    dict_file = folder / "dataset_dict.json"
    if dict_file.is_file():
        try:
            splits = [str(s) for s in json.loads(user_files.read_text(dict_file))["splits"]]
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ConfigError(f"{dict_file} is not a datasets dictionary file ({type(exc).__name__}: "
                              f"{str(exc)[:200]}).") from None
        out: list[Path] = []
        for split in splits:
            sub = folder / split
            if Path(split).name != split or split in (".", "..") or not sub.is_dir():
                raise ConfigError(f"{dict_file} names the split {split!r}, which is not a folder in {folder}.")
            user_files.inside(folder, split, f"the split named in {dict_file}")
            out += _datasets_folder(sub) or []
        return out
    return None


def _prepared(folder: Path) -> bool:
    manifest = folder / "manifest.json"
    return manifest.is_file() and b'"harness-corpus"' in manifest.read_bytes()[:200]


def _folder_files(folder: Path, walk: user_files.Walk | None = None, top: Path | None = None) -> list[Path]:
    """The data files under ``folder``: each real folder visited once (a link loop is not
    followed again), links kept inside the source folder ``top``, only regular files."""
    walk = walk or user_files.Walk()
    top = top or folder
    if not walk.first_visit(folder):
        return []
    found = _datasets_folder(folder)
    if found is not None:
        return found
    out: list[Path] = []
    for p in user_files.listing(folder):
        if p.name.startswith("."):
            continue
        if p.is_symlink():
            user_files.inside(top, p.relative_to(top), "the linked source")
        if p.is_dir():
            if not _prepared(p):  # a prepared corpus written inside its own sources
                out += _folder_files(p, walk, top)
        elif format_of(p) is not None and p.name not in DATASETS_METADATA:
            user_files.check_regular(p, "the source")
            out.append(p)
    return out


def resolve_sources(sources: Iterable[str | Path]) -> list[Path]:
    """The files ``sources`` (files, folders, globs) name, in order, each once; a folder on
    the way that this user cannot search or list is named (never a ``PermissionError``)."""
    try:
        return _resolve_sources(sources)
    except PermissionError as exc:
        raise user_files.permission_denied(exc, "the source") from None


def _resolve_sources(sources: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for source in sources:
        text = str(source)
        path = Path(text).expanduser()
        if path.is_dir():
            files = _folder_files(path)
            if not files:
                raise ConfigError(
                    f"the folder {path} holds no readable file (supported: "
                    f"{', '.join(TEXT_SUFFIXES + BINARY_SUFFIXES)}, optionally compressed "
                    f"{', '.join(COMPRESSED)}, or a folder written by datasets.save_to_disk). "
                    f"Point at a folder with data files in it.")
        elif path.is_file() or path.is_symlink() or (path.exists() and not glob.has_magic(text)):
            user_files.check_regular(path, "the source")
            if format_of(path) is None:
                raise ConfigError(
                    f"{path} has an unsupported suffix; supported: "
                    f"{', '.join(TEXT_SUFFIXES + BINARY_SUFFIXES)} (text formats also compressed: "
                    f"{', '.join(COMPRESSED)}). Convert it, or rename it if its content is one of these.")
            files = [path]
        elif glob.has_magic(text):
            matched = sorted(Path(p) for p in glob.glob(str(path), recursive=True))
            files = [p for p in matched if not p.is_dir() and format_of(p) is not None]
            for p in files:
                user_files.check_regular(p, "the source")
            walk = user_files.Walk()
            for d in (p for p in matched if p.is_dir()):
                files += _folder_files(d, walk)
            if not files:
                skipped = sorted({p.suffix or p.name for p in matched if p.is_file()})
                supported = (f"supported: {', '.join(TEXT_SUFFIXES + BINARY_SUFFIXES)}, text "
                             f"formats also compressed ({', '.join(COMPRESSED)})")
                if skipped:
                    raise ConfigError(
                        f"the pattern {text!r} matched {len(matched)} file(s), none in a format "
                        f"the harness reads ({', '.join(skipped[:5])}; {supported}). Convert them: "
                        f"plain text as .txt (each blank-line-separated block is a document, e.g. "
                        f"a.py copied to a.py.txt) or as JSONL records with a text field (one "
                        f"document each).")
                raise ConfigError(f"the pattern {text!r} matched no file ({supported}). Check the "
                                  f"pattern (quote it so the shell does not expand it).")
        else:
            raise ConfigError(f"the source {text!r} does not exist (no such file or folder, and "
                              f"not a glob pattern). Check the path.")
        for f in files:
            if f not in out:
                out.append(f)
    if not out:
        raise ConfigError("no sources were given: name at least one file, folder or glob.")
    return out


def file_digest(path: str | Path) -> str:
    """The sha256 of a file's bytes, as hex."""
    h = hashlib.sha256()
    with user_files.open_regular(Path(path)) as f:
        while chunk := f.read(DIGEST_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _open_text(path: Path) -> IO[str]:
    suffix = path.suffix.lower()
    raw: IO[bytes] = user_files.open_regular(path, "the source")  # closed with the wrapper
    if suffix in COMPRESSED:
        raw = COMPRESSED[suffix](raw)
    return io.TextIOWrapper(raw, encoding="utf-8", errors=ERRORS, newline="" if format_of(path) == ".csv" else None)


def _pick(row: dict[str, Any], fields: Sequence[str], path: Path, line: int) -> dict[str, str]:
    missing = [f for f in fields if f not in row]
    if missing:
        present = ", ".join(map(str, row)) or "none"
        raise ConfigError(
            f"{path}, line {line}: no field {', '.join(repr(m) for m in missing)} (fields present: "
            f"{present}). Name the text field with --field (or the task's field params).")
    return {f: "" if row[f] is None else str(row[f]) for f in fields}


def _txt(path: Path, fields: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    if list(fields) != [TXT_FIELD]:
        raise ConfigError(
            f"{path}: a .txt file has one field, '{TXT_FIELD}' (each blank-line-separated block is "
            f"a document), but {', '.join(map(repr, fields))} was asked for. Use .jsonl, .csv or "
            f".parquet for files with several fields, or --field {TXT_FIELD}.")
    block: list[str] = []
    start = 0
    with _open_text(path) as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                if not block:
                    start = number
                block.append(line)
            elif block:
                yield start, {TXT_FIELD: "".join(block)}
                block = []
        if block:
            yield start, {TXT_FIELD: "".join(block)}


def _jsonl(path: Path, fields: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    with _open_text(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}, line {number}: not JSON ({exc.msg} at column {exc.colno}). "
                                  f"Each line of a .jsonl file must be one JSON object; fix or "
                                  f"remove the line.") from None
            except (ValueError, RecursionError) as exc:
                raise ConfigError(f"{path}, line {number}: {user_files.read_problem(exc) or exc}. "
                                  f"Fix or remove the line.") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}, line {number}: a JSON {type(row).__name__}, not an "
                                  f"object; each line of a .jsonl file must be one JSON object.")
            yield number, _pick(row, fields, path, number)


def _json(path: Path, fields: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    with _open_text(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}, line {exc.lineno}: not JSON ({exc.msg}). A .json source "
                              f"must be a list of objects.") from None
        except (ValueError, RecursionError) as exc:
            if (problem := user_files.read_problem(exc)) is None:
                raise
            raise ConfigError(f"{path}: {problem}. A .json source must be a list of objects.") from None
    if not isinstance(data, list):
        raise ConfigError(f"{path}: a .json source must be a list of objects, not a JSON "
                          f"{type(data).__name__}. (One object per line? Name it .jsonl.)")
    for number, row in enumerate(data, 1):
        if not isinstance(row, dict):
            raise ConfigError(f"{path}, item {number}: a JSON {type(row).__name__}, not an object.")
        yield number, _pick(row, fields, path, number)


#: The longest CSV field read (the csv module's default, 128 KiB, is shorter than many documents).
CSV_FIELD_LIMIT = 1 << 30


def _csv(path: Path, fields: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    csv.field_size_limit(CSV_FIELD_LIMIT)
    with _open_text(path) as f:
        reader = csv.DictReader(f)
        rows = iter(reader)
        while True:
            try:
                row = next(rows)
            except StopIteration:
                return
            except csv.Error as exc:
                raise ConfigError(f"{path}, line {reader.line_num + 1}: not valid CSV ({exc}).") from None
            yield reader.line_num, _pick(row, fields, path, reader.line_num)


def _table_batches(path: Path, fields: Sequence[str]) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    user_files.check_regular(path, "the source")
    try:
        if path.suffix.lower() == ".parquet":
            pf = pq.ParquetFile(path)
            names = pf.schema_arrow.names
            _check_columns(names, fields, path)
            yield from pf.iter_batches(batch_size=1024, columns=list(fields))
            return
        source = pa.memory_map(str(path))
        try:
            reader: Any = pa.ipc.open_stream(source)
        except pa.ArrowInvalid:
            reader = pa.ipc.open_file(source)
            _check_columns(reader.schema.names, fields, path)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i).select(list(fields))
            return
        _check_columns(reader.schema.names, fields, path)
        for batch in reader:
            yield batch.select(list(fields))
    except (pa.ArrowInvalid, OSError) as exc:
        raise ConfigError(f"{path}: not a readable {path.suffix} file ({exc}).") from None


def _check_columns(names: Sequence[str], fields: Sequence[str], path: Path) -> None:
    missing = [f for f in fields if f not in names]
    if missing:
        raise ConfigError(
            f"{path}, row 1: no field {', '.join(repr(m) for m in missing)} (fields present: "
            f"{', '.join(names) or 'none'}). Name the text field with --field (or the task's "
            f"field params).")


def _table(path: Path, fields: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    number = 0
    for batch in _table_batches(path, fields):
        columns = [batch.column(f).to_pylist() for f in fields]
        for values in zip(*columns, strict=True):
            number += 1
            yield number, {f: "" if v is None else _as_text(v) for f, v in zip(fields, values, strict=True)}


def _as_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors=ERRORS)
    return str(value)


READERS = {".txt": _txt, ".jsonl": _jsonl, ".json": _json, ".csv": _csv,
           ".parquet": _table, ".arrow": _table}


def iter_records(sources: Iterable[str | Path], fields: Sequence[str],
                 stats: ReadStats | None = None) -> Iterator[Record]:
    """Stream the records of ``sources`` (files, folders, globs; see the module) with
    ``fields``; ``stats``, when given, collects records and replaced bytes per file."""
    if not fields:
        raise ConfigError("no field was named: say which field holds the text (--field).")
    for path in resolve_sources(sources):
        kind = format_of(path)
        assert kind is not None
        name = str(path)
        _Replacements.count = 0
        count = line = 0
        try:
            for line, values in READERS[kind](path, fields):
                count += 1
                yield Record(values, name, line)
        except (OSError, EOFError, ValueError, RecursionError, lzma.LZMAError, zlib.error) as exc:
            problem = user_files.read_problem(exc)
            if problem is None or isinstance(exc, ConfigError):
                raise
            where = f", after line {line}" if line else ""
            raise ConfigError(f"file {path}{where}: {problem}. Fix or replace the file, or remove "
                              f"it from the sources.") from None
        if stats is not None:
            stats.records[name] = count
            stats.replaced[name] = _Replacements.count
        if count == 0:
            raise ConfigError(f"{path} is empty: it holds no record. Remove it from the "
                              f"sources or fill it.")
