"""A run's result is only ever computed with what the run trained on (issue 40).

A character-level corpus run is trained, then its corpus folder is prepared again from the same
documents without their newlines (every character after the newline moves down one id), or
with new characters (the vocabulary grows). The run keeps its tokenizer beside its weights, so
``harness eval`` scores exactly what it scored before; a run recorded before it kept one (its
``tokenizer.json`` and identity removed, as older runs are), a run that has only checkpoints,
``--resume`` and ``--from-run`` are refused with one paragraph naming both digests and the fix,
exit 2, nothing changed. A plain ``harness export`` folder carries the tokenizer and scores the
same without the corpus. Characters outside the vocabulary are counted, warned about and
logged, so that two choices read as the same ``<unk>`` are visible.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
from collections.abc import Iterator

import pytest
from mlflow.tracking import MlflowClient

import harness
from harness.cli.main import main
from harness.data.tokenizers import CharTokenizer
from harness.errors import Interrupted
from harness.evaluation.text import TokenizerCodec
from harness.run import checkpoint, identity
from harness.run.identity import DataChanged
from harness.run.pipeline import train
from harness.run.resume import LOCK_FILE
from harness.run.trained import load

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "saw", "its", "hat", "near", "old", "red", "barn"]
L = 16


def documents(seed: int = 0, count: int = 160) -> list[str]:
    """Documents of a few lines each (so that a newline is in the vocabulary)."""
    rng = random.Random(seed)
    return ["\n".join(" ".join(rng.choice(WORDS) for _ in range(6)) for _ in range(3)) for _ in range(count)]


def write(path, docs: list[str]) -> None:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))


def one_paragraph(err: str) -> str:
    assert "Traceback" not in err and "IndexError" not in err, err
    return " ".join(err.split())


def run_config(folder, uri: str, **train_changes) -> dict:
    return {"task": {"name": "corpus_lm", "params": {"path": str(folder), "length": L, "eval_tokens": 64}},
            "model": {"name": "transformer", "params": {"d_model": 32, "layers": 1, "heads": 2}},
            "train": {"max_steps": 24, "batch_size": 8, "val_every": 12, "progress": False, "num_threads": 1,
                      "log_attention": False, "lr": 3e-3, **train_changes},
            "tracking": {"uri": uri}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(root, run id, store URI) of a chars corpus run with final weights and checkpoints."""
    root = tmp_path_factory.mktemp("identity")
    write(root / "docs.jsonl", documents())
    uri = f"sqlite:///{root / 'm.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARNESS_HOME", str(root / "home"))
        harness.prepare_corpus([root / "docs.jsonl"], root / "corpus", tokenizer="chars", progress=False)
        result = train(run_config(root / "corpus", uri, checkpoint_every=12))
    shutil.copytree(root / "corpus", root / "corpus.kept")
    (root / "tasks").mkdir()
    (root / "tasks/text.jsonl").write_text(json.dumps({"text": "the old cat sat on a red mat\nnear the barn"}) + "\n")
    (root / "tasks/choice.jsonl").write_text(json.dumps({"query": "the cat sat on the", "gold": 0,
                                                         "choices": [" XYZW", " QRST", " mat"]}) + "\n")
    for name, body in (("text_bpb", 'output_type: loglikelihood_rolling\ndoc_to_text: ""\n'
                                    'doc_to_target: "{{text}}"\nmetric_list:\n  - metric: bits_per_byte\n'),
                       ("choice", 'output_type: multiple_choice\ndoc_to_text: "{{query}}"\n'
                                  'doc_to_choice: "{{choices}}"\ndoc_to_target: gold\n'
                                  'metric_list:\n  - metric: acc\n')):
        data = root / "tasks" / ("text.jsonl" if name == "text_bpb" else "choice.jsonl")
        (root / "tasks" / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
            f"test_split: test\n{body}")
    return root, result.run_id, uri


@pytest.fixture
def store(trained, tmp_path, monkeypatch):
    """(root, run id, store URI): a copy of the trained run's store (each test changes it
    freely); the corpus stays where the run read it (``changed``/``away`` put it back)."""
    root, run_id, _ = trained
    shutil.copytree(root / "home", tmp_path / "home")
    shutil.copy(root / "m.db", tmp_path / "m.db")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return root, run_id, f"sqlite:///{tmp_path / 'm.db'}"


@contextlib.contextmanager
def changed(root, docs: list[str]) -> Iterator[None]:
    """The run's corpus folder prepared again from ``docs`` (then put back as it was)."""
    write(root / "other.jsonl", docs)
    harness.prepare_corpus([root / "other.jsonl"], root / "corpus", tokenizer="chars", progress=False)
    try:
        yield
    finally:
        shutil.rmtree(root / "corpus")
        shutil.copytree(root / "corpus.kept", root / "corpus")


@contextlib.contextmanager
def away(root) -> Iterator[None]:
    """The run's corpus folder gone (then put back)."""
    (root / "corpus").rename(root / "corpus.away")
    try:
        yield
    finally:
        (root / "corpus.away").rename(root / "corpus")


def as_recorded_before(folder) -> None:
    """A run's folder as runs wrote it before they kept their tokenizer and identity."""
    (folder / "tokenizer.json").unlink()
    meta = json.loads((folder / "model.json").read_text())
    del meta["data"]
    meta["info"] = {k: meta["info"][k] for k in ("format", "vocab_size", "max_length", "num_classes")}
    (folder / "model.json").write_text(json.dumps(meta))


def bpb(capsys, ref: str, tasks) -> float:
    capsys.readouterr()
    assert main(["eval", ref, "--tasks", "text_bpb", "--include-path", str(tasks), "--no-log"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("eval/text_bpb/bits_per_byte"))
    return float(line.split()[-1])


def test_the_run_keeps_its_tokenizer_and_identity_beside_its_weights(trained):
    root, run_id, uri = trained
    folder = root / "home/checkpoints" / run_id
    meta = json.loads((folder / "model.json").read_text())
    corpus_tokenizer = (root / "corpus/tokenizer.json").read_text()
    assert (folder / "tokenizer.json").read_text() == corpus_tokenizer
    assert meta["data"]["tokenizer_sha256"] == identity.digest(corpus_tokenizer)
    manifest = (root / "corpus/manifest.json").read_bytes()
    import hashlib

    assert meta["data"]["data_sha256"] == hashlib.sha256(manifest).hexdigest()
    tags = MlflowClient(uri).get_run(run_id).data.tags
    assert identity.from_tags(tags) == meta["data"]  # the same identity recorded when it started
    assert meta["data"]["data_sha256"][:12] in tags["harness.data"]


def test_eval_after_the_corpus_was_prepared_again_reads_with_the_runs_own_tokenizer(store, capsys):
    root, run_id, _ = store
    before = bpb(capsys, run_id, root / "tasks")
    # the case: the same documents without their newlines, prepared where the run's was
    with changed(root, [d.replace("\n", " ") for d in documents()]):
        assert bpb(capsys, run_id, root / "tasks") == before
        as_recorded_before(checkpoint.folder(run_id))  # a run recorded without its tokenizer
        capsys.readouterr()
        code = main(["eval", run_id, "--tasks", "text_bpb", "--include-path", str(root / "tasks"), "--no-log"])
        err = one_paragraph(capsys.readouterr().err)
        assert code == 2 and "vocabulary changed since the run" in err and "vocabulary sha256" in err
        assert "Put back the folder the run trained on" in err
        assert main(["generate", run_id, "--prompt", "the cat"]) == 2
        assert "changed since the run" in one_paragraph(capsys.readouterr().err)
        assert main(["export", run_id, "--out", "out"]) == 2
        assert "changed since the run" in one_paragraph(capsys.readouterr().err)
    assert bpb(capsys, run_id, root / "tasks") == before  # its own corpus back: it reads it again


def test_a_grown_vocabulary_is_refused_not_an_index_error(store, capsys):
    root, run_id, _ = store
    as_recorded_before(checkpoint.folder(run_id))
    with changed(root, [*documents(), "QXZJ KVWY " * 20]):  # new characters: ids past the model's
        code = main(["eval", run_id, "--tasks", "text_bpb", "--include-path", str(root / "tasks"), "--no-log"])
        assert code == 2 and "changed since the run" in one_paragraph(capsys.readouterr().err)
    # a tokenizer whose ids pass the model's vocabulary is named as such wherever it comes from
    codec = TokenizerCodec(CharTokenizer("abcdefgh"), vocab_size=8)
    with pytest.raises(DataChanged, match="gives token id 13, and the model knows 8 ids"):
        codec.encode("hh")


def test_a_run_with_only_checkpoints_is_refused_when_its_corpus_changed(store):
    root, run_id, _ = store
    folder = checkpoint.folder(run_id)
    for name in ("model.safetensors", "model.json", "tokenizer.json"):
        (folder / name).unlink()
    assert load(run_id).identity["tokenizer_sha256"]  # unchanged: it loads
    with changed(root, [d.replace("\n", " ") for d in documents()]), \
            pytest.raises(DataChanged, match="tokenizer and vocabulary changed since the run"):
        harness.load_model(run_id)


def test_a_plain_export_carries_the_tokenizer_and_scores_without_the_corpus(store, tmp_path, capsys):
    root, run_id, _ = store
    before = bpb(capsys, run_id, root / "tasks")
    assert main(["export", run_id, "--out", str(tmp_path / "shared")]) == 0
    assert "tokenizer.json" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == \
        ["model.json", "model.safetensors", "tokenizer.json"]
    with away(root):
        assert bpb(capsys, str(tmp_path / "shared"), root / "tasks") == before
        # a tokenizer.json that is not the run's is refused, not read
        (tmp_path / "shared/tokenizer.json").write_text(CharTokenizer("abc").to_json())
        assert main(["eval", str(tmp_path / "shared"), "--tasks", "text_bpb", "--include-path",
                     str(root / "tasks"), "--no-log"]) == 2
        assert "is not the tokenizer the run trained with" in one_paragraph(capsys.readouterr().err)


def test_unknown_characters_are_counted_warned_about_and_logged(store, tmp_path, capsys):
    root, run_id, uri = store
    capsys.readouterr()
    assert main(["eval", run_id, "--tasks", "choice", "--include-path", str(root / "tasks"),
                 "--tracking-uri", uri, "--out", str(tmp_path / "r.json")]) == 0
    captured = capsys.readouterr()
    warned = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1, captured.err
    text = one_paragraph(warned[0])
    for char in "XYZWQRST":
        assert repr(char) in text
    assert "read as <unk>" in text and "tokenizer chars" in text
    run = MlflowClient(uri).get_run(run_id)
    # each choice's characters are read once per request: X Y Z W Q R S T, none of the context
    assert run.data.metrics["eval/unknown_chars"] == 8
    assert "read as <unk>" in run.data.tags["harness.eval_unknown"]
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["harness_unknown_characters"]["distinct"] == dict.fromkeys("XYZWQRST", 1)
    capsys.readouterr()
    assert main(["generate", run_id, "--prompt", "the QQ cat", "--max-new-tokens", "2"]) == 0
    assert "warning: --prompt: 2 characters in 1 text are not in the run's vocabulary" in \
        " ".join(capsys.readouterr().err.split())


class StopAt:
    def __init__(self, k: int) -> None:
        import lightning as L

        class _Stop(L.Callback):
            def on_train_batch_end(self, trainer, *args):
                if trainer.global_step == k:
                    raise Interrupted()

        self.callback = _Stop()


def test_resume_and_rerun_refuse_a_corpus_prepared_again_and_change_nothing(store, capsys):
    root, _, uri = store
    cfg = run_config(root / "corpus", uri, checkpoint_every=6)
    cfg["tracking"]["experiment"] = "cut"  # the copied store's own experiment (artifacts under it)
    with pytest.raises(Interrupted):
        train(cfg, callbacks=[StopAt(8).callback])
    client = MlflowClient(uri)
    (cut,) = client.search_runs([client.get_experiment_by_name("cut").experiment_id])
    run_id = cut.info.run_id
    folder = checkpoint.folder(run_id)
    files = sorted(p.name for p in folder.iterdir())
    with changed(root, [d.replace("\n", " ") for d in documents()]):
        capsys.readouterr()
        assert main(["train", "--resume", run_id, "--tracking-uri", uri]) == 2
        err = one_paragraph(capsys.readouterr().err)
        assert f"run {run_id} cannot resume" in err and "changed since the run" in err
        assert sorted(p.name for p in folder.iterdir()) == files and LOCK_FILE not in files
        after = client.get_run(run_id)
        assert after.info.status == "KILLED" and after.data.metrics == cut.data.metrics
        runs = client.search_runs([client.get_experiment_by_name("harness").experiment_id])
        (finished,) = [r for r in runs if r.info.status == "FINISHED"]
        assert main(["train", "--from-run", finished.info.run_id, "--tracking-uri", uri]) == 2
        err = one_paragraph(capsys.readouterr().err)
        assert "cannot be re-run as it was" in err and "manifest sha256" in err
        assert len(client.search_runs([client.get_experiment_by_name("harness").experiment_id])) == len(runs)
