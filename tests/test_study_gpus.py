"""``harness study run --workers N`` on a machine with GPUs: each worker its own
(``CUDA_VISIBLE_DEVICES`` per worker process). No GPU runs here: the one function that asks
the hardware (:func:`harness.runtime.devices.gpu_count`) is replaced, and what each real
worker process receives is read back from it."""

from __future__ import annotations

import os
import sys

import pytest
from text import flat

from harness.cli.main import main
from harness.runtime import devices
from harness.study import spawn


@pytest.fixture
def gpus(monkeypatch):
    """A machine with ``n`` GPUs and no CUDA_VISIBLE_DEVICES (call the fixture's value)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def machine(n: int) -> None:
        monkeypatch.setattr(devices, "gpu_count", lambda: n)
    return machine


def test_each_worker_process_sees_its_own_gpu(gpus, harness_home):
    gpus(4)
    envs, line = spawn.gpu_plan(4, 1)
    assert line == "4 workers on GPUs 0,1,2,3"
    assert envs[0] == {"CUDA_VISIBLE_DEVICES": "0"}  # the command's own process
    probe = [sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"]
    with spawn.extra_workers(3, probe, "gpus", own=envs[1:]) as procs:
        pass  # leaving waits for them
    assert [p.returncode for p in procs] == [0, 0, 0]
    seen = [spawn.log_path("gpus", i).read_text().strip() for i in (1, 2, 3)]
    assert seen == ["1", "2", "3"]


def test_several_gpus_per_worker_come_from_the_pool_the_process_was_given(gpus, monkeypatch):
    gpus(4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6,GPU-a1b2,2,7")  # CUDA can use the first 4
    envs, line = spawn.gpu_plan(2, 2)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["4,6", "GPU-a1b2,2"]
    assert line == "2 workers on GPUs 4,6 | GPU-a1b2,2 (2 each)"


def test_no_gpu_or_no_assignment_leaves_the_workers_environment_alone(gpus):
    gpus(0)
    assert spawn.gpu_plan(3, 1) == ([{}, {}, {}], None)
    gpus(2)
    assert spawn.gpu_plan(3, 0) == ([{}, {}, {}], None)  # --gpus-per-worker 0: they share


def test_more_workers_than_gpus_is_refused_before_anything_starts(gpus, tmp_path, capsys):
    gpus(2)
    code = main(["study", "run", str(tmp_path / "never-read.yaml"), "--workers", "3"])
    err = flat(capsys.readouterr().err)  # the paragraph is wrapped
    assert code == 2
    assert "--workers 3 with 1 GPU(s) per worker needs 3 GPUs; this machine shows 2 (0, 1)" in err
    assert "Use --workers 2 --gpus-per-worker 1" in err and "Traceback" not in err
    gpus(3)
    assert main(["study", "run", str(tmp_path / "x.yaml"), "--workers", "2", "--gpus-per-worker", "2"]) == 2
    assert "Use --workers 1 --gpus-per-worker 2" in flat(capsys.readouterr().err)


def test_the_command_itself_is_the_first_worker_and_says_so_first(gpus, monkeypatch, tmp_path, capsys):
    gpus(2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    main(["study", "run", str(tmp_path / "missing.yaml"), "--workers", "2"])  # fails on the file
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("2 workers on GPUs 3,5")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"  # set here before CUDA could start
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    main(["study", "run", str(tmp_path / "missing.yaml")])  # one worker: nothing assigned
    assert capsys.readouterr().out.splitlines()[0].startswith("reading ")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,5"


def test_a_study_with_more_devices_per_trial_than_each_worker_has_is_refused(gpus):
    import argparse

    from harness.errors import ConfigError
    from harness.study.cli import _check_gpus_per_worker

    gpus(4)
    args = argparse.Namespace(gpus_per_worker=1, gpu_env=spawn.gpu_plan(2, 1)[0])
    with pytest.raises(ConfigError, match="--gpus-per-worker 2"):
        _check_gpus_per_worker(args, {"devices": 2, "strategy": "ddp_spawn"})
    args = argparse.Namespace(gpus_per_worker=2, gpu_env=spawn.gpu_plan(2, 2)[0])
    _check_gpus_per_worker(args, {"devices": 2, "strategy": "ddp_spawn"})  # fits


def test_the_real_count_on_this_machine_does_not_start_cuda():
    import torch

    assert devices.gpu_count() == (0 if not torch.cuda.is_available() else torch.cuda.device_count())
