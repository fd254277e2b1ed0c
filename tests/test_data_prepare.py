"""``harness data prepare`` and prepared corpora (harness.data.prepare, harness.data.corpus) on
small corpora made here: the folder's layout and packing, hash splits, reuse, interruption
(Ctrl-C, SIGKILL) and every bad-input case (exit 2 through the CLI, ConfigError otherwise)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from text import flat

from harness.cli.main import main
from harness.data.corpus import FORMAT_VERSION, MANIFEST, open_corpus, window_starts
from harness.data.prepare import prepare, split_of
from harness.data.tokenizers import EOD_ID, ByteTokenizer
from harness.errors import ConfigError


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "épsilon", "zeta", "中"]) for _ in range(n))


def make_docs(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"doc {i}: {words(rng, rng.randint(1, 40))}" for i in range(count)]


def write_jsonl(path, docs, field="text"):
    path.write_text("".join(json.dumps({field: d}) + "\n" for d in docs))
    return path


def split_docs(root, split):
    """The documents of a split, decoded back from the shards (documents end at <eod>)."""
    corpus = open_corpus(root)
    s = corpus.split(split)
    stream = s.read(0, s.tokens) if s.tokens else np.zeros(0, dtype=np.int64)
    ends = np.flatnonzero(stream == EOD_ID)
    starts = np.concatenate([[0], ends[:-1] + 1]) if len(ends) else ends
    assert list(s.doc_starts) == list(starts), "document offsets point at each document's first token"
    return [corpus.tokenizer.decode(stream[a:b]) for a, b in zip(starts, ends, strict=True)]


# -- output ----------------------------------------------------------------------------------


def test_documents_are_packed_with_eod_and_every_document_lands_in_one_split(tmp_path):
    docs = make_docs(300)
    src = write_jsonl(tmp_path / "a.jsonl", docs)
    result = prepare([src], tmp_path / "out", tokenizer="bytes", workers=1, progress=False)
    m = result.manifest
    assert not result.reused and m["format_version"] == FORMAT_VERSION and m["dtype"] == "uint16"
    assert sorted(os.listdir(tmp_path / "out")) == sorted(
        [MANIFEST, "tokenizer.json"] + [f"{s}-00000.bin" for s in ("train", "val", "test")]
        + [f"{s}.docs.bin" for s in ("train", "val", "test")])
    got = {s: split_docs(tmp_path / "out", s) for s in ("train", "val", "test")}
    assert sorted(sum(got.values(), [])) == sorted(docs), "every document once, whole, in one split"
    order = {d: i for i, d in enumerate(docs)}
    for s, ds in got.items():
        assert [order[d] for d in ds] == sorted(order[d] for d in ds), f"{s}: source order kept"
        assert m["splits"][s]["documents"] == len(ds)
        assert m["splits"][s]["bytes"] == sum(len(d.encode()) for d in ds)
        assert m["splits"][s]["tokens"] == sum(len(d.encode()) + 1 for d in ds)  # bytes + <eod>
    assert m["sources"] == [{"path": str(src.resolve()), "size": src.stat().st_size,
                             "sha256": hashlib.sha256(src.read_bytes()).hexdigest(),
                             "records": 300, "replaced_bytes": 0}]
    assert m["tokenizer"]["vocab_size"] == 261 and m["tokenizer"]["eod_id"] == EOD_ID


def test_splits_follow_a_hash_of_the_document_whatever_the_order_or_company(tmp_path):
    docs = make_docs(2000, seed=1)
    write_jsonl(tmp_path / "a.jsonl", docs)
    shuffled = docs[:1000]
    random.Random(5).shuffle(shuffled)
    write_jsonl(tmp_path / "b.jsonl", shuffled)
    prepare([tmp_path / "a.jsonl"], tmp_path / "all", workers=1, progress=False, split_fractions=(0.8, 0.1, 0.1))
    prepare([tmp_path / "b.jsonl"], tmp_path / "half", workers=1, progress=False, split_fractions=(0.8, 0.1, 0.1))
    where_all = {d: s for s in ("train", "val", "test") for d in split_docs(tmp_path / "all", s)}
    where_half = {d: s for s in ("train", "val", "test") for d in split_docs(tmp_path / "half", s)}
    assert all(where_half[d] == where_all[d] for d in shuffled)
    # the split is the hash's: BLAKE2b-64 of the UTF-8 bytes against the cumulative fractions
    for d in docs[:200]:
        h = int.from_bytes(hashlib.blake2b(d.encode(), digest_size=8).digest(), "big") / 2**64
        assert where_all[d] == ("train" if h < 0.8 else "val" if h < 0.9 else "test")
        assert ("train", "val", "test")[split_of(d, [0.8, 0.9, 1.0])] == where_all[d]
    share = sum(s == "val" for s in where_all.values()) / len(docs)
    assert abs(share - 0.1) < 4 * (0.1 * 0.9 / len(docs)) ** 0.5  # binomial: 4 standard errors


def test_a_rerun_on_unchanged_sources_reuses_and_a_change_prepares_again(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", make_docs(50))
    out = tmp_path / "out"
    first = prepare([src], out, workers=1, progress=False)
    stamp = (out / MANIFEST).stat().st_mtime_ns
    again = prepare([src], out, workers=1, progress=False)
    assert again.reused and (out / MANIFEST).stat().st_mtime_ns == stamp
    assert "reused" in again.summary()
    other = prepare([src], out, tokenizer="chars", workers=1, progress=False)
    assert not other.reused and other.manifest["tokenizer"]["name"] == "chars"
    write_jsonl(src, make_docs(60))
    changed = prepare([src], out, tokenizer="chars", workers=1, progress=False)
    assert not changed.reused
    assert sum(s["documents"] for s in changed.manifest["splits"].values()) == 60
    assert sum(s["documents"] for s in first.manifest["splits"].values()) == 50
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no partial or old folder left"


def test_empty_documents_are_skipped_and_replaced_bytes_counted(tmp_path):
    filler = "".join(f'{{"text": "document {i}"}}\n' for i in range(40))  # every split gets text
    (tmp_path / "a.jsonl").write_text('{"text": ""}\n{"text": "kept"}\n' + filler)
    (tmp_path / "b.txt").write_bytes(b"bad \xff byte\n")
    result = prepare([tmp_path], tmp_path / "out", workers=1, progress=False, split_fractions=(0.5, 0.5, 0))
    m = result.manifest
    assert m["empty_documents"] == 1 and sum(s["documents"] for s in m["splits"].values()) == 42
    assert [s["replaced_bytes"] for s in m["sources"]] == [0, 1]
    assert "1 bytes that are not UTF-8 were replaced by U+FFFD" in result.summary()


def test_parallel_workers_write_the_same_folder_as_one(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", make_docs(400))
    prepare([src], tmp_path / "one", workers=1, progress=False, chunk_bytes=2000)
    prepare([src], tmp_path / "two", workers=2, progress=False, chunk_bytes=2000)
    for name in ("train-00000.bin", "val-00000.bin", "test.docs.bin", "tokenizer.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


def test_shards_roll_over_and_read_back_as_one_stream(tmp_path):
    docs = make_docs(100)
    src = write_jsonl(tmp_path / "a.jsonl", docs)
    prepare([src], tmp_path / "one", workers=1, progress=False)
    prepare([src], tmp_path / "many", workers=1, progress=False, shard_tokens=97)
    a, b = open_corpus(tmp_path / "one").split("train"), open_corpus(tmp_path / "many").split("train")
    assert len(b.shards) == -(-a.tokens // 97) > 1
    assert (a.read(0, a.tokens) == b.read(0, b.tokens)).all()
    assert (a.read(90, 20) == b.read(90, 20)).all()  # across a shard boundary


def test_bpe_is_learned_on_the_train_split_only(tmp_path):
    cumulative = [0.8, 0.9, 1.0]
    odd = [f"{c}{c}q{c}x{c}y{c}" * 60 for c in "bcdfghjklmnprstvwz"]
    held = next(d for d in odd if split_of(d, cumulative) != 0)  # a val or test document
    seen = next(d for d in odd if split_of(d, cumulative) == 0)  # a train document
    src = write_jsonl(tmp_path / "a.jsonl", make_docs(300) + [held, seen])
    prepare([src], tmp_path / "out", tokenizer="bpe:400", workers=1, progress=False,
            split_fractions=(0.8, 0.1, 0.1))
    tok = open_corpus(tmp_path / "out").tokenizer
    assert tok.name == "bpe:400" and tok.vocab_size == 400
    assert len(tok.encode(seen)) < len(seen) / 10, "merges learned from a train document"
    assert len(tok.encode(held)) > len(held) / 4, "no merges learned from a held-out document"


def test_a_vocabulary_past_uint16_is_stored_as_uint32(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70_000)} | {"[UNK]": 70_000}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "big.json"))
    write_jsonl(tmp_path / "a.jsonl", ["w69999 w1 w2", "w3 w69998", "w1"])  # w1: the val split's
    m = prepare([tmp_path / "a.jsonl"], tmp_path / "out", tokenizer=str(tmp_path / "big.json"),
                workers=1, progress=False, split_fractions=(0.9, 0.1, 0)).manifest
    assert m["dtype"] == "uint32"
    train = open_corpus(tmp_path / "out").split("train")
    assert train.read(0, train.tokens).tolist() == [69999 + 5, 1 + 5, 2 + 5, EOD_ID, 3 + 5, 69998 + 5, EOD_ID]


# -- interruption ----------------------------------------------------------------------------


def test_ctrl_c_during_prepare_leaves_nothing_and_a_rerun_completes(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", make_docs(200))
    out = tmp_path / "out"

    def interrupt(index: int) -> None:
        if index == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare([src], out, workers=1, progress=False, chunk_bytes=500, on_chunk=interrupt)
    assert list(tmp_path.iterdir()) == [src], "no output and no partial folder"
    with pytest.raises(ConfigError, match="harness data prepare"):
        open_corpus(out)
    assert not prepare([src], out, workers=1, progress=False).reused
    assert open_corpus(out).split("train").tokens > 0


def test_sigkill_during_prepare_leaves_no_folder_a_task_accepts_and_a_rerun_completes(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", make_docs(400))
    out = tmp_path / "out"
    script = textwrap.dedent(f"""
        import time
        from harness.data.prepare import prepare
        prepare([{str(src)!r}], {str(out)!r}, workers=1, progress=False, chunk_bytes=300,
                on_chunk=lambda i: time.sleep(0.05))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while not (found := list(tmp_path.glob(f".out.harness-partial-{proc.pid}-*/train-00000.bin"))) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    partial = found[0].parent
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert partial.is_dir() and not (partial / MANIFEST).exists(), "killed mid-way: a partial folder, no manifest"
    assert not out.exists()
    for folder in (out, partial):
        with pytest.raises(ConfigError):
            open_corpus(folder)
    result = prepare([src], out, workers=1, progress=False)
    assert not result.reused and not partial.exists(), "the re-run removes the dead run's partial folder"
    assert sum(s["documents"] for s in result.manifest["splits"].values()) == 400


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(("files", "args", "expected"), [
    ({"e.txt": ""}, ["e.txt"], "is empty"),
    ({"j.jsonl": '{"text": "a"}\nnot json\n'}, ["j.jsonl"], "j.jsonl, line 2: not JSON"),
    ({"m.jsonl": '{"body": "a"}\n'}, ["m.jsonl"], "no field 'text' (fields present: body)"),
    ({"a.txt": "a\n"}, ["a.txt", "--split-fractions", "0.5,0.5,0.5"], "must be three numbers"),
    ({"a.txt": "a\n"}, ["a.txt", "--tokenizer", "bpe:12"], "bpe:VOCAB needs an integer"),
    ({"a.txt": "a\n", "out/notes.md": "mine"}, ["a.txt"], "is left alone"),
])
def test_bad_input_exits_2_with_one_paragraph(tmp_path, capsys, monkeypatch, files, args, expected):
    monkeypatch.chdir(tmp_path)
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(content)
    argv = ["data", "prepare", *args, "--out", "out", "--quiet"]
    if "--tokenizer" not in args:
        argv += ["--tokenizer", "bytes"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in flat(err) and "Traceback" not in err
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_the_cli_prints_a_summary_and_never_imports_torch(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", make_docs(30))
    code = ("import sys; from harness.cli.main import main; rc = main(['data', 'prepare', 'a.jsonl', "
            "'--tokenizer', 'bytes', '--out', 'out', '--workers', '1']); "
            "assert 'torch' not in sys.modules, 'prepare imported torch'; sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "prepared" in done.stdout and "train" in done.stdout
    assert "MB/s" in done.stderr, "progress on stderr"


def test_a_path_that_is_not_prepared_prints_the_prepare_command(tmp_path):
    (tmp_path / "raw").mkdir()
    for path in (tmp_path / "raw", tmp_path / "missing"):
        with pytest.raises(ConfigError, match="harness data prepare .* --out"):
            open_corpus(path)


def prepared(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", make_docs(50))
    prepare([src], tmp_path / "out", workers=1, progress=False)
    return tmp_path / "out"


def edit_manifest(root, change):
    m = json.loads((root / MANIFEST).read_text())
    change(m)
    (root / MANIFEST).write_text(json.dumps(m))


def test_another_format_version_is_refused_with_the_command_that_prepares_it(tmp_path):
    root = prepared(tmp_path)
    edit_manifest(root, lambda m: m.update(format_version=FORMAT_VERSION + 1))
    with pytest.raises(ConfigError, match=f"version {FORMAT_VERSION + 1}.*harness data prepare .*a.jsonl"):
        open_corpus(root)


@pytest.mark.parametrize("name", ["../outside.bin", "/etc/passwd", "sub/x.bin", ".hidden", "..", ""])
def test_no_file_named_in_a_manifest_escapes_its_folder(tmp_path, name):
    root = prepared(tmp_path)
    edit_manifest(root, lambda m: m["splits"]["train"]["shards"][0].update(file=name))
    with pytest.raises(ConfigError, match="not a plain file name"):
        open_corpus(root).split("train")


def test_a_shard_of_the_wrong_size_is_refused(tmp_path):
    root = prepared(tmp_path)
    with open(root / "train-00000.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(ConfigError, match="damaged"):
        open_corpus(root).split("train")


def test_a_window_longer_than_the_split_is_a_config_error(tmp_path):
    corpus = open_corpus(prepared(tmp_path))
    val = corpus.split("val").tokens
    with pytest.raises(ConfigError, match="longer than the val split"):
        corpus.require("val", val + 1)


# -- windows across ranks --------------------------------------------------------------------


def test_ranks_read_disjoint_windows_in_every_step_and_cover_the_stream(tmp_path):
    world, batch, tokens, length = 4, 8, 1000, 16
    seen = []
    for step in range(50):
        per_rank = [window_starts(tokens, length, batch, seed=7, step=step, rank=r, world=world)
                    for r in range(world)]
        flat = np.concatenate(per_rank)
        assert len(flat) == world * batch and len(set(flat.tolist())) == world * batch, f"step {step}"
        assert flat.min() >= 0 and flat.max() + length + 1 <= tokens
        again = window_starts(tokens, length, batch, seed=7, step=step, rank=2, world=world)
        assert (again == per_rank[2]).all(), "a step's windows depend only on (seed, step, rank)"
        seen += flat.tolist()
    assert len(set(seen)) > 0.7 * (tokens - length), "the draws spread over the whole stream"
    assert not (window_starts(tokens, length, batch, seed=8, step=0) ==
                window_starts(tokens, length, batch, seed=7, step=0)).all()
    with pytest.raises(ConfigError, match="too few"):
        window_starts(40, 16, 8, seed=0, step=0, world=4)


def test_bytes_tokenizer_token_bytes_match_the_split_bytes(tmp_path):
    corpus = open_corpus(prepared(tmp_path))
    table = ByteTokenizer().token_bytes()
    for s in ("train", "val", "test"):
        split = corpus.split(s)
        assert int(table[split.read(0, split.tokens)].sum()) == split.bytes


def test_two_processes_preparing_the_same_folder_at_once_both_succeed(tmp_path):
    """Study workers starting together prepare a task's corpus on first use at the same time."""
    src = write_jsonl(tmp_path / "a.jsonl", make_docs(200))
    out = tmp_path / "out"
    script = textwrap.dedent(f"""
        import time
        from harness.data.prepare import prepare
        prepare([{str(src)!r}], {str(out)!r}, workers=1, progress=False, chunk_bytes=500,
                on_chunk=lambda i: time.sleep(0.01))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert sum(s["documents"] for s in open_corpus(out).manifest["splits"].values()) == 200
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "out"], "no partial or old folder left"


def test_the_python_api_prepares_as_the_command_does(tmp_path):
    import harness

    src = write_jsonl(tmp_path / "a.jsonl", make_docs(40))
    result = harness.prepare_corpus([src], tmp_path / "out", workers=1, progress=False)
    assert result.path == tmp_path / "out" and not result.reused
    assert open_corpus(tmp_path / "out").manifest == result.manifest
    assert harness.prepare_corpus([src], tmp_path / "out", progress=False).reused
