"""Faults of the third probe (issue 33) on `harness data prepare` and the readers: temporary
folders that are the user's, files that are not regular (FIFOs, devices, dangling links),
link loops and links out of a folder, damaged compressed files and JSON, sizes beyond meaning,
outputs that cannot be written, and the silent cases (nan fractions, empty corpora, a damaged
prior output). Each ends in exit 2 with one paragraph naming the file or field, or does the
right thing; nothing hangs (FIFOs are tested in a child process with a timeout)."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import subprocess
import sys

import pytest
from text import one_paragraph

from harness.cli.main import main
from harness.data.corpus import MANIFEST, open_corpus
from harness.data.prepare import prepare
from harness.data.readers import iter_records
from harness.errors import ConfigError


def docs(n: int = 40) -> str:
    return "".join(json.dumps({"text": f"document {i} " + "word " * (i % 7 + 1)}) + "\n" for i in range(n))


def run_prepare(capsys, *args: str) -> tuple[int, str]:
    code = main(["data", "prepare", *args, "--tokenizer", "bytes", "--quiet"])
    err = capsys.readouterr().err
    return code, err


# -- temporary paths ----------------------------------------------------------------------
def test_a_users_folder_named_like_a_partial_one_is_never_touched(tmp_path):
    (tmp_path / "a.jsonl").write_text(docs())
    notes = tmp_path / ".out.partial-notes"
    notes.mkdir()
    (notes / "mine.txt").write_text("keep me")
    stale_looking = tmp_path / ".out.partial-999999"  # the old scheme's name: still the user's
    stale_looking.mkdir()
    prepare([tmp_path / "a.jsonl"], tmp_path / "out", progress=False)
    assert (notes / "mine.txt").read_text() == "keep me" and stale_looking.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".out.partial-notes", ".out.partial-999999",
                                                                 "a.jsonl", "out"])
    assert not (tmp_path / "out" / ".harness-temporary").exists(), "the published folder is not marked"


def test_a_dead_runs_own_partial_folder_is_removed(tmp_path):
    from harness.runtime import paths

    (tmp_path / "a.jsonl").write_text(docs())
    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    left = tmp_path / f".out.harness-partial-{dead}-0123abcd"
    left.mkdir()
    (left / paths.MARK).write_text(dead)
    unmarked = tmp_path / f".out.harness-partial-{dead}-89abcdef"
    unmarked.mkdir()  # same pattern, no marker: not ours
    prepare([tmp_path / "a.jsonl"], out, progress=False)
    assert not left.exists() and unmarked.exists()


# -- files that are not regular, links ----------------------------------------------------
def _prepare_in_child(tmp_path, *sources: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.cli", "data", "prepare", *sources, "--tokenizer",
                           "bytes", "--out", str(tmp_path / "out"), "--quiet"], capture_output=True,
                          text=True, timeout=60)


def test_a_fifo_among_the_sources_is_refused_not_waited_on(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text(docs())
    os.mkfifo(src / "b.jsonl")
    for source in (src, src / "b.jsonl"):
        done = _prepare_in_child(tmp_path, str(source))
        assert done.returncode == 2
        line = one_paragraph(done.stderr)
        assert "b.jsonl" in line and "FIFO" in line


def test_a_device_is_refused(capsys, tmp_path):
    os.symlink("/dev/zero", tmp_path / "zero.txt")
    code, err = run_prepare(capsys, str(tmp_path / "zero.txt"), "--out", str(tmp_path / "out"))
    assert code == 2 and "character device" in one_paragraph(err)


def test_a_dangling_link_and_an_unreadable_file_are_named(capsys, tmp_path):
    os.symlink(tmp_path / "gone.jsonl", tmp_path / "a.jsonl")
    code, err = run_prepare(capsys, str(tmp_path / "a.jsonl"), "--out", str(tmp_path / "out"))
    assert code == 2 and "gone.jsonl" in one_paragraph(err) and "does not exist" in one_paragraph(err)
    src = tmp_path / "src"
    src.mkdir()
    os.symlink("gone.jsonl", src / "a.jsonl")
    code, err = run_prepare(capsys, str(src), "--out", str(tmp_path / "out"))
    assert code == 2 and "symbolic link" in one_paragraph(err)
    if os.geteuid() != 0:  # root reads anything
        (tmp_path / "b.jsonl").write_text(docs())
        (tmp_path / "b.jsonl").chmod(0)
        code, err = run_prepare(capsys, str(tmp_path / "b.jsonl"), "--out", str(tmp_path / "out"))
        assert code == 2 and "b.jsonl" in one_paragraph(err)


def test_a_link_loop_is_read_once_and_a_link_out_of_the_folder_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text(docs(10))
    os.symlink(".", src / "loop")
    records = list(iter_records([src], ["text"]))
    assert len(records) == 10, "the loop is not followed"
    (tmp_path / "outside.jsonl").write_text(docs(3))
    os.symlink(tmp_path / "outside.jsonl", src / "b.jsonl")
    with pytest.raises(ConfigError, match="outside"):
        list(iter_records([src], ["text"]))


def test_a_datasets_state_file_naming_a_file_outside_its_folder_is_refused(tmp_path):
    import pyarrow as pa

    table = pa.table({"text": ["a secret outside the folder"]})
    with pa.OSFile(str(tmp_path / "outside.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)  # a readable file: only the folder's bounds refuse it
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "state.json").write_text(json.dumps({"_data_files": [{"filename": "../outside.arrow"}]}))
    with pytest.raises(ConfigError, match="leads outside"):
        list(iter_records([ds], ["text"]))


# -- damaged contents ----------------------------------------------------------------------
@pytest.mark.parametrize("name, data", [
    ("junk.jsonl.gz", b"not gzip at all" * 10),
    ("junk.jsonl.bz2", b"not bzip2" * 10),
    ("junk.jsonl.xz", b"not xz" * 10),
    ("cut.jsonl.gz", gzip.compress(docs(400).encode())[:300]),
    ("cut.jsonl.bz2", bz2.compress(docs(400).encode())[:300]),
    ("cut.jsonl.xz", lzma.compress(docs(400).encode())[:300]),
    ("deep.jsonl", b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"),
    ("digits.jsonl", b'{"text": ' + b"7" * 5000 + b"}\n"),
    ("deep.json", b"[" * 100_000 + b"]" * 100_000),
])
def test_damaged_files_are_one_paragraph_naming_the_file(capsys, tmp_path, name, data):
    (tmp_path / name).write_bytes(data)
    code, err = run_prepare(capsys, str(tmp_path / name), "--out", str(tmp_path / "out"))
    line = one_paragraph(err)
    assert code == 2 and name in line
    assert not (tmp_path / "out").exists()


# -- sizes and outputs ----------------------------------------------------------------------
def test_workers_and_bpe_sizes_beyond_meaning_are_refused_at_once(capsys, tmp_path):
    (tmp_path / "a.jsonl").write_text(docs())
    code = main(["data", "prepare", str(tmp_path / "a.jsonl"), "--tokenizer", "bytes", "--workers", "100000",
                 "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 2 and "--workers" in one_paragraph(capsys.readouterr().err)
    code = main(["data", "prepare", str(tmp_path / "a.jsonl"), "--tokenizer", "bpe:99999999",
                 "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 2 and "1,048,576" in one_paragraph(capsys.readouterr().err)


def test_a_bpe_vocabulary_larger_than_the_corpus_supports_is_said(tmp_path, capsys):
    """An honest clamp: the BPE learns every merge the train text has (no larger vocabulary
    exists for it) and one ``warning:`` line says so on every path that prepares, the Python
    API and a task preparing its source included (before issue 40 only the command's summary
    said it); the run's data tag names the vocabulary learned and the one asked for."""
    (tmp_path / "a.jsonl").write_text(docs())
    result = prepare([tmp_path / "a.jsonl"], tmp_path / "out", tokenizer="bpe:70000", progress=False)
    learned = result.manifest["tokenizer"]["vocab_size"]
    assert learned < 70000 and result.manifest["tokenizer"]["name"] == f"bpe:{learned}"
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1
    assert f"tokenizer bpe:70000: the train text supports only {learned:,} ids" in " ".join(warned[0].split())
    from harness import create_task

    task = create_task("corpus_lm", seed=0, path=str(tmp_path / "out"), length=2, eval_tokens=4)
    assert f"tokenizer bpe:{learned}, asked for bpe:70000 ({learned} tokens)" in task.data_summary()
    prepare([tmp_path / "a.jsonl"], tmp_path / "out", tokenizer="bpe:70000", progress=False)
    assert "warning:" not in capsys.readouterr().err  # reused: said when it was made


def test_a_split_given_a_fraction_that_gets_no_text_is_refused(capsys, tmp_path):
    (tmp_path / "a.jsonl").write_text(docs())
    code, err = run_prepare(capsys, str(tmp_path / "a.jsonl"), "--split-fractions", "0.999999,0.000001,0",
                            "--out", str(tmp_path / "out"))
    err = one_paragraph(err)
    assert code == 2 and "the val split got no text" in err and "--split-fractions gives it 1e-06" in err
    assert not (tmp_path / "out").exists()
    code, err = run_prepare(capsys, str(tmp_path / "a.jsonl"), "--split-fractions", "0.5,0.4999,0.0001",
                            "--out", str(tmp_path / "out"))
    assert code == 2 and "the test split got no text" in one_paragraph(err) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["file_below", "proc", "dangling", "unwritable"])
def test_an_out_that_cannot_be_written_is_one_paragraph(capsys, tmp_path, where):
    (tmp_path / "a.jsonl").write_text(docs())
    if where == "file_below":
        (tmp_path / "f").write_text("x")
        out = tmp_path / "f" / "out"
    elif where == "proc":
        out = "/proc/harness-out"
    elif where == "dangling":
        out = tmp_path / "link"
        os.symlink(tmp_path / "nowhere", out)
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes anywhere")
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        out = ro / "out"
    code, err = run_prepare(capsys, str(tmp_path / "a.jsonl"), "--out", str(out))
    assert code == 2 and "--out" in one_paragraph(err)


# -- silent cases ---------------------------------------------------------------------------
@pytest.mark.parametrize("fractions", ["nan,0.5,0.5", "nan,nan,nan", "1e-9,0.5,0.5", "inf,0,0"])
def test_split_fractions_that_leave_no_train_split_are_refused(capsys, tmp_path, fractions):
    (tmp_path / "a.jsonl").write_text(docs())
    code, err = run_prepare(capsys, str(tmp_path / "a.jsonl"), "--out", str(tmp_path / "out"),
                            "--split-fractions", fractions)
    line = one_paragraph(err)
    assert code == 2 and ("split fractions" in line or "train split" in line)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", [None, ""])
def test_a_corpus_of_empty_documents_is_refused(capsys, tmp_path, value):
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": value}) + "\n" for _ in range(20)))
    code, err = run_prepare(capsys, str(tmp_path / "a.jsonl"), "--out", str(tmp_path / "out"))
    assert code == 2 and "no text" in one_paragraph(err)


@pytest.mark.parametrize("damage", ["truncated_shard", "missing_offsets", "junk_manifest", "empty_manifest"])
def test_prepare_again_redoes_a_damaged_output(tmp_path, damage):
    (tmp_path / "a.jsonl").write_text(docs(200))
    out = tmp_path / "out"
    first = prepare([tmp_path / "a.jsonl"], out, progress=False)
    shard = out / first.manifest["splits"]["train"]["shards"][0]["file"]
    if damage == "truncated_shard":
        shard.write_bytes(shard.read_bytes()[:10])
    elif damage == "missing_offsets":
        (out / "train.docs.bin").unlink()
    elif damage == "junk_manifest":
        (out / MANIFEST).write_text("{junk")
    else:
        (out / MANIFEST).write_text("")
    again = prepare([tmp_path / "a.jsonl"], out, progress=False)
    assert not again.reused
    assert open_corpus(out).split("train").tokens == first.manifest["splits"]["train"]["tokens"]


def test_a_folder_of_the_users_with_a_junk_manifest_is_still_left_alone(tmp_path):
    (tmp_path / "a.jsonl").write_text(docs())
    out = tmp_path / "out"
    out.mkdir()
    (out / MANIFEST).write_text("{junk")
    (out / "thesis.tex").write_text("mine")
    with pytest.raises(ConfigError, match="left alone"):
        prepare([tmp_path / "a.jsonl"], out, progress=False)
    assert (out / "thesis.tex").read_text() == "mine"


# -- damaged manifests: each names the file, the field and the command that fixes it ---------
def _manifest(out):
    return json.loads((out / MANIFEST).read_text())


@pytest.mark.parametrize("damage, said", [
    (lambda m, out: m["splits"]["train"]["shards"][0].__setitem__("tokens", "junk"), "shards[0].tokens is 'junk'"),
    (lambda m, out: (out / m["splits"]["train"]["shards"][0]["file"]).unlink(), "is missing"),
    (lambda m, out: m.__setitem__("format_version", "1"), "format_version is '1'"),
    (lambda m, out: m["tokenizer"].__setitem__("eod_id", 10**6), "tokenizer.eod_id is '1000000'"),
    (lambda m, out: m["tokenizer"].__setitem__("eod_id", -1), "tokenizer.eod_id is '-1'"),
    (lambda m, out: m["tokenizer"].__setitem__("vocab_size", 10), "holds token id"),
    (lambda m, out: m.__setitem__("splits", None), "no split 'train'"),
])
def test_a_damaged_manifest_names_the_field_and_the_command_that_fixes_it(tmp_path, damage, said):
    (tmp_path / "a.jsonl").write_text(docs(100))
    out = tmp_path / "out"
    prepare([tmp_path / "a.jsonl"], out, progress=False, command="harness data prepare a.jsonl --out out")
    manifest = _manifest(out)
    damage(manifest, out)
    (out / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ConfigError) as raised:
        corpus = open_corpus(out)
        corpus.split("train")
    text = str(raised.value)
    assert said in text and "harness data prepare a.jsonl --out out" in text, text
    assert "invalid literal" not in text and "-1 bytes" not in text


# -- the LRA readers --------------------------------------------------------------------------
def test_lra_readers_refuse_empty_files_and_folders_naming_them(tmp_path):
    from harness_plugins.tasks.lra import readers

    (tmp_path / "test_batch.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match="test_batch.bin is empty"):
        readers.read_cifar(tmp_path / "test_batch.bin")
    (tmp_path / "pairs.tsv").write_text("\n\n")
    with pytest.raises(ConfigError, match="pairs.tsv holds no pair"):
        readers.read_aan(tmp_path / "pairs.tsv")
    (tmp_path / "aclImdb" / "train" / "neg").mkdir(parents=True)
    (tmp_path / "aclImdb" / "train" / "pos").mkdir(parents=True)
    with pytest.raises(ConfigError, match="aclImdb/train/neg holds no review"):
        readers.read_imdb(tmp_path / "aclImdb", "train")
    os.mkfifo(tmp_path / "fifo.bin")
    with pytest.raises(ConfigError, match="FIFO"):
        readers.read_cifar(tmp_path / "fifo.bin")


def test_killing_prepare_leaves_no_pool_worker_behind_and_no_traceback(tmp_path):
    import signal
    import time

    src = tmp_path / "a.jsonl"
    src.write_text(docs(3000))
    script = (f"import time\nfrom harness.data.prepare import prepare\n"
              f"prepare([{str(src)!r}], {str(tmp_path / 'out')!r}, workers=2, progress=False, chunk_bytes=2000,"
              f" on_chunk=lambda i: time.sleep(0.1))\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".out.harness-partial-*/train-00000.bin")) and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True,
                             text=True).stdout.split()
    assert len(workers) >= 2, "the pool's workers are running"
    os.kill(proc.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)  # ends once every process holding stderr is gone
    time.sleep(0.5)
    from pathlib import Path

    alive = [pid for pid in workers if Path(f"/proc/{pid}").exists() and
             "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()]
    assert alive == [] and "BrokenPipeError" not in err and "Traceback" not in err, err
