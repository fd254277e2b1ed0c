"""Several ``harness study run`` workers on one PostgreSQL study (a real server, started here
on 127.0.0.1): every slot runs exactly once, trial numbers are unique, nothing is lost.

Without the PostgreSQL binaries the test is skipped, unless ``HARNESS_REQUIRE_POSTGRES=1``
(CI sets it), in which case it fails.
"""

from __future__ import annotations

import copy
import importlib.util
import json
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
from test_study import mlflow_server  # noqa: F401 (a fixture)

from harness.cli.main import main
from harness.study.storage import phase_study_name

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


RACER = r"""
import json, sys, time
from pathlib import Path
import torch, optuna, mlflow, sqlalchemy, psycopg  # imported before the start line
from harness.cli.main import main
from harness.study import cli as _study_cli, storage as _storage, worker as _worker

folder, me, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for r in range(rounds):
    (folder / f"ready-{r}-{me}").touch()
    while not (folder / f"go-{r}").exists():
        time.sleep(0.001)
    args = json.loads((folder / f"args-{r}.json").read_text())
    code = main(["study", "create", *args])
    (folder / f"rc-{r}-{me}").write_text(str(code))
"""


@pytest.mark.slow
def test_four_workers_started_together_on_an_empty_database(tmp_path, harness_home, postgres_url):
    """Schema and study creation are race-free: 4 processes start `harness study create` at
    the same moment on a fresh, empty database, 10 times; every one succeeds and there is
    exactly one study record and one parent run."""
    import psycopg

    rounds, n = 10, 4
    admin = postgres_url.replace("postgresql+psycopg", "postgresql")
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path), str(i), str(rounds)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
              for i in range(n)]
    try:
        for r in range(rounds):
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE race{r}")
            study = copy.deepcopy(STUDY) | {"name": f"race{r}"}
            path = tmp_path / f"race{r}.yaml"
            path.write_text(yaml.safe_dump(study))
            url = postgres_url.rsplit("/", 1)[0] + f"/race{r}"
            uri = f"sqlite:///{tmp_path / f'mlflow{r}.db'}"
            (tmp_path / f"args-{r}.json").write_text(
                json.dumps([str(path), "--storage", url, "--tracking-uri", uri]))
            _wait_for(lambda r=r: all((tmp_path / f"ready-{r}-{i}").exists() for i in range(n)), racers)
            (tmp_path / f"go-{r}").touch()  # all four start now
            _wait_for(lambda r=r: all((tmp_path / f"rc-{r}-{i}").exists() for i in range(n)), racers)
            codes = [(tmp_path / f"rc-{r}-{i}").read_text() for i in range(n)]
            assert codes == ["0"] * n, (r, codes, _kill_and_read(racers))
            assert optuna.study.get_all_study_names(url).count(f"race{r}/_record") == 1
            record = optuna.load_study(study_name=f"race{r}/_record", storage=url).user_attrs["harness.record"]
            client = MlflowClient(uri)
            runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                      "tags.`harness.kind` = 'study'")
            assert [run.info.run_id for run in runs] == [record["parent_run_id"]]
    finally:
        _kill_and_read(racers)


def _wait_for(done, procs, timeout_s: float = 300) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not done():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise AssertionError(_kill_and_read(procs))
        time.sleep(0.05)


def _kill_and_read(procs) -> str:
    for p in procs:
        p.kill()
    return "\n---\n".join(p.communicate()[0] or "" for p in procs if not p.stdout.closed)


@pytest.mark.slow
def test_scale_out_recipe(tmp_path, harness_home, postgres_url, mlflow_server):  # noqa: F811
    """The README's scale-out recipe as written: a fresh PostgreSQL database, a real `mlflow
    server`, 4 workers started together by examples/slurm_study.sh (as a Slurm array would),
    with no `study create` first. Every slot runs once, every run is FINISHED on the server."""
    import psycopg

    admin = postgres_url.replace("postgresql+psycopg", "postgresql")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE DATABASE recipe")
    storage = postgres_url.rsplit("/", 1)[0] + "/recipe"
    study = copy.deepcopy(STUDY) | {"name": "recipe", "budget": {"trials": 2, "steps": 20},
                                    "confirm": {"seeds": 2}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(study))
    script = Path(__file__).resolve().parent.parent / "examples" / "slurm_study.sh"
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HARNESS_STORAGE": storage,
           "MLFLOW_TRACKING_URI": mlflow_server, "SLURM_CPUS_PER_TASK": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    workers = [subprocess.Popen(["bash", str(script), str(path)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                env={**env, "SLURM_ARRAY_TASK_ID": str(i)}) for i in range(4)]
    outputs = [w.communicate(timeout=900)[0] for w in workers]
    assert [w.returncode for w in workers] == [0] * 4, "\n\n".join(outputs)

    client = MlflowClient(mlflow_server)
    record = optuna.load_study(study_name="recipe/_record", storage=storage).user_attrs["harness.record"]
    parent = record["parent_run_id"]
    assert client.get_run(parent).info.status == "FINISHED"
    runs = client.search_runs([client.get_run(parent).info.experiment_id],
                              f"tags.mlflow.parentRunId = '{parent}'")
    for cand in ("sin", "nope"):
        for phase, slots in (("tune", 2), ("confirm", 2)):
            trials = optuna.load_study(study_name=phase_study_name("recipe", phase, cand), storage=storage).get_trials()
            assert [t.number for t in trials] == list(range(slots))
            assert all(t.state == TrialState.COMPLETE for t in trials)
    assert len(runs) == 8 and all(r.info.status == "FINISHED" for r in runs)
    status = subprocess.run([sys.executable, "-m", "harness.cli", "study", "status", "recipe",
                             "--storage", storage], capture_output=True, text=True, env=env)
    assert status.returncode == 0 and "complete" in status.stdout
