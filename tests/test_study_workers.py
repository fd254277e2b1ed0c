"""Several ``harness study run`` workers on one PostgreSQL study (a real server, started here
on 127.0.0.1): every slot runs exactly once, trial numbers are unique, nothing is lost.

Without the PostgreSQL binaries the test is skipped, unless ``HARNESS_REQUIRE_POSTGRES=1``
(CI sets it), in which case it fails.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState
from servers import free_port

from harness.cli import main

PG_BIN = Path(os.environ.get("HARNESS_PG_BIN", "/usr/lib/postgresql/15/bin"))

STUDY = {
    "name": "shared",
    "task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 128, "num_val": 32}},
    "candidates": [
        {"name": name, "model": {"name": "transformer",
                                 "params": {"layers": 1, "heads": 2, "d_model": 16, "ffn_mult": 2},
                                 "search_declared": False,
                                 "attention": {"name": "multi_head", "search_declared": False},
                                 "position": {"name": position, "search_declared": False}}}
        for name, position in (("sin", "sinusoidal"), ("nope", "none"))
    ],
    "search": {"lr": {"low": 1.0e-3, "high": 2.0e-2, "log": True}},
    "train": {"batch_size": 16, "val_every": 20, "num_threads": 1},
    "budget": {"trials": 4, "steps": 60},
    "pruner": {"name": "none"},
    "confirm": {"seeds": 2},
    "resume": {"heartbeat_s": 1, "grace_s": 10, "poll_s": 0.3},
}


@pytest.fixture(scope="module")
def postgres_url():
    """A throwaway PostgreSQL server on 127.0.0.1 (trust auth, socket in its own folder)."""
    reason = None
    if not (PG_BIN / "initdb").exists():
        reason = (f"PostgreSQL server binaries not found in {PG_BIN} (apt-get install "
                  f"postgresql, or set HARNESS_PG_BIN)")
    elif importlib.util.find_spec("psycopg") is None:
        reason = "the psycopg driver is missing (pip install 'psycopg[binary]')"
    if reason and os.environ.get("HARNESS_REQUIRE_POSTGRES") == "1":
        pytest.fail(reason + "; HARNESS_REQUIRE_POSTGRES=1 makes this a failure")
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="harness-pg-"))  # under /tmp: reachable by postgres
    as_postgres: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root
        shutil.chown(root, "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", free_port()
    subprocess.run([*as_postgres, str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust",
                    "-U", "postgres"], check=True, capture_output=True)
    ctl = [*as_postgres, str(PG_BIN / "pg_ctl"), "-D", str(data)]
    subprocess.run([*ctl, "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {root}",
                    "-l", str(root / "log"), "-w", "start"], check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*ctl, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.postgres
def test_two_workers_share_one_study(tmp_path, harness_home, postgres_url):
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump(copy.deepcopy(STUDY)))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ["--storage", postgres_url, "--tracking-uri", uri]
    # create once (schema, record, slots, parent run), then start the workers together
    assert main(["study", "create", str(path), *args]) == 0
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    workers = [subprocess.Popen([sys.executable, "-m", "harness.cli", "study", "run", str(path), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
               for _ in range(2)]
    outputs = [w.communicate(timeout=540)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], "\n\n".join(outputs)

    client = MlflowClient(uri)
    record = optuna.load_study(study_name="shared/_record", storage=postgres_url).user_attrs["harness.record"]
    parent = record["parent_run_id"]
    runs = {r.data.tags["harness.trial"]: r for r in client.search_runs(
        [client.get_run(parent).info.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")}
    ran_by = set()
    for cand in ("sin", "nope"):
        for phase, slots in (("tune", 4), ("confirm", 2)):
            name = f"shared/{cand}" if phase == "tune" else f"shared/{cand}/confirm"
            trials = optuna.load_study(study_name=name, storage=postgres_url).get_trials()
            assert [t.number for t in trials] == list(range(slots))  # unique, none extra
            assert sorted(t.user_attrs["harness.slot"] for t in trials) == list(range(slots))
            assert all(t.state == TrialState.COMPLETE for t in trials)  # none lost
            for t in trials:
                run = runs.pop(f"{name}#{t.number}")  # exactly one run per trial
                assert run.info.status == "FINISHED"
                assert run.info.run_id == t.user_attrs["harness.mlflow_run_id"]
                ran_by.add(run.data.tags["harness.worker"])
    assert runs == {}
    assert len(ran_by) == 2, f"both workers should have run trials: {ran_by}"
    assert client.get_run(parent).info.status == "FINISHED"
