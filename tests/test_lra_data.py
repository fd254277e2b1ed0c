"""LRA's real-data tasks read the researcher's own copy: small files in each release's layout,
made here; a missing copy is a clear error naming what to download and where."""

from __future__ import annotations

import numpy as np
import pytest
from text import flat

import harness
from harness.data.vocab import SEP
from harness.errors import ConfigError, MissingDataError
from harness_plugins.tasks.lra_image import LraImageConfig, LraImageTask
from harness_plugins.tasks.lra_retrieval import LraRetrievalConfig, LraRetrievalTask
from harness_plugins.tasks.lra_text import LraTextConfig, LraTextTask

FIRST = 4  # the first symbol id after the specials


def make_imdb(root, reviews):
    for (split, polarity), texts in reviews.items():
        folder = root / "aclImdb" / split / polarity
        folder.mkdir(parents=True, exist_ok=True)
        for i, text in enumerate(texts):
            (folder / f"{i}_7.txt").write_bytes(text.encode("utf-8"))
    return root / "aclImdb"


def test_text_reads_reviews_as_bytes_truncated_with_labels(tmp_path):
    root = make_imdb(tmp_path, {
        ("train", "pos"): ["Great film é!", "loved it"], ("train", "neg"): ["bad " * 10],
        ("test", "pos"): ["fine"], ("test", "neg"): ["awful", "dull"]})
    task = LraTextTask(LraTextConfig(data_dir=str(root), length=12), seed=0)
    train = task.examples("train", 12)
    by_text = {bytes(t - FIRST for t in e["tokens"]): e["label"] for e in train}
    assert by_text == {"Great film é!".encode()[:12]: 1, b"loved it": 1, b"bad bad bad ": 0}
    assert all(len(e["tokens"]) <= 12 for e in train)
    val, test = task.examples("val", 12), task.examples("test", 12)
    assert val == test and sorted(e["label"] for e in val) == [0, 0, 1]  # LRA: validation is the test set
    assert LraTextTask(LraTextConfig(data_dir=str(root), length=12), seed=5).examples("train", 12) == train


def test_text_without_data_says_what_to_download_and_where(tmp_path):
    with pytest.raises(MissingDataError, match=r"aclImdb_v1.tar.gz.*task.params.data_dir"):
        LraTextTask(LraTextConfig(data_dir=str(tmp_path / "nowhere")), seed=0)


def aan_line(label, one, two, ids=("a1", "b2")):
    return f"{label}\t{ids[0]}\t{ids[1]}\t{one}\t{two}\n"


def make_aan(root, rows):
    root.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "train"), ("val", "eval"), ("test", "test")):
        (root / f"new_aan_pairs.{name}.tsv").write_text("".join(aan_line(*r) for r in rows[split]))
    return root


def test_retrieval_reads_pairs_as_doc1_sep_doc2_each_truncated(tmp_path):
    root = make_aan(tmp_path / "tsv_data", {
        "train": [("1.0", "abcdef", "xy"), ("0.0", "q", "rstuvwxyz")],
        "val": [("1", "m", "n")], "test": [("0", "o", "p")]})
    task = LraRetrievalTask(LraRetrievalConfig(data_dir=str(root), length=4), seed=0)
    train = task.examples("train", 4)
    decoded = [(e["label"], e["tokens"]) for e in train]
    def enc(s):
        return [FIRST + b for b in s.encode()]
    assert decoded == [(1, enc("abcd") + [SEP] + enc("xy")), (0, enc("q") + [SEP] + enc("rstu"))]
    assert [e["label"] for e in task.examples("val", 4)] == [1]
    assert [e["label"] for e in task.examples("test", 4)] == [0]
    assert task.model_hints == {"two_tower": True}


def test_retrieval_refuses_an_empty_file_of_any_split_when_built(tmp_path):
    root = make_aan(tmp_path / "tsv_data", {s: [("1", "a", "b")] for s in ("train", "val", "test")})
    (root / "new_aan_pairs.test.tsv").write_text("")
    with pytest.raises(ConfigError, match="new_aan_pairs.test.tsv, which is empty"):
        LraRetrievalTask(LraRetrievalConfig(data_dir=str(root)), seed=0)


def test_retrieval_names_the_line_of_a_malformed_file(tmp_path):
    root = make_aan(tmp_path / "tsv_data", {"train": [("1", "a", "b")], "val": [("1", "a", "b")],
                                            "test": [("1", "a", "b")]})
    (root / "new_aan_pairs.train.tsv").write_text(aan_line("1", "a", "b") + "0\tx\ty\tonly four\n")
    task = LraRetrievalTask(LraRetrievalConfig(data_dir=str(root)), seed=0)
    with pytest.raises(ConfigError, match=r"line 2: 4 tab-separated fields"):
        task.examples("train", task.train_length)
    with pytest.raises(MissingDataError, match="lra_release.gz"):
        LraRetrievalTask(LraRetrievalConfig(data_dir=str(tmp_path)), seed=0)


def make_cifar(root, images_per_file, rng):
    """Files of CIFAR-10's binary layout; returns {file: (labels, rgb (n, 3, 1024))}."""
    root.mkdir(parents=True, exist_ok=True)
    made = {}
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        labels = rng.integers(0, 10, images_per_file, dtype=np.uint8)
        rgb = rng.integers(0, 256, (images_per_file, 3, 1024), dtype=np.uint8)
        records = np.concatenate([labels[:, None], rgb.reshape(images_per_file, -1)], axis=1)
        (root / name).write_bytes(records.tobytes())
        made[name] = (labels, rgb)
    return made


def test_image_reads_cifar_binary_records_as_grey_pixels(tmp_path):
    root = tmp_path / "cifar-10-batches-bin"
    made = make_cifar(root, 4, np.random.default_rng(0))
    task = LraImageTask(LraImageConfig(data_dir=str(root)), seed=0)
    labels = np.concatenate([made[f"data_batch_{i}.bin"][0] for i in range(1, 6)])
    rgb = np.concatenate([made[f"data_batch_{i}.bin"][1] for i in range(1, 6)]).astype(np.float64)
    grey = np.rint(rgb[:, 0] * 0.2989 + rgb[:, 1] * 0.5870 + rgb[:, 2] * 0.1140)  # float64 reference
    train, val = task.examples("train", 1024), task.examples("val", 1024)
    assert len(train) == 18 and len(val) == 2  # LRA's 90% / 10% of the training files
    got = np.array([e["tokens"] for e in train + val]) - FIRST
    assert np.abs(got - grey).max() <= 1 and (got == grey).mean() > 0.99  # rounding ties aside
    assert [e["label"] for e in train + val] == labels.tolist()
    test = task.examples("test", 1024)
    assert [e["label"] for e in test] == made["test_batch.bin"][0].tolist()
    assert task.num_classes == 10 and all(len(e["tokens"]) == 1024 for e in test)


def test_image_refuses_files_that_are_not_cifar_binary(tmp_path):
    root = tmp_path / "cifar-10-batches-bin"
    make_cifar(root, 2, np.random.default_rng(1))
    (root / "data_batch_3.bin").write_bytes(b"\x80\x04 not a binary batch")  # e.g. a pickle
    with pytest.raises(ConfigError, match="not a multiple of 3,073"):  # when the task is built
        LraImageTask(LraImageConfig(data_dir=str(root)), seed=0)
    make_cifar(root, 2, np.random.default_rng(1))
    (root / "test_batch.bin").write_bytes(b"")  # a test file of zero bytes: no run reads it, yet refused
    with pytest.raises(ConfigError, match="test_batch.bin, which is empty"):
        LraImageTask(LraImageConfig(data_dir=str(root)), seed=0)
    (root / "test_batch.bin").unlink()
    with pytest.raises(MissingDataError, match="cifar-10-binary.tar.gz"):
        LraImageTask(LraImageConfig(data_dir=str(root)), seed=0)


@pytest.mark.slow  # ~10 s: the CLI loads the training stack before it builds the task
def test_a_missing_copy_is_a_clean_cli_error(tmp_path, capsys):
    from harness.cli.main import main

    code = main(["train", "--task", "lra_image", "--model", "transformer",
                 "--set", f"task.params.data_dir={tmp_path}"])
    err = flat(capsys.readouterr().err)
    assert code == 2 and "Traceback" not in err and "cifar-10-binary.tar.gz" in err


@pytest.mark.slow
def test_retrieval_trains_two_towers_end_to_end(tmp_path, registry):
    rows = [("1", "ab" * 8, "ab" * 5), ("0", "cd" * 6, "ef" * 7)] * 16
    root = make_aan(tmp_path / "tsv_data", {"train": rows, "val": rows[:8], "test": rows[:8]})
    cfg = {"task": {"name": "lra_retrieval", "params": {"data_dir": str(root), "length": 32}},
           "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2,
                                                       "pool": "cls", "classifier": "mlp"},
                     "attention": {"name": "multi_head"}, "position": {"name": "sinusoidal"}},
           "train": {"max_steps": 4, "batch_size": 8, "val_every": 2, "progress": False},
           "tracking": {"experiment": "lra"}}
    result = harness.train(cfg, registry=registry)
    assert result.status == "FINISHED" and 0.0 <= result.metrics["val/acc"] <= 1.0


@pytest.mark.parametrize("name", ["lra_text", "lra_retrieval", "lra_image"])
def test_the_conformance_kit_passes_with_data_present(name, tmp_path):
    from harness.testing import TaskChecks, run_checks

    folder = {"lra_text": lambda: make_imdb(tmp_path, {(s, p): [f"{s} {p} {i}" for i in range(3)]
                                                       for s in ("train", "test") for p in ("pos", "neg")}),
              "lra_retrieval": lambda: make_aan(tmp_path / "tsv", {s: [("1", f"{s}a", "b"), ("0", "c", f"{s}d")] * 3
                                                                   for s in ("train", "val", "test")}),
              "lra_image": lambda: make_cifar(tmp_path / "c", 3, np.random.default_rng(0)) and tmp_path / "c"}[name]()
    checks = type("Checks", (TaskChecks,), {"plugin": name, "params": {"data_dir": str(folder)}})
    outcomes = {o.check: o.status for o in run_checks(checks)}
    assert "FAIL" not in outcomes.values(), outcomes
    assert outcomes["seeds_differ"] == "exempt" and outcomes["vocabulary"] == "pass"
