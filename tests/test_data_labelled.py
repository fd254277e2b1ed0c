"""Labelled files (issue 20): ``text_classification`` and ``seq2seq_pairs`` on small files
made here. Metrics against independent references (macro-F1 from a float64 confusion matrix,
chrF and BLEU from sacrebleu's own corpus scores), splits and caps, end-to-end training
with ``harness.train`` on tiny models (the logged metric equals the reference computed on the
trained model's own predictions), and the bad inputs: exit 2, one paragraph naming the file,
line and field, no traceback."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import sacrebleu
from text import one_paragraph

import harness
from harness.cli.main import main
from harness.errors import ConfigError
from harness.nn.decoding import greedy
from harness_plugins.tasks.seq2seq_pairs import text_metrics, text_statistics
from harness_plugins.tasks.text_classification import macro_f1

TINY_TRAIN = {"max_steps": 4, "batch_size": 8, "val_every": 4, "warmup_steps": 0, "lr": 3e-3,
              "accelerator": "cpu", "devices": 1, "num_threads": 1, "progress": False,
              "log_attention": False}
ENCODER = {"name": "transformer", "params": {"d_model": 32, "layers": 1, "heads": 2}}
ENCODER_DECODER = {"name": "encoder_decoder",
                   "params": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "heads": 2}}
WORDS = {"ham": ["toast", "eggs", "tea", "jam"], "spam": ["buy", "now", "cheap", "win"],
         "news": ["vote", "rain", "market", "city"]}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def reviews(n: int, seed: int = 0, labels: tuple[str, ...] = ("ham", "spam", "news")) -> list[dict[str, Any]]:
    """Texts whose words give their label away (learnable in a few steps)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = labels[i % len(labels)]
        words = [rng.choice(WORDS[label]) for _ in range(rng.randint(1, 3))]  # at most 24 bytes
        rows.append({"text": f"{' '.join(words)} #{i}", "label": label})
    return rows


def pairs(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Source words and their reversal, upper-cased."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        word = "".join(rng.choice("abcde") for _ in range(rng.randint(2, 5))) + str(i)
        out.append({"source": word, "target": word[::-1].upper()})
    return out


def classification(params: dict[str, Any], seed: int = 0) -> Any:
    return harness.create_task("text_classification", seed=seed, **params)


# -- metrics against independent references --------------------------------------------------
def f1_from_confusion(gold: np.ndarray, pred: np.ndarray, classes: int) -> float:
    """Macro-F1 in float64 from the confusion matrix, over the classes present in either."""
    cm = np.zeros((classes, classes), dtype=np.float64)
    np.add.at(cm, (gold, pred), 1.0)
    tp = np.diag(cm)
    fp, fn = cm.sum(axis=0) - tp, cm.sum(axis=1) - tp
    present = (cm.sum(axis=0) + cm.sum(axis=1)) > 0
    return float(np.mean(2 * tp[present] / (2 * tp[present] + fp[present] + fn[present])))


def test_macro_f1_of_a_hand_worked_example():
    # gold 0 0 1 1 2, predicted 0 1 1 1 0: F1 0.5, 0.8, 0.0 -> 1.3 / 3
    assert macro_f1([1, 2, 0], [2, 3, 0], [2, 2, 1]) == pytest.approx(1.3 / 3, abs=1e-15)


def test_macro_f1_summed_over_batches_equals_the_confusion_matrix_reference(tmp_path):
    """The task's per-class counts, summed batch by batch as validation does, give the
    float64 confusion-matrix macro-F1 (one class never occurs: it is left out, as sklearn)."""
    import torch

    labels = ("a", "b", "c", "d", "e")
    rows = [{"text": f"text {i}", "label": labels[i % 5]} for i in range(50)]
    task = classification({"train": str(write_jsonl(tmp_path / "t.jsonl", rows)), "val_fraction": 0.3})
    assert task.classes == labels
    rng = np.random.default_rng(0)
    n, classes = 203, len(labels)
    gold = rng.integers(0, classes - 1, n)  # class 4 never gold ...
    pred = np.where(rng.random(n) < 0.6, gold, rng.integers(0, classes - 1, n))  # ... nor predicted
    totals: dict[str, float] = {}
    for start in range(0, n, 16):
        g, p = gold[start: start + 16], pred[start: start + 16]
        logits = torch.nn.functional.one_hot(torch.as_tensor(p), classes).float()
        for key, value in task.statistics(None, {"targets": torch.as_tensor(g)}, None, logits).items():
            totals[key] = totals.get(key, 0.0) + value
    got = task.metrics_from_statistics(totals)["macro_f1"]
    assert got == pytest.approx(f1_from_confusion(gold, pred, classes), abs=1e-12)


def test_chrf_and_bleu_summed_over_batches_equal_sacrebleu_corpus_scores():
    rng = random.Random(1)
    refs = [" ".join("".join(rng.choice("abcdef") for _ in range(rng.randint(1, 6)))
                     for _ in range(rng.randint(1, 8))) for _ in range(37)]
    hyps = [r if rng.random() < 0.3 else "".join(c if rng.random() < 0.8 else "x" for c in r) for r in refs]
    hyps[3] = ""  # an empty output counts too
    totals: dict[str, float] = {}
    for start in range(0, len(refs), 5):
        for key, value in text_statistics(hyps[start: start + 5], refs[start: start + 5]).items():
            totals[key] = totals.get(key, 0.0) + value
    got = text_metrics(totals)
    assert got["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-9)
    assert got["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    assert got["exact_match"] == pytest.approx(sum(h == r for h, r in zip(hyps, refs, strict=True)) / len(refs))
    # the mean of per-batch scores is another number: summing statistics is what matters
    per_batch = np.mean([sacrebleu.corpus_chrf(hyps[s: s + 5], [refs[s: s + 5]]).score for s in range(0, 37, 5)])
    assert abs(per_batch - got["chrf"]) > 1e-6


# -- splits, labels, truncation ---------------------------------------------------------------
def test_labels_come_from_train_and_examples_are_truncated_to_the_length_asked(tmp_path):
    rows = reviews(60)
    rows[0]["text"] = "jam " * 100  # 400 bytes: truncated
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    val = write_jsonl(tmp_path / "val.jsonl", reviews(9, seed=1))
    with pytest.warns(UserWarning, match="1 of 60 train records were longer than 32 tokens"):
        task = classification({"train": str(train), "val": str(val), "length": 32, "eval_lengths": [64]})
    assert task.classes == ("ham", "news", "spam") and task.num_classes == 3
    assert len(task.examples("train", 32)) == 60 and len(task.examples("val", 32)) == 9
    first = task.examples("train", 32)[0]
    assert len(first["tokens"]) == 32 and len(task.examples("train", 64)[0]["tokens"]) == 64
    assert task.tokenizer.decode(first["tokens"]) == ("jam " * 100)[:32]  # bytes: one token a byte
    val_rows = reviews(9, seed=1)
    assert [e["label"] for e in task.examples("val", 32)] == [task.classes.index(r["label"]) for r in val_rows]
    assert [task.tokenizer.decode(e["tokens"]) for e in task.examples("val", 64)] == [r["text"] for r in val_rows]


def test_hash_splits_are_stable_disjoint_and_keep_duplicates_together(tmp_path):
    rows = reviews(300) + [{"text": "tea tea", "label": "ham"}] * 5
    train = str(write_jsonl(tmp_path / "all.jsonl", rows))
    a = classification({"train": train, "val_fraction": 0.2, "test_fraction": 0.1})
    b = classification({"train": train, "val_fraction": 0.2, "test_fraction": 0.1}, seed=9)

    def texts(task: Any, split: str) -> list[str]:
        return [task.tokenizer.decode(e["tokens"]) for e in task.examples(split, task.train_length)]

    splits = {s: texts(a, s) for s in ("train", "val", "test")}
    assert splits == {s: texts(b, s) for s in ("train", "val", "test")}  # any seed, same records
    assert sum(map(len, splits.values())) == 305
    assert not set(splits["train"]) & set(splits["val"]) and not set(splits["val"]) & set(splits["test"])
    assert 30 <= len(splits["val"]) <= 90 and 10 <= len(splits["test"]) <= 55
    assert sorted(s.count("tea tea") for s in splits.values()) == [0, 0, 5]  # copies share a split
    order = {r["text"]: i for i, r in enumerate(rows)}
    assert [order[t] for t in splits["train"]] == sorted(order[t] for t in splits["train"])  # file order


def test_a_cap_keeps_a_hash_sample_not_the_first_lines(tmp_path):
    rows = sorted(reviews(200), key=lambda r: r["label"])  # a file sorted by label
    train = str(write_jsonl(tmp_path / "sorted.jsonl", rows))
    full = classification({"train": train})
    capped = classification({"train": train, "num_train": 40})
    kept = [e["label"] for e in capped.examples("train", 128)]
    assert len(kept) == 40 and len(set(kept)) == 3  # the first 40 lines would all be 'ham'
    bigger = classification({"train": train, "num_train": 80})
    kept_rows = {tuple(e["tokens"]) for e in capped.examples("train", 128)}
    assert kept_rows <= {tuple(e["tokens"]) for e in bigger.examples("train", 128)}  # nested samples
    assert len(full.examples("train", 128)) > 80


def test_csv_records_with_numeric_labels(tmp_path):
    lines = ["id,text,label"] + [f"{i},{'good ' * (1 + i % 3)}film {i},{5 if i % 2 else 1}" for i in range(30)]
    (tmp_path / "r.csv").write_text("\n".join(lines) + "\n")
    task = classification({"train": str(tmp_path / "r.csv"), "val_fraction": 0.3})
    assert task.classes == ("1", "5")
    every = list(task.examples("train", 128)) + list(task.examples("val", 128))
    assert sorted(task.classes[e["label"]] for e in every) == sorted(str(5 if i % 2 else 1) for i in range(30))


def test_bytes_that_are_not_utf8_are_replaced_and_counted(tmp_path):
    path = write_jsonl(tmp_path / "latin1.jsonl", reviews(30))
    path.write_bytes(path.read_bytes().replace(b"tea", b"t\xe9a"))  # Latin-1, not UTF-8
    bad = path.read_bytes().count(b"\xe9")
    with pytest.warns(UserWarning, match=rf"replaced by U\+FFFD.*{bad} in .*latin1.jsonl"):
        task = classification({"train": str(path), "val_fraction": 0.3})
    texts = [task.tokenizer.decode(e["tokens"]) for s in ("train", "val") for e in task.examples(s, 128)]
    assert sum(t.count("t\ufffda") for t in texts) == bad > 0


def test_a_second_build_reuses_the_set_until_a_file_changes(tmp_path):
    import os

    path = write_jsonl(tmp_path / "t.jsonl", reviews(30))
    first = classification({"train": str(path), "val_fraction": 0.3})
    again = classification({"train": str(path), "val_fraction": 0.3}, seed=4)  # a study's next trial
    assert again.tokens is first.tokens and again.tokenizer is first.tokenizer
    other = classification({"train": str(path), "val_fraction": 0.4})  # another config: read again
    assert other.tokens is not first.tokens
    write_jsonl(path, reviews(31))
    os.utime(path, ns=(1, 1))  # even within one clock tick: the size changed
    changed = classification({"train": str(path), "val_fraction": 0.3})
    assert sum(map(len, changed.labels.values())) == 31


def test_seq2seq_pairs_examples_end_with_eos_and_share_one_tokenizer(tmp_path):
    from harness.plugin import EOS

    rows = pairs(40)
    task = harness.create_task("seq2seq_pairs", seed=0, train=str(write_jsonl(tmp_path / "p.jsonl", rows)),
                               tokenizer="chars", val_fraction=0.25)
    examples = list(task.examples("train", task.train_length)) + list(task.examples("val", task.train_length))
    assert len(examples) == 40
    for e in examples:
        assert e["tgt"][-1] == EOS
        source, target = task.text(e["src"]), task.text(e["tgt"])
        assert target == source[::-1].upper()


# -- training end to end ----------------------------------------------------------------------
class Predictions(L.Callback):
    """After every validation, the model's own predictions on the val split (the reference
    the logged metric must equal)."""

    def __init__(self, reference: Any) -> None:
        self.reference, self.value = reference, None

    def on_validation_epoch_end(self, trainer: Any, module: Any) -> None:
        self.value = self.reference(module.model, module.task, module.fmt)


def classification_reference(model: Any, task: Any, fmt: Any) -> float:
    import torch

    examples = list(task.examples("val", task.train_length))
    with torch.no_grad():
        batch = fmt.collate(examples, task.task_kind)
        pred = fmt.call(model, batch).argmax(-1).numpy()
    return f1_from_confusion(batch["targets"].numpy(), pred, task.num_classes)


def chrf_reference(model: Any, task: Any, fmt: Any) -> float:
    examples = list(task.examples("val", task.train_length))
    hyps = [task.text(h) for h in greedy(model, examples, fmt, max_len=max(len(e["tgt"]) for e in examples) + 4)]
    return float(sacrebleu.corpus_chrf(hyps, [[task.text(e["tgt"][:-1]) for e in examples]]).score)


@pytest.mark.slow
def test_text_classification_trains_and_logs_the_macro_f1_of_its_predictions(tmp_path, registry):
    train = write_jsonl(tmp_path / "train.jsonl", reviews(96))
    val = write_jsonl(tmp_path / "val.jsonl", reviews(30, seed=5))  # 4 batches of 8
    probe = Predictions(classification_reference)
    task = {"name": "text_classification",
            "params": {"train": str(train), "val": str(val), "length": 16, "eval_lengths": [32]}}
    result = harness.train({"task": task, "model": ENCODER, "train": TINY_TRAIN,
                            "tracking": {"experiment": "labelled"}}, registry=registry, callbacks=[probe])
    assert result.status == "FINISHED"
    m = result.metrics
    for key in ("val/acc", "val/macro_f1", "val/macro_f1_len16", "val/macro_f1_len32"):
        assert 0.0 <= m[key] <= 1.0, key
    assert m["val/macro_f1"] == pytest.approx(probe.value, rel=1e-6)  # Lightning logs float32


@pytest.mark.slow
@pytest.mark.parametrize("model", [ENCODER_DECODER, ENCODER], ids=["encoder_decoder", "decoder_only"])
def test_seq2seq_pairs_trains_and_logs_the_chrf_of_its_greedy_outputs(tmp_path, registry, model):
    train = write_jsonl(tmp_path / "train.jsonl", pairs(64))
    probe = Predictions(chrf_reference)
    task = {"name": "seq2seq_pairs", "params": {"train": str(train), "val_fraction": 0.3, "length": 8}}
    steps = {**TINY_TRAIN, "max_steps": 40, "val_every": 40, "lr": 1e-2}  # enough to emit some right characters
    result = harness.train({"task": task, "model": model, "train": steps,
                            "tracking": {"experiment": "labelled"}}, registry=registry, callbacks=[probe])
    m = result.metrics
    assert result.status == "FINISHED"
    assert 0.0 <= m["val/exact_match"] <= 1.0 and 0.0 <= m["val/bleu"] <= 100.0
    assert probe.value > 0, "the model emits no right character: the check below would be vacuous"
    assert m["val/chrf"] == pytest.approx(probe.value, rel=1e-6)  # Lightning logs float32


# -- bad input: exit 2, one paragraph, no traceback --------------------------------------------
def cli_error(capsys: Any, task: str, **params: Any) -> str:
    sets = [a for k, v in params.items() for a in ("--set", f"task.params.{k}={v}")]
    model = "encoder_decoder" if task == "seq2seq_pairs" else "transformer"
    code = main(["train", "--task", task, "--model", model, "--max-steps", "1", "--no-progress", *sets])
    err = capsys.readouterr().err
    assert code == 2, err
    return one_paragraph(err)


def test_an_unseen_val_label_names_its_file_and_line(tmp_path, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", reviews(12))
    val_rows = reviews(6, seed=1)
    val_rows[4]["label"] = "sports"
    val = write_jsonl(tmp_path / "val.jsonl", val_rows)
    err = cli_error(capsys, "text_classification", train=train, val=val)
    assert "val.jsonl, line 5" in err and "'sports'" in err and "'ham'" in err


def test_an_unseen_label_is_a_config_error_from_python_too(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", reviews(12))
    rows = reviews(6, seed=1)
    rows[0]["label"] = "other"
    with pytest.raises(ConfigError, match=r"test.jsonl, line 1.*'other'"):
        classification({"train": str(train), "test": str(write_jsonl(tmp_path / "test.jsonl", rows))})


@pytest.mark.parametrize("task", ["text_classification", "seq2seq_pairs"])
def test_a_missing_field_names_the_field_file_and_line(tmp_path, capsys, task):
    rows = reviews(8) if task == "text_classification" else pairs(8)
    rows[2] = {"body": "no text here"}
    err = cli_error(capsys, task, train=write_jsonl(tmp_path / "data.jsonl", rows))
    field = "text" if task == "text_classification" else "source"
    assert "data.jsonl" in err and "line 3" in err and f"'{field}'" in err


def test_a_line_that_is_not_json_names_file_and_line(tmp_path, capsys):
    path = write_jsonl(tmp_path / "broken.jsonl", reviews(5))
    path.write_text(path.read_text() + '{"text": "half a record\n')
    err = cli_error(capsys, "text_classification", train=path)
    assert "broken.jsonl" in err and "line 6" in err


def test_an_empty_file_is_refused(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    err = cli_error(capsys, "text_classification", train=tmp_path / "empty.jsonl")
    assert "empty.jsonl" in err


def test_an_empty_text_names_its_line(tmp_path, capsys):
    rows = reviews(6)
    rows[3]["text"] = "  "
    err = cli_error(capsys, "text_classification", train=write_jsonl(tmp_path / "t.jsonl", rows))
    assert "t.jsonl, line 4" in err and "'text'" in err


def test_a_tokenizer_that_does_not_load_is_named(tmp_path, capsys):
    (tmp_path / "tokenizer.json").write_text('{"model": "not a tokenizer"}')
    err = cli_error(capsys, "seq2seq_pairs", train=write_jsonl(tmp_path / "p.jsonl", pairs(8)),
                    tokenizer=tmp_path / "tokenizer.json")
    assert "tokenizer" in err and "tokenizer.json" in err


def test_a_single_label_and_a_missing_train_file_are_refused(tmp_path, capsys):
    err = cli_error(capsys, "text_classification", train=write_jsonl(tmp_path / "one.jsonl", reviews(6, labels=("ham",))))
    assert "at least two" in err and "label" in err
    err = cli_error(capsys, "text_classification")
    assert "task.params.train" in err
    err = cli_error(capsys, "text_classification", train=tmp_path / "nowhere.jsonl")
    assert "nowhere.jsonl" in err and "does not exist" in err


# -- studies ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("task", "metric"), [("text_classification", "macro_f1"), ("seq2seq_pairs", "chrf"),
                                              ("seq2seq_pairs", "exact_match")])
def test_a_study_maximizes_the_labelled_metrics_without_being_told(tmp_path, registry, task, metric):
    from harness.study.schema import parse_study_config
    from harness.study.space import validate

    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data/train.jsonl", reviews(60) if task == "text_classification" else pairs(60))

    model = {"name": "transformer", "params": {"layers": 1, "heads": 2, "d_model": 16}}
    config = parse_study_config({
        "name": "mine", "task": {"name": task, "params": {"train": "data/train.jsonl"}},
        "candidates": [{"name": "tf", "model": model}], "objective": {"metric": metric},
        "budget": {"trials": 1, "steps": 10}})
    assert config.objective.direction == "maximize"
    validate(config, registry)  # the study's candidates resolve against the task


@pytest.mark.slow
def test_the_build_benchmark_runs_at_its_smallest_size(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "labelled_build.py"
    done = subprocess.run([sys.executable, str(script), "--records", "300", "--tokenizers", "bytes",
                           "--out", str(tmp_path / "b.md")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    row = next(line for line in (tmp_path / "b.md").read_text().splitlines() if line.startswith("| 300 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "`bytes`" and float(cells[4]) > 0 and float(cells[5]) > 0  # tokens, peak RSS


def test_a_study_cannot_maximize_chrf_when_decoding_is_off(tmp_path, registry):
    """The metrics a task logs through metrics_from_statistics count for the objective check,
    and only while they are logged (decode_eval: false logs none of them)."""
    from harness.data.tasks import Task
    from harness.study.schema import parse_study_config
    from harness.study.space import logged_metrics, validate

    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data/train.jsonl", pairs(60))
    config = parse_study_config({
        "name": "mine", "task": {"name": "seq2seq_pairs",
                                 "params": {"train": "data/train.jsonl", "decode_eval": False}},
        "candidates": [{"name": "tf", "model": {"name": "transformer", "params": {"layers": 1, "heads": 2, "d_model": 16}}}],
        "objective": {"metric": "chrf"}, "budget": {"trials": 1, "steps": 10}})
    with pytest.raises(ConfigError, match="does not log 'chrf'"):
        validate(config, registry)

    class Undeclared(Task):
        def metrics_from_statistics(self, totals):
            return {"mystery": 1.0}

    assert logged_metrics(Undeclared.__new__(Undeclared)) is None  # nothing to check against
