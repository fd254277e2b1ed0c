"""``harness probe`` and ``harness.probe``: a trained run probed zero-shot with a long-context
task, end to end on real runs and a real MLflow store.

A corpus run (bytes) is probed in English through its own tokenizer and the cells land on its
MLflow run with the heatmap; a symbol run probed with its own task must score exactly what its
own validation scored on the same examples (the probe scores as validation does); a length
the model cannot read whole (learned positions, ``--max-length``) is refused with exit 2 and
nothing logged, never cut; a probe whose vocabulary is not the run's is refused.
"""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

import harness
from harness.cli.main import main
from harness.errors import ConfigError
from harness.plugin import prepare_corpus
from harness.run.pipeline import train

TEXT = "The quick brown fox jumps over the lazy dog. A stitch in time saves nine.\n" * 40


def corpus_run(root, uri, position):
    return train({
        "task": {"name": "corpus_lm", "params": {"path": str(root / "corpus"), "length": 64, "eval_tokens": 512}},
        "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2},
                  "attention": {"name": "multi_head"}, "position": {"name": position}},
        "train": {"max_steps": 2, "batch_size": 4, "val_every": 2, "progress": False, "num_threads": 1},
        "tracking": {"uri": uri}}).run_id


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    src = root / "text.txt"
    src.write_text("\n\n".join(f"Part {i}. " + TEXT for i in range(30)))
    prepare_corpus([src], root / "corpus", tokenizer="bytes", progress=False, split_fractions=(0.6, 0.2, 0.2))
    uri = f"sqlite:///{root / 'm.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARNESS_HOME", str(root / "home"))
        rope, learned = corpus_run(root, uri, "rope"), corpus_run(root, uri, "learned")
        needle = train({
            "task": {"name": "needle", "params": {"length": 24, "eval_lengths": [48], "depths": [0, 50, 100],
                                                  "num_train": 64, "num_val": 12, "keys": 8, "values": 8, "words": 8}},
            "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2},
                      "position": {"name": "none"}},
            "train": {"max_steps": 4, "batch_size": 8, "val_every": 4, "progress": False, "num_threads": 1},
            "tracking": {"uri": uri}})
    return {"root": root, "uri": uri, "rope": rope, "learned": learned, "needle": needle}


@pytest.fixture
def home(runs, monkeypatch):
    monkeypatch.setenv("HARNESS_HOME", str(runs["root"] / "home"))
    return runs


def probe_metrics(runs, run_id):
    return {k: v for k, v in MlflowClient(runs["uri"]).get_run(run_id).data.metrics.items() if k.startswith("probe/")}


def test_the_cli_probes_a_corpus_run_through_its_tokenizer_and_logs_every_cell(home, capsys):
    run = home["rope"]
    assert main(["probe", run, "--lengths", "200,320", "--depths", "0,100", "--num", "4",
                 "--tracking-uri", home["uri"]]) == 0
    out = capsys.readouterr().out
    assert "probe needle: task needle, val/recall (4 examples per length, split test)" in out
    assert "lengths 200, 320 are past the 64 tokens the run trained on" in " ".join(out.split())
    logged = probe_metrics(home, run)
    for n in (200, 320):
        for d in (0, 100):
            assert 0.0 <= logged[f"probe/needle/recall_depth{d}_len{n}"] <= 1.0
        assert f"probe/needle/acc_len{n}" in logged
    cells = [logged[f"probe/needle/recall_depth{d}_len{n}"] for n in (200, 320) for d in (0, 100)]
    assert logged["probe/needle/recall_grid"] == pytest.approx(sum(cells) / 4)
    client = MlflowClient(home["uri"])
    names = {a.path for a in client.list_artifacts(run, "probe/needle")}
    assert names == {"probe/needle/heatmap.png", "probe/needle/grid.json"}
    with open(client.download_artifacts(run, "probe/needle/grid.json", str(home["root"]))) as f:
        grid = json.load(f)
    assert grid["params"]["path"].endswith("corpus") and grid["params"]["haystack"] == "corpus"
    assert len(grid["cells"]) == 4


def test_the_python_api_returns_the_grid_without_logging(home):
    result = harness.probe(home["rope"], "variable_tracking", lengths=[256], depths=[0, 50], num=4,
                           params={"num_hops": 2}, log=False, tracking_uri=home["uri"])
    assert set(result.cells) == {(256, 0), (256, 50)} and not result.logged
    assert set(result.by_length[256]) >= {"recall", "recall_depth0", "acc", "exact", "loss"}
    assert result.params["num_hops"] == 2 and result.params["path"].endswith("corpus")
    assert not any(k.startswith("probe/variable_tracking") for k in probe_metrics(home, home["rope"]))


def test_a_probe_scores_what_the_runs_own_validation_scored(home):
    """The same examples (task seed, split, length, depths), the same score: the cells of a
    probe of a symbol run equal its own logged validation cells."""
    run = home["needle"]
    result = harness.probe(run.run_id, "needle", lengths=[24, 48], depths=[0, 50, 100], num=12, split="val",
                           log=False, tracking_uri=home["uri"])
    for (n, d), value in result.cells.items():
        assert value == pytest.approx(run.metrics[f"val/recall_depth{d}_len{n}"]), (n, d)
    assert result.by_length[48]["acc"] == pytest.approx(run.metrics["val/acc_len48"])


def test_a_context_the_model_cannot_read_whole_is_refused_never_cut(home, capsys):
    before = probe_metrics(home, home["learned"])
    assert main(["probe", home["learned"], "--lengths", "64,200", "--num", "2", "--depths", "0,100",
                 "--tracking-uri", home["uri"]]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "cannot read a context of 200 tokens whole" in err and "never cuts a context" in err
    assert "Probe the lengths it reads (64)" in err
    assert probe_metrics(home, home["learned"]) == before  # nothing logged
    assert main(["probe", home["rope"], "--lengths", "200,300", "--max-length", "256", "--num", "2", "--depths", "0,100",
                 "--tracking-uri", home["uri"], "--no-log"]) == 2
    assert "--max-length is 256" in " ".join(capsys.readouterr().err.split())


def test_a_probe_the_run_cannot_read_is_refused(home, capsys):
    with pytest.raises(ConfigError, match="symbol task 'needle', whose vocabulary has no words for 'common_words'"):
        harness.probe(home["needle"].run_id, "common_words", lengths=[48], log=False, tracking_uri=home["uri"])
    with pytest.raises(ConfigError, match="vocabulary .* is not the run's"):
        harness.probe(home["needle"].run_id, "needle", lengths=[48], params={"keys": 9}, log=False,
                      tracking_uri=home["uri"])
    assert main(["probe", home["rope"], "--lengths", "64", "--num", "2", "--depths", "0,100", "--no-log",
                 "--tracking-uri", home["uri"]]) == 2
    assert "the probe at length 64" in " ".join(capsys.readouterr().err.split())
    assert main(["probe", home["rope"], "--lengths", "2x", "--no-log"]) == 2


def refused(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return " ".join(err.split())


def test_bad_probe_options_are_refused_before_any_work(home, capsys):
    """Issue 49: every option checked up front, one paragraph, exit 2, nothing logged."""
    run, uri = home["needle"].run_id, home["uri"]
    before = probe_metrics(home, run)
    cases = [
        (["--lengths", "48", "--set", "length=64"], "--set length: a probe sizes its data itself"),
        (["--lengths", "48", "--set", "num_val=2"], "--num num_val"),
        (["--lengths", "48", "--name", ""], "--name '': 1 to 64 letters"),
        (["--lengths", "48", "--threshold", "2"], "--threshold 2: recall is a fraction"),
        (["--lengths", "48", "--threshold", "-1"], "--threshold -1"),
        (["--lengths", "48", "--threshold", "nan"], "--threshold nan"),
        (["--lengths", "100000000"], "hold 10,000,000,000 tokens"),  # would die of MemoryError
        (["--lengths", "48", "--num", "1000000000"], "Lower --num"),  # would run for ever
        (["--lengths", "48", "--num", "2", "--depths", "0,50,100"], "num_val 2 is fewer than the 3 depths"),
        (["--lengths", "48", "--num", "2"], "(--lengths sets length and eval_lengths, --num num_val"),
    ]
    for args, said in cases:
        assert main(["probe", run, *args, "--tracking-uri", uri]) == 2, args
        assert said in refused(capsys), (args, said)
    assert probe_metrics(home, run) == before


def test_a_length_whose_logits_alone_cannot_fit_is_refused(home, capsys, monkeypatch):
    from harness.run import resources

    monkeypatch.setattr(resources, "available_bytes", lambda device: 1 << 20)  # a 1 MiB machine
    assert main(["probe", home["needle"].run_id, "--lengths", "4000", "--num", "3", "--depths", "0,50,100",
                 "--tracking-uri", home["uri"], "--no-log"]) == 2
    text = refused(capsys)
    assert "--lengths 4,000: one batch of 3 examples' logits alone needs" in text and "--no-log" not in text


def test_probing_twice_under_one_name_is_refused_and_the_first_kept(home, capsys):
    run, uri = home["rope"], home["uri"]
    args = ["probe", run, "--lengths", "200", "--depths", "0,100", "--num", "2", "--name", "twice",
            "--tracking-uri", uri]
    assert main(args) == 0
    capsys.readouterr()
    first = {k: v for k, v in probe_metrics(home, run).items() if k.startswith("probe/twice/")}
    history = MlflowClient(uri).get_metric_history(run, "probe/twice/recall_len200")
    assert main(args) == 2
    text = refused(capsys)
    assert f"--name twice: run {run} already holds a probe named 'twice'" in text and "--name twice-2" in text
    assert {k: v for k, v in probe_metrics(home, run).items() if k.startswith("probe/twice/")} == first
    assert len(MlflowClient(uri).get_metric_history(run, "probe/twice/recall_len200")) == len(history) == 1


def test_a_run_that_did_not_finish_is_probed_with_a_note(home, capsys):
    run, client = home["needle"].run_id, MlflowClient(home["uri"])
    client.update_run(run, status="FAILED")
    try:
        assert main(["probe", run, "--lengths", "48", "--num", "3", "--depths", "0,50,100", "--name", "failed-run",
                     "--tracking-uri", home["uri"]]) == 0
    finally:
        client.update_run(run, status="FINISHED")
    out = " ".join(capsys.readouterr().out.split())
    assert f"note: run {run} is FAILED (its training failed): the probe scores the weights it last saved" in out


def test_a_refusal_names_the_run_once(home):
    with pytest.raises(ConfigError) as caught:
        harness.probe(home["needle"].run_id, "common_words", lengths=[48], log=False, tracking_uri=home["uri"])
    assert f"run {home['needle'].run_id} was trained on" in str(caught.value)
    assert "run run" not in str(caught.value)
