"""`harness train --from-run RUN_ID`: a recorded run re-run from its MLflow record matches
exactly on CPU, and a recorded version that differs from the installed one is named first."""

from __future__ import annotations

from mlflow.tracking import MlflowClient
from text import flat

from harness.cli.main import main
from harness.run.pipeline import train


def test_a_rerun_from_the_record_matches_exactly_and_names_version_changes(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    first = train({"task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 32, "num_val": 8}},
                   "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2}},
                   "train": {"max_steps": 6, "batch_size": 8, "val_every": 3, "progress": False,
                             "num_threads": 1, "seed": 3},
                   "tracking": {"uri": uri}})
    client = MlflowClient(uri)
    client.set_tag(first.run_id, "harness.torch_version", "0.0.1")  # recorded under another torch
    assert main(["train", "--from-run", first.run_id, "--tracking-uri", uri]) == 0
    out = capsys.readouterr()
    assert "harness.torch_version was 0.0.1, now" in flat(out.err)
    assert "quality metrics match exactly" in out.out
    rerun = [r for r in client.search_runs([client.get_run(first.run_id).info.experiment_id])
             if r.data.tags.get("harness.rerun_of") == first.run_id]
    assert len(rerun) == 1
    assert rerun[0].data.metrics["val/loss"] == first.metrics["val/loss"]
    assert rerun[0].data.params["train.seed"] == "3"


def test_from_run_refuses_overrides_and_unknown_runs(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    assert main(["train", "--from-run", "abc", "--set", "train.lr=0.1", "--tracking-uri", uri]) == 2
    assert main(["train", "--from-run", "0123456789abcdef", "--tracking-uri", uri]) == 2
    err = flat(capsys.readouterr().err)
    assert "pass no config file" in err and "there is no run 0123456789abcdef" in err
