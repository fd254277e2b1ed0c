"""Studies resume trials instead of restarting them: a real ``harness study run`` worker is
SIGKILLed (or sent SIGUSR1, Slurm's warning before a time limit) in the middle of a trial;
the next worker continues that trial from its checkpoint in the same MLflow run. The run's
training curve has one point per step and equals, value for value, the curve of the same
configuration trained without interruption; the trial's reports stay; nothing is left
RUNNING."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState
from test_study import tiny_study, trials
from text import flat

from harness.cli.main import main
from harness.run import checkpoint
from harness.run.checkpoint import PREEMPTED_EXIT
from harness.run.pipeline import train

#: A test acts at step 15-20 of a trial that must still be training then: the steps after
#: (seconds here) keep it under way through a slow poll on a loaded machine.
STEPS = 600


def _study(tmp: Path, name: str, every: int, steps: int = STEPS) -> tuple[Path, list[str]]:
    path = tiny_study(tmp, name, budget={"trials": 1, "steps": steps}, confirm={"seeds": 1},
                      objective={"metric": "acc"}, pruner={"name": "none"},
                      task={"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 64, "num_val": 16}},
                      train={"batch_size": 8, "val_every": 20, "warmup_steps": 2, "num_threads": 1,
                             "checkpoint_every": every, "log_attention": False})
    args = ["--storage", f"sqlite:///{tmp / 'o.db'}", "--tracking-uri", f"sqlite:///{tmp / 'm.db'}"]
    assert main(["study", "create", str(path), *args]) == 0
    return path, args


def _start(path: Path, args: list[str], home: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness.cli", "study", "run", str(path), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HARNESS_HOME": str(home)})


def _wait_for_checkpoint(storage: str, name: str, proc: subprocess.Popen, min_step: int) -> Any:
    """The running tuning trial once its run has a checkpoint at ``min_step`` or later."""
    deadline = time.time() + 300
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        for t in trials(storage, name, "tune", "mha"):
            run = t.user_attrs.get("harness.mlflow_run_id")
            if t.state == TrialState.RUNNING and run:
                files = checkpoint.step_files(checkpoint.folder(run))
                if files and files[-1][0] >= min_step:
                    return t
        time.sleep(0.2)
    raise AssertionError("no checkpoint in time")


def _finish_and_check(tmp: Path, path: Path, args: list[str], name: str, victim: Any) -> None:
    storage, uri = args[1], args[3]
    assert main(["study", "run", str(path), *args]) == 0  # the next worker
    tune = sorted(trials(storage, name, "tune", "mha"), key=lambda t: t.number)
    assert [t.state for t in tune] == [TrialState.FAIL, TrialState.COMPLETE]
    failed, retry = tune
    run_id = victim.user_attrs["harness.mlflow_run_id"]
    # the reports made before the worker stopped stay (the pruner's decisions stand on them)
    assert failed.intermediate_values.items() <= retry.intermediate_values.items()
    assert sorted(retry.intermediate_values) == list(range(20, STEPS + 1, 20))
    assert retry.system_attrs["failed_trial"] == victim.number
    assert retry.user_attrs["harness.mlflow_run_id"] == run_id  # the same MLflow run, continued
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and int(run.data.tags["harness.resumed_from_step"]) > 0
    assert run.data.tags["harness.trial"].endswith(f"#{retry.number}")
    curve = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train/loss"))
    logged = [s for s, _ in curve]  # one continuous curve: a point every log_every_n_steps, once
    assert logged == list(range(4, STEPS, 5))
    exp = run.info.experiment_id
    assert not client.search_runs([exp], "attributes.status = 'RUNNING'")  # nothing left RUNNING
    # the same configuration trained without interruption gives the same curve, exactly
    config = dict(retry.user_attrs["harness.run_config"])
    config["tracking"] = {"uri": f"sqlite:///{tmp / 'straight.db'}"}
    straight = train(config)
    reference = sorted((m.step, m.value) for m in
                       MlflowClient(config["tracking"]["uri"]).get_metric_history(straight.run_id, "train/loss"))
    assert curve == reference
    assert retry.values[0] == straight.metrics["val/acc"]


@pytest.mark.slow
def test_a_sigkilled_worker_s_trial_is_continued_from_its_checkpoint(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HARNESS_HOME", str(home))
    path, args = _study(tmp_path, "killed", every=5)
    proc = _start(path, args, home)
    try:
        victim = _wait_for_checkpoint(args[1], "killed", proc, min_step=15)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    time.sleep(2.5)  # the study's grace_s: its heartbeat is stale now
    _finish_and_check(tmp_path, path, args, "killed", victim)


@pytest.mark.slow
def test_sigusr1_checkpoints_the_trial_exits_75_and_the_next_worker_resumes_it(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HARNESS_HOME", str(home))
    # only SIGUSR1 writes a checkpoint; the signal is sent once step 20 is reported (STEPS)
    path, args = _study(tmp_path, "preempted", every=100000)
    proc = _start(path, args, home)
    try:
        deadline = time.time() + 300
        victim = None
        while victim is None and time.time() < deadline:  # training is under way
            assert proc.poll() is None, proc.communicate()
            for t in trials(args[1], "preempted", "tune", "mha"):
                if t.state == TrialState.RUNNING and 20 in t.intermediate_values:
                    victim = t
            time.sleep(0.05)
        assert victim is not None
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == PREEMPTED_EXIT, err
    assert "Traceback" not in err and "experimental" not in err, err  # Optuna's warning: the harness's own choice
    run_id = victim.user_attrs["harness.mlflow_run_id"]
    # what the message means: this run, checkpointed at the step of the checkpoint on disk, and
    # the command that continues it (not its wording)
    said = re.search(rf"SIGUSR1: checkpointed run {run_id} at step (\d+)", flat(err))
    assert said is not None, err
    assert checkpoint.latest(checkpoint.folder(run_id)) is not None
    assert int(said[1]) == checkpoint.step_files(checkpoint.folder(run_id))[-1][0]
    assert f"harness train --resume {run_id}" in flat(err) and "harness study run" in flat(err)
    run = MlflowClient(args[3]).get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["harness.preempted"] == "true"
    (failed,) = [t for t in trials(args[1], "preempted", "tune", "mha") if t.number == victim.number]
    assert failed.state == TrialState.FAIL and "preempted" in failed.user_attrs["harness.failure"]
    assert 20 in failed.intermediate_values  # reported before SIGUSR1
    _finish_and_check(tmp_path, path, args, "preempted", victim)


@pytest.mark.slow
def test_the_slurm_script_passes_sigusr1_on_and_requeues_the_job(tmp_path, monkeypatch):
    """examples/slurm_study.sh as Slurm runs it (the batch script gets SIGUSR1 before the time
    limit): the worker checkpoints and exits 75, and the script requeues its job (``scontrol``
    is a stand-in that records its arguments)."""
    home = tmp_path / "home"
    monkeypatch.setenv("HARNESS_HOME", str(home))
    path, args = _study(tmp_path, "slurm", every=100000, steps=100000)  # stopped by the signal
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'scontrol.log'}\n")
    (fake / "scontrol").chmod(0o755)
    script = Path(__file__).resolve().parent.parent / "examples" / "slurm_study.sh"
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HARNESS_HOME": str(home), "SLURM_JOB_ID": "4242",
           "HARNESS_STORAGE": args[1], "MLFLOW_TRACKING_URI": args[3],
           "PATH": f"{fake}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.Popen(["bash", str(script), str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline, run = time.time() + 300, None
        while run is None and time.time() < deadline:
            assert proc.poll() is None, proc.communicate()
            for t in trials(args[1], "slurm", "tune", "mha"):
                rid = t.user_attrs.get("harness.mlflow_run_id")
                if rid and len(MlflowClient(args[3]).get_metric_history(rid, "train/loss")) >= 3:
                    run = rid
            time.sleep(0.2)
        assert run is not None
        proc.send_signal(signal.SIGUSR1)  # to the batch script, as --signal=B:USR1 does
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == PREEMPTED_EXIT, out
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    assert checkpoint.latest(checkpoint.folder(run)) is not None
    assert MlflowClient(args[3]).get_run(run).data.tags["harness.preempted"] == "true"
