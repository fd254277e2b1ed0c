"""Faults injected for real: a plugin that raises inside a trial, an allocation that fails,
a model too large for the machine, Ctrl-C (SIGINT) sent to real `harness` processes, and
path-escaping names. Each asserts the exit code, the one-paragraph message and what MLflow
and Optuna recorded afterwards."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState
from test_study import record, tiny_study, trials
from text import flat, one_paragraph

from harness.cli.main import main

FAULTY = str(Path(__file__).with_name("faulty_plugin.py"))
TINY_TRAIN = ["--task", "copy", "--model", "transformer", "--set", "model.params.d_model=16",
              "--set", "model.params.layers=1", "--set", "train.batch_size=4",
              "--set", "task.params.num_train=16", "--set", "task.params.num_val=8",
              "--no-progress", "--plugin", FAULTY]


def _runs(uri: str) -> list[Any]:
    client = MlflowClient(uri)
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def _cli(*args: str) -> tuple[int, str]:
    """The real command in its own process (the exit code and stderr a user sees)."""
    done = subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    return done.returncode, done.stderr


def test_plugin_exception_fails_the_run_naming_the_plugin(tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    code, err = _cli("train", *TINY_TRAIN, "--set", "model.mixer.name=boom", "--max-steps", "3",
                     "--tracking-uri", uri)
    err = one_paragraph(err)
    assert code == 1
    assert "the mixer 'boom'" in err and "faulty_plugin.py:" in err and "ZeroDivisionError" in err
    (run,) = _runs(uri)
    assert run.info.status == "FAILED"
    assert "mixer 'boom'" in run.data.tags["harness.failure"]


def test_out_of_memory_in_training_fails_cleanly_and_releases_the_model(tmp_path):
    from harness.errors import OutOfMemory
    from harness.run.pipeline import train

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    cfg = {"task": {"name": "copy", "params": {"num_train": 16, "num_val": 8}},
           "model": {"name": "transformer", "params": {"d_model": 16, "layers": 1}, "mixer": {"name": "hog"}},
           "train": {"max_steps": 3, "batch_size": 4, "progress": False},
           "tracking": {"uri": uri}, "plugins": [FAULTY]}
    with pytest.raises(OutOfMemory) as caught:
        train(cfg)
    err = flat(str(caught.value))
    assert "out of memory" in err and "mixer hog" in err and "train.batch_size=4" in err
    (run,) = _runs(uri)
    assert run.info.status == "FAILED" and "out of memory" in run.data.tags["harness.failure"]
    (plugin,) = [m for name, m in sys.modules.items() if name.startswith("harness_local_faulty_plugin_")]
    gc.collect()
    assert not [m for m in plugin.LIVE if type(m).__name__ == "HogMixer"]  # the model was released


def test_a_gpu_out_of_memory_error_is_recognised_and_the_gpu_cache_emptied(monkeypatch):
    """The GPU side of the path above, on CPU: CUDA's allocator raises ``torch.OutOfMemoryError``
    (a RuntimeError whose text is CUDA's), which is named out of memory; releasing a failed
    run's memory on a CUDA device gives the allocator's cached blocks back. No GPU here: the
    driver call is replaced by a recorder (the one line that needs a GPU)."""
    import torch

    from harness.run.failure import is_out_of_memory, release_memory

    exc = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.10 GiB "
                                 "total capacity; 70.12 GiB already allocated)")
    assert is_out_of_memory(exc) and not is_out_of_memory(RuntimeError("shape mismatch"))
    emptied: list[bool] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    release_memory(torch.device("cpu"))
    assert emptied == []
    release_memory(torch.device("cuda", 0))
    assert emptied == [True]


def test_a_model_larger_than_memory_is_refused_before_training(tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    code, err = _cli("train", "--task", "copy", "--model", "transformer", "--set", "model.params.d_model=65536",
                     "--set", "model.params.layers=8", "--max-steps", "3", "--no-progress",
                     "--tracking-uri", uri)
    err = one_paragraph(err)
    assert code == 1
    assert "GiB" in err and "parameters" in err and "Nothing was trained or recorded" in err
    assert not (tmp_path / "m.db").exists() or not _runs(uri)


@pytest.mark.slow
def test_a_failing_trial_is_recorded_failed_and_the_study_goes_on(tmp_path, capsys):
    import copy

    from test_study import CANDIDATE

    boom = copy.deepcopy(CANDIDATE)
    boom["name"] = "boom"
    del boom["model"]["attention"]
    boom["model"]["mixer"] = {"name": "boom", "search_declared": False}
    path = tiny_study(tmp_path, "faulty", candidates=[CANDIDATE, boom], plugins=[FAULTY],
                      budget={"trials": 1, "steps": 4}, confirm={"seeds": 1})
    storage, uri = f"sqlite:///{tmp_path / 'o.db'}", f"sqlite:///{tmp_path / 'm.db'}"
    assert main(["study", "run", str(path), "--storage", storage, "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "FAILED: run" in out and "the mixer 'boom'" in out and "Traceback" not in out
    (failed,) = trials(storage, "faulty", "tune", "boom")
    assert failed.state == TrialState.FAIL and "the mixer 'boom'" in failed.user_attrs["harness.failure"]
    assert [t.state for t in trials(storage, "faulty", "tune", "mha")] == [TrialState.COMPLETE]


# -- Ctrl-C -------------------------------------------------------------------------------------

def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})


def _wait_for_training(uri: str, proc: subprocess.Popen, timeout: float = 240) -> Any:
    """The first MLflow run once it has logged a training loss (fit is under way)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            for run in _runs(uri):
                if MlflowClient(uri).get_metric_history(run.info.run_id, "train/loss"):
                    return run
        except Exception:  # the store is still being created
            pass
        time.sleep(0.3)
    raise AssertionError("the run did not start training in time")


def _interrupt_training(uri: str, presses: int, gap_s: float = 0.05) -> tuple[int, str, Any]:
    """Start a long `harness train`, press Ctrl-C ``presses`` times (``gap_s`` apart) once it
    trains: its exit code, stderr and MLflow run."""
    proc = _start(["train", *TINY_TRAIN, "--max-steps", "100000", "--set", "train.val_every=4",
                   "--tracking-uri", uri])
    try:
        run = _wait_for_training(uri, proc)
        for press in range(presses):
            if press:
                time.sleep(gap_s)  # two signals before Python's handler runs count as one
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, err, run


@pytest.mark.slow
def test_ctrl_c_on_train_exits_130_saying_what_was_kept(tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    code, err, run = _interrupt_training(uri, presses=1)
    assert code == 130, err
    assert "Traceback" not in err
    assert f"Kept: MLflow run {run.info.run_id}, ended KILLED" in flat(err)
    assert "Run the same command again" in flat(err)
    ended = MlflowClient(uri).get_run(run.info.run_id)
    assert ended.info.status == "KILLED" and ended.data.tags["harness.interrupted"] == "true"


@pytest.mark.slow
def test_a_second_ctrl_c_exits_at_once(tmp_path):
    """The second press must land while the first one's cleanup runs; when the cleanup won
    the race (the first press's message alone: the late press was ignored, exit 130 all the
    same) or the two presses came before Python ran the handler (they count as one), try again
    with another gap: the cleanup takes tens of milliseconds on an idle machine."""
    for attempt, gap in enumerate((0.005, 0.01, 0.02, 0.035, 0.05, 0.08, 0.005, 0.02)):
        code, err, _ = _interrupt_training(f"sqlite:///{tmp_path / f'm{attempt}.db'}", presses=2,
                                           gap_s=gap)
        # 130 either way: at once from the handler, or after the cleanup (a press after it
        # is ignored, never the default action that kills by SIGINT)
        assert code == 130, err
        assert "Traceback" not in err
        if "interrupted again: exiting at once" in flat(err):
            assert "Kept:" not in err
            return
        assert "Kept:" in err
    raise AssertionError("the second Ctrl-C never arrived during the cleanup")


@pytest.mark.slow
def test_ctrl_c_on_a_study_worker_exits_130_with_the_resume_command(tmp_path):
    path = tiny_study(tmp_path, "killed", budget={"trials": 1, "steps": 100000},
                      train={"batch_size": 8, "val_every": 50, "num_threads": 1}, confirm={"seeds": 1})
    storage, uri = f"sqlite:///{tmp_path / 'o.db'}", f"sqlite:///{tmp_path / 'm.db'}"
    args = ["--storage", storage, "--tracking-uri", uri]
    assert main(["study", "create", str(path), *args]) == 0
    proc = _start(["study", "run", str(path), *args])
    try:
        deadline = time.time() + 240
        victim = None
        while victim is None and time.time() < deadline:
            assert proc.poll() is None, proc.communicate()
            victim = next((t for t in trials(storage, "killed", "tune", "mha")
                           if t.state == TrialState.RUNNING and "harness.mlflow_run_id" in t.user_attrs), None)
            time.sleep(0.3)
        assert victim is not None
        time.sleep(2)  # into fit
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    text = flat(err)
    assert "Traceback" not in err and f"Resume with `harness study run {path} --storage {storage} --tracking-uri {uri}`" in text
    (trial,) = [t for t in trials(storage, "killed", "tune", "mha") if t.number == victim.number]
    assert trial.state == TrialState.FAIL
    run = MlflowClient(uri).get_run(victim.user_attrs["harness.mlflow_run_id"])
    assert run.info.status == "KILLED"
    assert record(storage, "killed")["parent_run_id"]


# -- names that become paths ----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../../x", "/etc/x", "a/../../b", "..\\..\\x", ".hidden", "x\x00y"])
def test_path_escaping_experiment_names_are_refused(name, capsys):
    code = main(["train", "--task", "copy", "--model", "transformer", "--set",
                 f"tracking.experiment={name!r}" if "\x00" not in name else "tracking.experiment=x\\0y",
                 "--max-steps", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "tracking.experiment" in err and "Traceback" not in err


@pytest.mark.parametrize("name", ["../../../x", "/abs/x", "..", ".", "a/../../b", "..\\x", "~root", "x\ny"])
def test_no_name_makes_a_folder_outside_the_store(tmp_path, name):
    from harness.store.tracking import inside, safe_folder

    path = inside(tmp_path, name)
    assert path.parent == tmp_path.resolve() and path.name == safe_folder(name)
    assert "/" not in path.name and "\\" not in path.name and not path.name.startswith(".")
    assert safe_folder(name) != safe_folder(name + "_")  # distinct names stay distinct
