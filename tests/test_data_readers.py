"""Readers of a researcher's files (harness.data.readers) and the tokenizers
(harness.data.tokenizers), on small files made here: every format, the bad-input cases
(ConfigError naming file and line), non-UTF-8 bytes replaced and counted."""

from __future__ import annotations

import bz2
import csv
import json

import numpy as np
import pytest

from harness.data.readers import ReadStats, file_digest, iter_records, resolve_sources
from harness.data.tokenizers import (
    EOD_ID,
    RESERVED,
    ByteTokenizer,
    build_tokenizer,
    load_tokenizer,
)
from harness.errors import ConfigError

DOCS = ["first document\nwith two lines\n", "second, café ünïcode 中文\n", "third\n"]


def texts(sources, field="text", stats=None):
    return [r.values[field] for r in iter_records(sources, [field], stats)]


# -- formats ---------------------------------------------------------------------------------


def test_txt_documents_are_blank_line_separated_blocks_with_their_first_line(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("\n\n".join(d.rstrip("\n") for d in DOCS) + "\n\n\n")
    records = list(iter_records([path], ["text"]))
    assert [r.values["text"] for r in records] == DOCS
    assert [r.line for r in records] == [1, 4, 6]
    assert {r.source for r in records} == {str(path)}


def test_jsonl_json_csv_parquet_and_compressed_give_the_same_records(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"body": d, "id": i} for i, d in enumerate(DOCS)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "b.json").write_text(json.dumps(rows))
    with open(tmp_path / "c.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["id", "body"])
        w.writeheader()
        w.writerows(rows)
    pq.write_table(pa.table({"body": DOCS, "id": [0, 1, 2]}), tmp_path / "d.parquet", row_group_size=2)
    with bz2.open(tmp_path / "e.jsonl.bz2", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    for name in ("a.jsonl", "b.json", "c.csv", "d.parquet", "e.jsonl.bz2"):
        assert texts([tmp_path / name], "body") == DOCS, name
    records = list(iter_records([tmp_path / "c.csv"], ["body", "id"]))
    assert records[1].values == {"body": DOCS[1], "id": "1"}
    assert [r.line for r in iter_records([tmp_path / "d.parquet"], ["id"])] == [1, 2, 3]


def test_a_datasets_save_to_disk_folder_is_read_without_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": DOCS, "label": [0, 1, 0]})
    ds.save_to_disk(str(tmp_path / "saved"))
    assert texts([tmp_path / "saved"]) == DOCS
    dd = datasets.DatasetDict({"train": ds, "test": ds.select([2])})
    dd.save_to_disk(str(tmp_path / "dict"))
    assert texts([tmp_path / "dict"]) == DOCS + DOCS[2:]


def test_folders_and_globs_resolve_in_sorted_order_each_file_once(tmp_path):
    (tmp_path / "sub").mkdir()
    for name, doc in (("b.txt", DOCS[1]), ("a.txt", DOCS[0]), ("sub/c.txt", DOCS[2])):
        (tmp_path / name).write_text(doc)
    (tmp_path / "notes.md").write_text("ignored")
    (tmp_path / ".hidden.txt").write_text("ignored")
    files = resolve_sources([tmp_path, str(tmp_path / "*.txt")])
    assert [f.name for f in files] == ["a.txt", "b.txt", "c.txt"]
    assert texts([str(tmp_path / "**" / "*.txt")]) == DOCS


def test_file_digest_is_the_sha256_of_the_bytes(tmp_path):
    import hashlib

    path = tmp_path / "a.txt"
    path.write_bytes(b"x" * 3_000_000)
    assert file_digest(path) == hashlib.sha256(b"x" * 3_000_000).hexdigest()


def test_bytes_that_are_not_utf8_are_replaced_and_counted_per_file(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"ok \xff\xfe then \xc3 end\n")
    (tmp_path / "good.jsonl").write_bytes(json.dumps({"text": "caf\u00e9 \ufffd"}).encode() + b"\n")
    stats = ReadStats()
    got = texts([tmp_path], stats=stats)
    assert got[0] == "ok \ufffd\ufffd then \ufffd end\n"
    assert stats.replaced == {str(tmp_path / "bad.txt"): 3, str(tmp_path / "good.jsonl"): 0}
    assert stats.records == {str(tmp_path / "bad.txt"): 1, str(tmp_path / "good.jsonl"): 1}


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(("setup", "source", "expected"), [
    (lambda p: (p / "e.txt").write_text(""), "e.txt", "is empty"),
    (lambda p: (p / "e.jsonl").write_text("\n\n"), "e.jsonl", "is empty"),
    (lambda p: (p / "empty").mkdir(), "empty", "holds no readable file"),
    (lambda p: None, "*.jsonl", "matched no file (supported: .txt"),
    (lambda p: None, "missing.txt", "does not exist"),
    (lambda p: (p / "x.docx").write_text("a"), "x.docx", "unsupported suffix"),
    (lambda p: (p / "j.jsonl").write_text('{"text": "a"}\n{"text": oops}\n'), "j.jsonl", "line 2: not JSON"),
    (lambda p: (p / "l.jsonl").write_text('["a"]\n'), "l.jsonl", "line 1: a JSON list, not an object"),
    (lambda p: (p / "o.json").write_text('{"text": "a"}'), "o.json", "must be a list of objects"),
    (lambda p: (p / "m.jsonl").write_text('{"text": "a"}\n{"body": "b", "id": 1}\n'), "m.jsonl",
     "line 2: no field 'text' (fields present: body, id)"),
    (lambda p: (p / "m.csv").write_text("body,id\nb,1\n"), "m.csv", "line 2: no field 'text' (fields present: body, id)"),
])
def test_bad_sources_are_config_errors_naming_file_and_line(tmp_path, setup, source, expected):
    setup(tmp_path)
    with pytest.raises(ConfigError) as err:
        texts([str(tmp_path / source)])
    assert expected in str(err.value)
    if "line" in expected or "empty" in expected:
        assert str(tmp_path / source) in str(err.value)


def test_a_missing_parquet_column_lists_the_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["a"], "id": [1]}), tmp_path / "d.parquet")
    with pytest.raises(ConfigError, match=r"no field 'text' \(fields present: body, id\)"):
        texts([tmp_path / "d.parquet"])


def test_txt_files_have_only_the_text_field(tmp_path):
    (tmp_path / "a.txt").write_text("a\n")
    with pytest.raises(ConfigError, match="one field, 'text'"):
        list(iter_records([tmp_path / "a.txt"], ["text", "label"]))


# -- tokenizers ------------------------------------------------------------------------------

SAMPLE = "Hello, wörld! 中文 and more text, more text.\n" * 20


@pytest.mark.parametrize("spec", ["bytes", "chars", "bpe:300"])
def test_tokenizers_round_trip_keep_the_specials_and_save_and_load(tmp_path, spec):
    tok = build_tokenizer(spec, [SAMPLE])
    ids = tok.encode(SAMPLE)
    assert tok.decode(ids) == SAMPLE
    assert min(ids) > EOD_ID and max(ids) < tok.vocab_size
    assert tok.eod_id == EOD_ID == RESERVED.index("<eod>") == 4
    tok.save(tmp_path / "tokenizer.json")
    again = load_tokenizer(tmp_path / "tokenizer.json")
    assert again.encode(SAMPLE) == ids and again.vocab_size == tok.vocab_size
    # token_bytes: the scored text's UTF-8 bytes, token by token
    assert int(tok.token_bytes()[np.array(ids)].sum()) == len(SAMPLE.encode("utf-8"))
    assert (tok.token_bytes()[:5] == 0).all()


def test_bytes_tokenizer_is_the_utf8_bytes_shifted_past_the_specials():
    tok = ByteTokenizer()
    assert tok.vocab_size == 261
    assert tok.encode("aé") == [5 + 97, 5 + 0xC3, 5 + 0xA9]


def test_chars_tokenizer_maps_unseen_characters_to_unk():
    tok = build_tokenizer("chars", ["abc"])
    assert tok.vocab_size == 6 + 3
    assert tok.encode("abz") == [6, 7, 5]


def test_bpe_learns_merges_on_its_text():
    tok = build_tokenizer("bpe:400", [SAMPLE])
    assert tok.vocab_size <= 400
    assert len(tok.encode(SAMPLE)) < len(SAMPLE.encode()) / 2  # merges compress the text it learned


def test_an_external_tokenizer_json_is_shifted_past_the_specials(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "external.json"))
    ours = build_tokenizer(str(tmp_path / "external.json"), None)
    assert ours.encode("hello world") == [5, 6]
    assert ours.vocab_size == 8
    assert ours.decode([5, 4, 6]) == "hello world"


@pytest.mark.parametrize(("content", "expected"), [
    ("not json", "is not JSON"),
    ('{"model": {"type": "Nonsense"}}', "does not load as a Hugging Face tokenizer.json"),
    ('{"harness_tokenizer": 1, "kind": "words"}', "unknown kind"),
])
def test_a_tokenizer_file_that_does_not_load_is_a_config_error(tmp_path, content, expected):
    (tmp_path / "t.json").write_text(content)
    with pytest.raises(ConfigError, match=expected):
        load_tokenizer(tmp_path / "t.json")


@pytest.mark.parametrize("spec", ["bpe:10", "bpe:x", "words", "missing/tokenizer.json"])
def test_unknown_tokenizer_specs_are_config_errors(spec):
    with pytest.raises(ConfigError, match="tokenizer"):
        build_tokenizer(spec, ["text"])


def test_csv_fields_longer_than_the_csv_modules_default_limit_are_read(tmp_path):
    long = "word " * 60_000  # 300 KB, past csv's 128 KiB default
    with open(tmp_path / "a.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text"])
        w.writerow([long])
    assert texts([tmp_path / "a.csv"]) == [long]


def test_a_csv_field_past_the_limit_names_file_and_line(tmp_path, monkeypatch):
    from harness.data import readers

    monkeypatch.setattr(readers, "CSV_FIELD_LIMIT", 10)
    (tmp_path / "a.csv").write_text("text\nshort\n" + "x" * 20 + "\n")
    with pytest.raises(ConfigError, match=r"a\.csv, line 3: not valid CSV \(field larger than field limit"):
        texts([tmp_path / "a.csv"])
