"""Faults of the third probe (issue 33) on checkpoints and `--resume`: a newest checkpoint
that is a foreign file (a pickle `weights_only` refuses, another program's `torch.save`
dict, a folder, a link to /dev/zero, a sidecar that is a folder) is skipped with the
harness's own warning line and the newest valid one used, the run left resumable when none
is; one resume of a run at a time; `--resume` with flags names the field that changed;
SIGUSR1's message names the run."""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import threading

import lightning as L
import pytest
import torch
from mlflow.tracking import MlflowClient
from text import flat

from harness.cli.main import main
from harness.errors import Interrupted
from harness.run import checkpoint
from harness.run.pipeline import train
from harness.run.resume import resume_lock

TASK = {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 32, "num_val": 8}}
MODEL = {"name": "transformer", "params": {"d_model": 16, "layers": 1, "heads": 2}}
TRAIN = {"max_steps": 8, "batch_size": 8, "val_every": 4, "progress": False, "num_threads": 1,
         "checkpoint_every": 2, "lr": 1e-2}


class StopAt(L.Callback):
    def __init__(self, k: int) -> None:
        self.k = k

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.k:
            raise Interrupted()


@pytest.fixture(scope="module")
def _killed_once(tmp_path_factory):
    """A store holding a run stopped by Ctrl-C after step 5 (checkpoints at 2 and 4), made
    once; each test gets its own copy."""
    where = tmp_path_factory.mktemp("killed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARNESS_HOME", str(where / "home"))
        uri = f"sqlite:///{where / 'm.db'}"
        with pytest.raises(Interrupted):
            train({"task": TASK, "model": MODEL, "train": TRAIN, "tracking": {"uri": uri}},
                  callbacks=[StopAt(5)])
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("harness").experiment_id])
    assert run.info.status == "KILLED"
    return where, run.info.run_id


@pytest.fixture
def killed(_killed_once, tmp_path, monkeypatch):
    """(store URI, id) of a copy of the killed run (see ``_killed_once``)."""
    where, run_id = _killed_once
    shutil.copy(where / "m.db", tmp_path / "m.db")
    shutil.copytree(where / "home", tmp_path / "home", symlinks=True)
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    return f"sqlite:///{tmp_path / 'm.db'}", run_id


def _with_sidecar(path, data: bytes) -> None:
    path.write_bytes(data)
    path.with_name(path.name + ".sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {path.name}\n")


class Foreign:  # a class weights_only refuses to unpickle
    pass


def plant_foreign(root) -> list[str]:
    """Newer step files that are not this harness's checkpoints; their names."""
    _with_sidecar(checkpoint.step_path(root, 100), pickle.dumps(Foreign()))
    import io

    buffer = io.BytesIO()
    torch.save({"weights": torch.zeros(2)}, buffer)  # another program's plain torch.save
    _with_sidecar(checkpoint.step_path(root, 101), buffer.getvalue())
    checkpoint.step_path(root, 102).mkdir()  # a folder
    os.symlink("/dev/zero", checkpoint.step_path(root, 103))  # would hash for ever
    _with_sidecar(checkpoint.step_path(root, 104), b"x")
    side = checkpoint.step_path(root, 104).with_name("step-000000104.ckpt.sha256")
    side.unlink()
    side.mkdir()  # the sidecar a folder
    return [checkpoint.step_path(root, s).name for s in range(100, 105)]


def test_foreign_newest_checkpoints_are_skipped_and_the_run_stays_resumable(killed, capsys):
    uri, run_id = killed
    root = checkpoint.folder(run_id)
    names = plant_foreign(root)
    valid = [p for _, p in checkpoint.step_files(root) if p.name not in names]
    aside = root.parent / "aside"
    aside.mkdir()
    for p in valid:  # first with no valid checkpoint at all: refused, the run untouched
        shutil.move(p, aside / p.name)
        shutil.move(p.with_name(p.name + ".sha256"), aside / (p.name + ".sha256"))
    code = main(["train", "--resume", run_id, "--tracking-uri", uri])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "no usable checkpoint" in flat(err)
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "KILLED", "a refused resume changes nothing"
    for p in aside.iterdir():
        shutil.move(p, root / p.name)
    timer = threading.Timer(120, os._exit, (99,))  # a link to /dev/zero must never be hashed
    timer.start()
    try:
        code = main(["train", "--resume", run_id, "--tracking-uri", uri])
    finally:
        timer.cancel()
    err = capsys.readouterr().err
    assert code == 0, err
    assert "UserWarning" not in err and "warnings.warn" not in err
    text = flat(err)
    for name in names:
        assert name in text
    assert (root / "unusable-step-000000100.ckpt").is_file(), "set aside, not deleted"
    assert (root / "unusable-step-000000102.ckpt").is_dir()
    assert "using step-000000004.ckpt instead" in text and "not a checkpoint this harness wrote" in text
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["harness.resumed_from_step"] == "4"
    for key in run.data.metrics:  # each point once, epoch and cost/params included (issue 40)
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), (key, sorted(steps))
    assert [m.step for m in client.get_metric_history(run_id, "cost/params")] == [0]


def test_a_second_resume_of_a_run_is_refused_while_one_holds_it(killed, capsys):
    uri, run_id = killed
    with resume_lock(run_id):
        code = main(["train", "--resume", run_id, "--tracking-uri", uri])
    err = flat(capsys.readouterr().err)
    assert code == 2 and "being resumed already" in err and str(os.getpid()) in err
    assert MlflowClient(uri).get_run(run_id).info.status == "KILLED"


def test_a_refused_resume_changes_nothing_on_disk(killed, tmp_path, capsys):
    """A changed config, a missing checkpoint folder: refused, and the run's folder is as it
    was (no lock file left behind, no folder made)."""
    uri, run_id = killed
    root = checkpoint.folder(run_id)
    before = sorted(p.name for p in root.iterdir())
    assert main(["train", "--resume", run_id, "--tracking-uri", uri, "--set", "train.lr=0.5"]) == 2
    assert "train.lr was 0.01, now 0.5" in " ".join(capsys.readouterr().err.split())
    assert sorted(p.name for p in root.iterdir()) == before
    shutil.move(root, tmp_path / "moved")
    assert main(["train", "--resume", run_id, "--tracking-uri", uri]) == 2
    assert "has no usable checkpoint" in " ".join(capsys.readouterr().err.split())
    assert not root.exists(), "a refused resume makes no folder"
    assert MlflowClient(uri).get_run(run_id).info.status == "KILLED"


def test_resume_with_flags_names_the_changed_field_and_accepts_free_ones(killed, capsys):
    uri, run_id = killed
    for flags, field in ((["--set", "train.lr=0.5"], "train.lr was 0.01, now 0.5"),
                         (["--max-steps", "12"], "train.max_steps was 8, now 12")):
        code = main(["train", "--resume", run_id, "--tracking-uri", uri, *flags])
        err = flat(capsys.readouterr().err)
        assert code == 2 and field in err and "required field is missing" not in err
    code = main(["train", "--resume", run_id, "--tracking-uri", uri, "--set", "train.max_time_s=600"])
    assert code == 0, capsys.readouterr().err
    assert MlflowClient(uri).get_run(run_id).info.status == "FINISHED"


def test_sigusr1_s_message_names_the_run(monkeypatch, capsys):
    import harness.cli.main as cli

    def preempted(_args):
        raise checkpoint.Preempted(6, "0123abcd")

    monkeypatch.setattr(cli, "_train", preempted)
    assert main(["train", "--task", "copy", "--model", "transformer"]) == checkpoint.PREEMPTED_EXIT
    err = flat(capsys.readouterr().err)
    assert "harness train --resume 0123abcd" in err and "at step 6" in err
    monkeypatch.setattr(cli, "_train", lambda _args: (_ for _ in ()).throw(checkpoint.Preempted()))
    assert main(["train", "--task", "copy", "--model", "transformer"]) == checkpoint.PREEMPTED_EXIT
    err = flat(capsys.readouterr().err)  # a study worker signalled between trials: no run to name
    assert "nothing was checkpointed" in err and "--resume" not in err and "step" not in err
    stopper = checkpoint.Checkpointing(checkpoint.folder("r1"), checkpoint.Schedule(), keep=1, best=False,
                                       metric="val/loss", mode="min", meta={"run_id": "r1"}, datamodule=None)
    stopper.stop_at = 3
    with pytest.raises(checkpoint.Preempted) as raised:
        stopper.on_train_batch_start(None, None, None, 0)
    assert raised.value.run_id == "r1" and raised.value.step == 3
