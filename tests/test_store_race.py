"""Processes that open the same empty store at the same moment: the schema is created once and
every one of them works (``harness.store.lock``). Real processes, released together by a
file once each has imported everything, on the default SQLite stores of a new project."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
    return _race_programs(folder, [(RACER, argv)] * racers, HARNESS_HOME=str(home))


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


# -- another program creating the same store (issue 40) ------------------------------------------
# The harness's lock orders harness processes only: a plain `mlflow ui`, a notebook's
# MlflowClient or optuna-dashboard creates the schema without it. Racing one of those used to
# kill `harness train` with `table ... already exists` / `duplicate column name` (and could
# leave the store half-migrated for good); the harness now publishes a new store whole and
# waits for one another program is creating (harness.store.creating). Both sides must succeed.
FOREIGN = r"""
import sys, time
from pathlib import Path
from mlflow.tracking import MlflowClient
from mlflow.store.tracking import sqlalchemy_store  # noqa: F401
from optuna.storages import RDBStorage

folder, me, mlflow_uri, optuna_url = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
(folder / f"ready-{me}").touch()
while not (folder / "go").exists():
    time.sleep(0.001)
if mlflow_uri != "-":
    MlflowClient(mlflow_uri).search_experiments()
if optuna_url != "-":
    RDBStorage(optuna_url)
print("foreign ok")
"""

OPENER = r"""
import sys, time
from pathlib import Path
from mlflow.store.tracking import sqlalchemy_store  # noqa: F401
from optuna.storages import RDBStorage  # noqa: F401
from harness.store.tracking import Tracker
from harness.study.storage import open_storage

folder, me, mlflow_uri, optuna_url = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
(folder / f"ready-{me}").touch()
while not (folder / "go").exists():
    time.sleep(0.001)
Tracker(mlflow_uri).experiment_id("raced")
open_storage(optuna_url)
print("harness ok")
"""


def _race_programs(folder: Path, programs: list[tuple[str, list[str]]], **env: str) -> list[tuple[int, str]]:
    """Run each (script, argv) in its own process, released together by a file once all are ready."""
    folder.mkdir(parents=True)
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1", **env)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(folder), str(i), *argv], env=env,
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i, (script, argv) in enumerate(programs)]
    try:
        deadline = time.monotonic() + 180
        while len(list(folder.glob("ready-*"))) < len(procs):
            assert all(p.poll() is None for p in procs), [p.communicate()[0] for p in procs]
            assert time.monotonic() < deadline, "the racers did not get ready"
            time.sleep(0.02)
        (folder / "go").touch()
        return [(p.wait(timeout=300), p.communicate()[0]) for p in procs]
    finally:
        for p in procs:
            p.kill()


def _assert_whole(mlflow_db: Path | None, optuna_db: Path | None) -> None:
    from harness.store.creating import complete

    for db, store in ((mlflow_db, "mlflow"), (optuna_db, "optuna")):
        if db is not None:
            assert complete(db, store), f"{db} is not a whole {store} store"
            assert not list(db.parent.glob(f".{db.name}.creating-*")), "a temporary store was left"


def _foreign_vs_harness(tmp_path: Path, rounds: int) -> None:
    for round_ in range(rounds):
        mlflow_db, optuna_db = tmp_path / f"m{round_}.db", tmp_path / f"o{round_}.db"
        urls = [f"sqlite:///{mlflow_db}", f"sqlite:///{optuna_db}"]
        results = _race_programs(tmp_path / f"race{round_}", [(FOREIGN, urls), (OPENER, urls)])
        for code, out in results:
            assert code == 0 and "Traceback" not in out, out
        _assert_whole(mlflow_db, optuna_db)


def test_a_store_another_client_creates_at_the_same_moment_is_waited_for(tmp_path):
    _foreign_vs_harness(tmp_path, rounds=2)


@pytest.mark.slow
def test_a_store_another_client_creates_at_the_same_moment_is_waited_for_every_time(tmp_path):
    """Looped: before the fix one of the two processes died in every round on a 2-core machine."""
    _foreign_vs_harness(tmp_path, rounds=12)


@pytest.mark.slow
def test_harness_train_beside_a_plain_mlflow_client_on_a_new_store(tmp_path):
    """The case that failed 3 of 8 runs of test_a_second_ctrl_c_exits_at_once: `harness train`
    and another MlflowClient (the test's poller there) open a new store at the same moment."""
    for round_ in range(6):
        home = tmp_path / f"home{round_}"
        uri = f"sqlite:///{home / 'mlflow.db'}"
        home.mkdir()
        results = _race_programs(tmp_path / f"race{round_}", [
            (FOREIGN, [uri, "-"]),
            (RACER, [*TRAIN, "--tracking-uri", uri]),
        ])
        for code, out in results:
            assert code == 0 and "Traceback" not in out, out
        _assert_whole(home / "mlflow.db", None)


def test_a_new_store_is_published_whole_and_a_taken_name_is_left_alone(tmp_path):
    from harness.store.creating import complete, publish_new

    for store in ("mlflow", "optuna"):
        db = tmp_path / f"{store}.db"
        assert publish_new(db, store) and complete(db, store)
        before = db.read_bytes()
        assert not publish_new(db, store) and db.read_bytes() == before  # exists: untouched
        assert [p.name for p in tmp_path.iterdir() if ".creating-" in p.name] == []


def test_an_incomplete_store_that_stopped_changing_is_opened_as_usual(tmp_path, monkeypatch):
    """Only the tables of MLflow's first release, nobody writing: not waited for forever; the
    usual opening migrates it (alone), as it would an old store."""
    import sqlalchemy
    from mlflow.store.db.utils import InitialBase

    from harness.store import creating
    from harness.store.tracking import Tracker

    db = tmp_path / "m.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    InitialBase.metadata.create_all(engine)
    engine.dispose()
    assert not creating.complete(db, "mlflow")
    monkeypatch.setattr(creating, "QUIET_S", 0.5)
    started = time.monotonic()
    Tracker(f"sqlite:///{db}").experiment_id("late")
    assert creating.complete(db, "mlflow") and time.monotonic() - started < 60
