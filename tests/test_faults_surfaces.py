"""Faults of the fifth probe (issue 49) outside the probe and the benchmarks: a needle task
whose validation examples cannot cover its depths, an evaluation length whose logits cannot
fit (refused before training, not after it as a FAILED run), and ``harness check --coord``'s
--out checked before minutes of training."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient
from text import one_paragraph

from harness.cli.main import main
from harness.errors import ConfigError

NEEDLE = ["train", "--task", "needle", "--model", "transformer", "--set", "model.params.d_model=16",
          "--set", "model.params.layers=1", "--set", "task.params.length=24", "--set", "task.params.num_train=16",
          "--set", "task.params.keys=8", "--set", "task.params.values=8", "--set", "task.params.words=8",
          "--max-steps", "2", "--no-progress"]


@pytest.mark.parametrize("task", ["needle", "variable_tracking"])
def test_fewer_validation_examples_than_depths_is_refused(task, registry):
    from harness.params import resolve

    spec = registry.get("task", task)
    with pytest.raises((ConfigError, ValueError)) as caught:
        resolve(spec.config, {"num_val": 3, "depths": [0, 25, 50, 75, 100]}, "task.params")
    text = " ".join(str(caught.value).split())
    assert "num_val 3 is fewer than the 5 depths" in text and "depths [75, 100] would get no example" in text
    resolve(spec.config, {"num_val": 5, "depths": [0, 25, 50, 75, 100]}, "task.params")  # one each: fine


def test_a_train_with_fewer_validation_examples_than_depths_exits_2(tmp_path, capsys):
    code = main([*NEEDLE, "--set", "task.params.num_val=3", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    assert code == 2 and "num_val 3 is fewer than the 5 depths" in one_paragraph(capsys.readouterr().err)


def test_an_evaluation_length_whose_logits_cannot_fit_is_refused_before_training(tmp_path, capsys, monkeypatch):
    """A machine of 8 GiB (whatever this one has): the data of 5 examples at 20 million tokens
    fits (0.8 GB), one evaluation batch's logits (some 30 ids x 4 bytes x 2 a token) do not."""
    from harness.run import resources

    monkeypatch.setattr(resources, "available_bytes", lambda device: 8 * resources.GiB)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    code = main([*NEEDLE, "--set", "task.params.num_val=5", "--set", "task.params.eval_lengths=[20000000]",
                 "--tracking-uri", uri])
    line = one_paragraph(capsys.readouterr().err)
    assert code == 1, line
    assert "one evaluation batch's logits" in line and "5 examples per pass, length 2" in line
    assert "Lower the longest task.params.eval_lengths" in line and "Nothing was trained or recorded" in line
    runs = MlflowClient(uri).search_runs([e.experiment_id for e in MlflowClient(uri).search_experiments()])
    assert not [r for r in runs if r.info.status != "FAILED" or "train/loss" in r.data.metrics]


def test_coord_out_that_cannot_be_written_is_refused_before_training(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("mine\n")
    for out, said in ((a_file, f"--out {a_file}: {a_file} is a file, not a folder"),
                      ("/proc/coord", "--out /proc/coord: nothing can be written in /proc")):
        assert main(["check", "--coord", "gla", "--widths", "32,64,128", "--steps", "2", "--seeds", "1",
                     "--out", str(out)]) == 2
        captured = capsys.readouterr()
        assert said in one_paragraph(captured.err) and "mixer gla" not in captured.out
    assert a_file.read_text() == "mine\n"
