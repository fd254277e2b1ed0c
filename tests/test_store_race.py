"""Processes that open the same empty store at the same moment: the schema is created once and
every one of them works (``harness.store.lock``). Real processes, released together by a
file once each has imported everything, on the default SQLite stores of a new project."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

RACER = r"""
import sys, time
from pathlib import Path
import torch, mlflow, optuna, lightning, sqlalchemy  # imported before the start line
from mlflow.store.tracking import sqlalchemy_store  # noqa: F401
from harness.cli.main import main

folder, me = Path(sys.argv[1]), sys.argv[2]
(folder / f"ready-{me}").touch()
while not (folder / "go").exists():
    time.sleep(0.001)
sys.exit(main(sys.argv[3:]))
"""

TRAIN = ["train", "--task", "copy", "--model", "transformer", "--attention", "multi_head",
         "--position", "sinusoidal", "--set", "task.params.length=4", "--set", "task.params.num_train=32",
         "--set", "task.params.num_val=8", "--set", "model.params.d_model=16", "--set", "model.params.layers=1",
         "--set", "train.max_steps=2", "--set", "train.val_every=2", "--set", "train.batch_size=8",
         "--set", "train.num_threads=1", "--set", "train.log_attention=false", "--no-progress"]


def _race(folder: Path, home: Path, argv: list[str], racers: int) -> list[tuple[int, str]]:
    folder.mkdir(parents=True)
    env = dict(os.environ, HARNESS_HOME=str(home), OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(folder), str(i), *argv], env=env,
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i in range(racers)]
    try:
        deadline = time.monotonic() + 180
        while len(list(folder.glob("ready-*"))) < racers:
            assert all(p.poll() is None for p in procs), [p.communicate()[0] for p in procs]
            assert time.monotonic() < deadline, "the racers did not get ready"
            time.sleep(0.05)
        (folder / "go").touch()
        return [(p.wait(timeout=300), p.communicate()[0]) for p in procs]
    finally:
        for p in procs:
            p.kill()


def test_train_commands_started_together_on_a_new_project_all_succeed(tmp_path):
    for round_ in range(2):
        home = tmp_path / f"home{round_}"
        results = _race(tmp_path / f"race{round_}", home, TRAIN, racers=3)
        for code, out in results:
            assert code == 0 and "Traceback" not in out, out
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        assert sorted(r.info.status for r in runs) == ["FINISHED"] * 3
