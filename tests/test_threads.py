"""CPU thread policy (harness.runtime.threads): study workers on one machine count each other through
a per-machine folder, and a run in a worker with ``train.num_threads`` unset takes usable
cores ÷ live local workers; a run outside a worker keeps torch's default; the config wins."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.config import parse_run_config
from harness.run.build import build
from harness.run.plan import plan
from harness.runtime import threads

RUN = {"task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 16, "num_val": 8}},
       "model": {"name": "transformer", "params": {"layers": 1, "heads": 2, "d_model": 8},
                 "attention": {"name": "multi_head"}, "position": {"name": "sinusoidal"}},
       "train": {"max_steps": 1, "progress": False}}
WORKER = "import sys, time; from pathlib import Path; from harness.runtime.threads import register_worker; " \
         "register_worker(Path(sys.argv[1])); print('ready', flush=True); time.sleep(60)"


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HARNESS_WORKERS_DIR", str(tmp_path / "workers"))
    return tmp_path / "workers"


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def start_workers(n: int, folder: Path) -> list[subprocess.Popen[str]]:
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(folder)], stdout=subprocess.PIPE, text=True)
             for _ in range(n)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return procs


def test_workers_count_each_other_and_dead_ones_drop_out(folder: Path) -> None:
    assert threads.local_workers(folder) == 0
    procs = start_workers(2, folder)
    try:
        assert threads.local_workers(folder) == 2
        procs[0].kill()
        procs[0].wait()
        assert threads.local_workers(folder) == 1
        assert sorted(p.name for p in folder.iterdir()) == [str(procs[1].pid)]  # the dead one removed
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_run_in_a_worker_splits_the_usable_cores(folder: Path, registry) -> None:
    cores = len(os.sched_getaffinity(0))
    p = plan(parse_run_config(copy.deepcopy(RUN)), registry)
    assert threads.worker_threads() is None  # not a worker
    torch.set_num_threads(1)
    unregister = threads.register_worker()
    procs = start_workers(2, folder)
    try:
        build(p)
        assert torch.get_num_threads() == max(1, cores // 3)
        for proc in procs:
            proc.kill()
            proc.wait()
        build(p)  # the next trial sees one worker: all cores
        assert torch.get_num_threads() == cores
        configured = copy.deepcopy(RUN)
        configured["train"]["num_threads"] = 1
        build(plan(parse_run_config(configured), registry))
        assert torch.get_num_threads() == 1  # the config wins
    finally:
        unregister()
        for proc in procs:
            proc.kill()
            proc.wait()
    assert threads.worker_threads() is None and not list(folder.iterdir())


def test_passive_wait_unless_the_user_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    threads.passive_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    threads.passive_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_study_run_sets_the_policy_before_torch_loads(tmp_path: Path) -> None:
    """``harness study run`` sets the policy first thing (here on a study file that is missing,
    in a child process whose environment has no policy)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = ("import os, harness.study.cli as c, argparse\n"
            "try: c.cmd_study_run(argparse.Namespace(file='missing.yaml', study_name=None, profile=None,"
            " format='md', storage=None, tracking_uri=None, report=False, out=None))\n"
            "except BaseException: pass\n"
            "print(os.environ.get('OMP_WAIT_POLICY'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["PASSIVE"], out.stderr


def test_a_run_never_starts_more_threads_than_cores_and_gives_torch_its_setting_back(tmp_path: Path) -> None:
    """``train.num_threads: 4096`` on a 2-core machine once left about 8,000 idle OpenMP threads
    in the caller's process for good (every thread torch starts stays alive: the default test
    run grew to 4,100 threads, past a container's pids limit). The run uses the usable cores,
    says so in one warning, and hands torch back the count it had; in a fresh process, so the
    threads counted are this run's."""
    code = f"""
import os, sys, torch, harness
from harness.runtime.threads import usable_cores
torch.set_num_threads(1)
result = harness.train({{"task": {{"name": "copy", "params": {{"length": 6, "num_train": 16, "num_val": 4}}}},
    "model": {{"name": "lstm", "params": {{"width": 8}}}},
    "train": {{"max_steps": 2, "batch_size": 4, "num_threads": 4096, "progress": False, "val_every": 2}},
    "tracking": {{"uri": "sqlite:///{tmp_path}/m.db"}}}})
print("THREADS", len(os.listdir("/proc/self/task")), usable_cores(), torch.get_num_threads())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("THREADS"))
    count, cores, after = (int(v) for v in line.split()[1:])
    assert after == 1  # the caller's setting, given back
    assert count < 4 * cores + 64, line  # OpenMP's pool of at most the cores, not 4,096
    warning = " ".join(done.stderr.split())
    assert f"train.num_threads (4096) is more than the {cores} usable cores: the run uses {cores}" in warning
