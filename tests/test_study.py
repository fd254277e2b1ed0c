"""Studies end to end on CPU, checked through MlflowClient and the Optuna storage: one tiny
real study (tuning, pruning, confirmation, report), the pruning callback's steps, a worker
killed with SIGKILL and resumed, and the same study against a real ``mlflow server``.
(Several workers on PostgreSQL: tests/test_study_workers.py.)"""

from __future__ import annotations

import copy
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState
from servers import free_port, wait_until_healthy
from text import flat

from harness.cli.main import main

CANDIDATE = {
    "name": "mha",
    "model": {"name": "transformer", "params": {"layers": 1, "heads": 2, "d_model": 16, "ffn_mult": 2},
              "search_declared": False,
              "attention": {"name": "multi_head", "search_declared": False},
              "position": {"name": "sinusoidal", "search_declared": False}},
}
TINY: dict[str, Any] = {
    "name": "tiny",
    "task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 128, "num_val": 32,
                                        "eval_lengths": [6]}},
    "candidates": [CANDIDATE],
    "objective": {"metric": "acc", "length": 6},
    "search": {"lr": {"low": 1.0e-3, "high": 2.0e-2, "log": True}},
    "train": {"batch_size": 16, "val_every": 10, "warmup_steps": 2, "num_threads": 1},
    "budget": {"trials": 2, "steps": 20},
    "confirm": {"seeds": 2},
    "resume": {"heartbeat_s": 1, "grace_s": 2, "poll_s": 0.3},
}


def tiny_study(tmp: Path, name: str = "tiny", **top: Any) -> Path:
    data = copy.deepcopy(TINY) | {"name": name} | top
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def nope() -> dict[str, Any]:
    cand = copy.deepcopy(CANDIDATE)
    cand["name"] = "nope"
    cand["model"]["position"] = {"name": "none"}
    return cand


def children(client: MlflowClient, parent: str) -> list[Any]:
    exp = client.get_run(parent).info.experiment_id
    return list(client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent}'"))


def record(storage: str, name: str) -> dict[str, Any]:
    return optuna.load_study(study_name=f"{name}/_record", storage=storage).user_attrs["harness.record"]


def optuna_name(name: str, phase: str, cand: str) -> str:
    """What optuna-dashboard lists: NAME/CAND (tuning), NAME/CAND/confirm."""
    return f"{name}/{cand}" if phase == "tune" else f"{name}/{cand}/confirm"


def trials(storage: str, name: str, phase: str, cand: str) -> list[Any]:
    return optuna.load_study(study_name=optuna_name(name, phase, cand), storage=storage).get_trials()


def brute_force_p(d: list[float]) -> float:
    obs = abs(sum(d) / len(d))
    flips = list(itertools.product((1, -1), repeat=len(d)))
    return sum(abs(sum(s * x for s, x in zip(f, d, strict=True)) / len(d)) >= obs - 1e-12
               for f in flips) / len(flips)


# -- one tiny study, end to end ------------------------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """Two candidates x 2 trials + 2 confirmation seeds, run and reported in-process."""
    tmp = tmp_path_factory.mktemp("study")
    path = tiny_study(tmp, candidates=[CANDIDATE, nope()])
    storage, uri = f"sqlite:///{tmp / 'optuna.db'}", f"sqlite:///{tmp / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARNESS_HOME", str(tmp / ".harness"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        code = main(["study", "run", str(path), "--storage", storage, "--tracking-uri", uri,
                     "--report", "--out", str(tmp / "report")])
    assert code == 0
    return {"path": path, "storage": storage, "uri": uri, "out": tmp / "report", "tmp": tmp}


@pytest.mark.slow
def test_optuna_storage_holds_every_slot_once(finished):
    rec = record(finished["storage"], "tiny")
    assert rec["ready"] and rec["train_length"] == 4 and rec["eval_lengths"] == [4, 6]
    for cand in ("mha", "nope"):
        tune = trials(finished["storage"], "tiny", "tune", cand)
        assert [t.number for t in tune] == [0, 1]
        assert sorted(t.user_attrs["harness.slot"] for t in tune) == [0, 1]
        assert all(t.state == TrialState.COMPLETE for t in tune)
        assert all("train.lr" in t.params for t in tune)
        confirm = trials(finished["storage"], "tiny", "confirm", cand)
        assert sorted(t.user_attrs["harness.seed"] for t in confirm) == [1, 2]  # never seed 0
        assert all(t.state == TrialState.COMPLETE for t in confirm)
        best = max(tune, key=lambda t: t.value)
        for t in confirm:  # the best configuration, re-run with another seed
            assert t.user_attrs["harness.tuning_trial"] == best.number
            run_cfg = t.user_attrs["harness.run_config"]
            assert run_cfg["train"]["lr"] == best.params["train.lr"]
            assert run_cfg["train"]["seed"] == t.user_attrs["harness.seed"]


@pytest.mark.slow
def test_mlflow_runs_nest_under_one_parent(finished):
    client = MlflowClient(finished["uri"])
    parent = record(finished["storage"], "tiny")["parent_run_id"]
    prun = client.get_run(parent)
    assert prun.info.status == "FINISHED"
    assert prun.data.tags["harness.study"] == "tiny"
    runs = children(client, parent)
    assert len(runs) == 8  # 2 candidates x (2 trials + 2 seeds): one child per trial
    by_trial = {r.data.tags["harness.trial"]: r for r in runs}
    for cand in ("mha", "nope"):
        for phase in ("tune", "confirm"):
            for t in trials(finished["storage"], "tiny", phase, cand):
                run = by_trial[f"{optuna_name('tiny', phase, cand)}#{t.number}"]
                assert t.user_attrs["harness.mlflow_run_id"] == run.info.run_id
                assert run.info.status == "FINISHED"
                assert run.data.tags["harness.candidate"] == cand
                assert run.data.params["train.seed"] == str(t.user_attrs["harness.run_config"]["train"]["seed"])
                assert run.data.metrics["val/acc_len6"] == pytest.approx(t.value)
    assert not list(client.search_runs([prun.info.experiment_id], "attributes.status = 'RUNNING'"))


@pytest.mark.slow
def test_report_files_and_statistics(finished):
    out = finished["out"]
    for name in ("results.md", "results.html", "summary.json", "learning_curves.png",
                 "extrapolation.png", "front.png", "seeds.png", "optuna/mha_history.png"):
        assert (out / name).stat().st_size > 0, name
    # 2 trials cannot estimate importance: one sentence instead of a plot
    assert not (out / "optuna" / "nope_importance.png").exists()
    assert "nope: no parameter-importance plot: it searched one parameter" in (out / "results.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    best = summary["candidates"][0]  # table order: the first attention-based candidate
    assert list((out / "attention").glob(f"{best['name']}_seed*_attention_*.png"))
    client = MlflowClient(finished["uri"])
    values = {}
    for cand in summary["candidates"]:
        # independent read: the objective metric of each confirmation run from MLflow
        vals = {int(seed): client.get_run(run_id).data.metrics["val/acc_len6"]
                for seed, run_id in cand["runs"].items()}
        assert sorted(vals) == [1, 2]
        assert cand["mean"] == pytest.approx(sum(vals.values()) / 2)
        if vals[1] != vals[2]:  # Student t over 2 seeds: wider than their range
            ci = cand["interval"]
            assert ci["method"] == "Student t"
            assert ci["low"] < min(vals.values()) <= cand["mean"] <= max(vals.values()) < ci["high"]
        assert cand["by_length"]["6"] == pytest.approx(cand["mean"])
        assert cand["cost"]["params"] == client.get_run(cand["runs"]["1"]).data.metrics["cost/params"]
        values[cand["name"]] = vals
    by_name = {c["name"]: c for c in summary["candidates"]}
    base, other = by_name["mha"], by_name["nope"]
    assert summary["baseline"] == "mha" and base["vs_baseline"] is None
    diffs = [values["nope"][s] - values["mha"][s] for s in (1, 2)]
    assert other["vs_baseline"]["n"] == 2
    assert other["vs_baseline"]["mean_difference"] == pytest.approx(sum(diffs) / 2)
    assert other["vs_baseline"]["p_value"] == pytest.approx(brute_force_p(diffs))
    # 2 seeds cannot resolve anything (2/2^2 = 0.5): one group, both rank 1, said first
    assert summary["resolvable"] is False and base["rank"] == other["rank"] == 1
    md = (out / "results.md").read_text()
    assert md.startswith("**Too few seeds: With 2 confirmation seed(s)")
    assert "| rank | candidate |" in md and "transformer · multi_head · none" in md
    assert "<table>" in (out / "results.html").read_text()
    parent = summary["parent_run_id"]
    logged = {f.path for f in client.list_artifacts(parent, "report")}
    assert {"report/results.md", "report/results.html", "report/summary.json"} <= logged


@pytest.mark.slow
def test_rerun_is_a_noop_and_a_changed_file_is_refused(finished, capsys):
    args = ["--storage", finished["storage"], "--tracking-uri", finished["uri"]]
    assert main(["study", "run", str(finished["path"]), *args]) == 0
    assert len(trials(finished["storage"], "tiny", "tune", "mha")) == 2
    assert main(["study", "status", "tiny", *args]) == 0
    out = capsys.readouterr().out
    assert "study tiny: complete" in out and "2/2 (2 complete, 0 pruned, 0 failed)" in out
    other = f"sqlite:///{finished['tmp'] / 'elsewhere.db'}"
    # status reads the Optuna storage alone; a command that writes to MLflow checks the store
    assert main(["report", "tiny", "--storage", finished["storage"], "--tracking-uri", other]) == 2
    assert "is not in the tracking store" in flat(capsys.readouterr().err)
    changed = yaml.safe_load(finished["path"].read_text())
    changed["budget"]["trials"] = 3
    finished["path"].write_text(yaml.safe_dump(changed))
    assert main(["study", "run", str(finished["path"]), *args]) == 2
    assert "already exists" in flat(capsys.readouterr().err)
    assert len(trials(finished["storage"], "tiny", "tune", "mha")) == 2


# -- pruning ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_pruned_trials_end_finished_with_a_tag_and_a_name(tmp_path, capsys):
    # Random sampler, slot-seeded: slot 0 draws lr 0.03, slots 1 and 2 draw 1e-6 (which does
    # not learn), so the median pruner (after one completed trial) prunes them at step 10.
    path = tiny_study(tmp_path, "prune", objective={"metric": "loss"},
                      search={"lr": [0.03, 1.0e-6]}, sampler={"name": "random", "seed": 6},
                      pruner={"name": "median", "startup_trials": 1},
                      budget={"trials": 3, "steps": 30}, confirm={"seeds": 1},
                      train={"batch_size": 16, "val_every": 10, "warmup_steps": 0, "num_threads": 1})
    assert main(["study", "run", str(path)]) == 0
    storage = f"sqlite:///{os.environ['HARNESS_HOME']}/optuna.db"
    tune = trials(storage, "prune", "tune", "mha")
    assert [t.params["train.lr"] for t in tune] == [0.03, 1e-6, 1e-6], "sampler draws changed"
    assert [t.state for t in tune] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.PRUNED]
    assert all(list(t.intermediate_values) == [10] for t in tune[1:])
    client = MlflowClient(f"sqlite:///{os.environ['HARNESS_HOME']}/mlflow.db")
    for t in tune[1:]:
        run = client.get_run(t.user_attrs["harness.mlflow_run_id"])
        assert run.info.status == "FINISHED" and run.data.tags["harness.pruned"] == "true"
        assert run.info.run_name == f"mha/tune/trial-{t.number} (pruned)"
        assert "pruned at step 10 (val/loss = " in run.data.tags["mlflow.note.content"]
    assert main(["study", "status", "prune"]) == 0
    assert "3/3 (1 complete, 2 pruned, 0 failed)" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The reported value is ignored")
def test_trial_callback_reports_at_optimizer_steps(registry):
    """Why the study has its own callback: when one epoch holds several validations (here
    64 batches per epoch, validation every 10 steps), the integration's reports all land on
    step 0 (the epoch) and Optuna keeps only the first."""
    from optuna_integration import PyTorchLightningPruningCallback

    from harness.run.pipeline import train
    from harness.study.worker import trial_callback

    model = CANDIDATE["model"]
    task = copy.deepcopy(TINY["task"])
    task["params"]["num_train"] = 1024
    cfg = {"task": task,
           "model": {"name": model["name"], "params": model["params"],
                     "attention": {"name": model["attention"]["name"]},
                     "position": {"name": model["position"]["name"]}},
           "train": TINY["train"] | {"max_steps": 30, "lr": 0.01, "progress": False}}
    ours, theirs = optuna.create_study().ask(), optuna.create_study().ask()
    train(cfg, registry=registry,
          callbacks=[trial_callback(ours, "val/acc", report=True, prune=False, max_steps=30),
                     PyTorchLightningPruningCallback(theirs, monitor="val/acc")])
    reported = ours.study.trials[0].intermediate_values
    assert sorted(reported) == [10, 20, 30]
    # theirs: the validations at steps 10, 20 and 30 all report epoch 0, so only the first
    # is kept (the evaluation after fitting then reports epoch 1)
    collapsed = theirs.study.trials[0].intermediate_values
    assert collapsed[0] == pytest.approx(reported[10]) and 10 not in collapsed and 20 not in collapsed
    assert ours.study.trials[0].user_attrs["harness.mlflow_run_id"]


def test_the_pruner_compares_trials_on_the_objectives_own_length(registry):
    """An objective at another length than training (copy trained at 4, judged at 6): the
    trial reports val/loss at length 6 at every validation, which the run validates there too
    while training, and its last report is the run's final val/loss_len6 (not the loss at the
    training length the pruner used to compare). A model that cannot run the length (learned
    positions) is not validated there and reports nothing; its run is unharmed."""
    from harness.run.pipeline import train
    from harness.study.worker import trial_callback

    model = CANDIDATE["model"]
    cfg = {"task": copy.deepcopy(TINY["task"]),
           "model": {"name": model["name"], "params": model["params"],
                     "attention": {"name": model["attention"]["name"]},
                     "position": {"name": model["position"]["name"]}},
           "train": TINY["train"] | {"max_steps": 20, "lr": 0.01, "progress": False}}
    trial = optuna.create_study().ask()
    result = train(cfg, registry=registry, callbacks=[trial_callback(
        trial, "val/loss_len6", report=True, prune=False, max_steps=20, length=6)])
    reported = trial.study.trials[0].intermediate_values
    assert sorted(reported) == [10, 20]
    assert reported[20] == pytest.approx(result.metrics["val/loss_len6"], rel=1e-6)
    assert abs(reported[20] - result.metrics["val/loss"]) > 1e-3  # a different question
    cfg["model"]["position"] = {"name": "learned"}
    trial = optuna.create_study().ask()
    result = train(cfg, registry=registry, callbacks=[trial_callback(
        trial, "val/loss_len6", report=True, prune=False, max_steps=20, length=6, fixed=True)])
    assert trial.study.trials[0].intermediate_values == {} and result.status == "FINISHED"
    assert result.not_applicable == [6]


@pytest.mark.slow
def test_multi_objective_study_and_an_infeasible_trial(tmp_path, capsys):
    # heads 3 does not divide d_model 16: the random sampler (slot-seeded) draws heads
    # 2, 3, 2 for slots 0, 1, 2, so slot 1 fails with the reason and the study goes on.
    cand = copy.deepcopy(CANDIDATE)
    del cand["model"]["params"]["heads"]
    cand["model"]["search"] = {"heads": [2, 3]}
    path = tiny_study(tmp_path, "multi", candidates=[cand], cost={"metric": "params"},
                      search={}, sampler={"name": "random", "seed": 2},
                      budget={"trials": 3, "steps": 20}, confirm={"seeds": 1})
    assert main(["study", "run", str(path), "--report", "--out", str(tmp_path / "r")]) == 0
    assert "pruner 'median' disabled" in capsys.readouterr().out
    home = os.environ["HARNESS_HOME"]
    tune = trials(f"sqlite:///{home}/optuna.db", "multi", "tune", "mha")
    assert [t.params["model.heads"] for t in tune] == [2, 3, 2], "sampler draws changed"
    assert [t.state for t in tune] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert "must be divisible by heads" in tune[1].user_attrs["harness.failure"]
    for t in (tune[0], tune[2]):
        assert len(t.values) == 2 and t.values[1] == pytest.approx(
            MlflowClient(f"sqlite:///{home}/mlflow.db").get_run(
                t.user_attrs["harness.mlflow_run_id"]).data.metrics["cost/params"])
        assert t.intermediate_values == {}  # Optuna cannot prune multi-objective studies
    failed = MlflowClient(f"sqlite:///{home}/mlflow.db").get_run(tune[1].user_attrs["harness.mlflow_run_id"])
    assert failed.info.status == "FAILED" and "divisible" in failed.data.tags["harness.failure"]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["candidates"][0]["tuning"]["failed"] == 1
    assert (tmp_path / "r" / "front.png").exists()


# -- a worker killed mid-trial -----------------------------------------------------------------
@pytest.mark.slow
def test_sigkill_mid_trial_then_resume(tmp_path, harness_home):
    path, storage, uri, args = _killable_study(tmp_path)
    worker = _start_worker(path, args)
    try:
        victim = _wait_for_a_training_trial(storage, worker)  # fit started: 300 steps to go
    finally:
        worker.kill()  # SIGKILL: no cleanup runs
        worker.wait()
    client = MlflowClient(uri)
    run_id = victim.user_attrs["harness.mlflow_run_id"]
    assert client.get_run(run_id).info.status == "RUNNING"
    assert _state(storage, victim) == TrialState.RUNNING

    assert main(["study", "run", str(path), *args]) == 0

    tune = trials(storage, "killed", "tune", "mha")
    killed = next(t for t in tune if t.number == victim.number)
    assert killed.state == TrialState.FAIL
    retry = next(t for t in tune if victim.number in t.system_attrs.get("retry_history", []))
    assert retry.state == TrialState.COMPLETE and retry.params == killed.params
    assert retry.user_attrs["harness.slot"] == killed.user_attrs["harness.slot"]
    assert sum(t.state == TrialState.COMPLETE for t in tune) == 2  # the budget, exactly
    assert len(tune) == 3
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["harness.interrupted"] == "true"
    parent = record(storage, "killed")["parent_run_id"]
    assert client.get_run(parent).info.status == "FINISHED"
    exp = client.get_run(parent).info.experiment_id
    assert not list(client.search_runs([exp], "attributes.status = 'RUNNING'"))
    assert len(children(client, parent)) == 4  # 3 tuning attempts + 1 confirmation


def _killable_study(tmp_path: Path) -> tuple[Path, str, str, list[str]]:
    """A study whose trials train long enough (300 steps) to be killed mid-fit. It is
    created here first, as for any set of workers: polling a storage whose schema a child
    process is still creating would race it."""
    path = tiny_study(tmp_path, "killed", budget={"trials": 2, "steps": 300},
                      train={"batch_size": 8, "val_every": 50, "num_threads": 1},
                      confirm={"seeds": 1})
    storage, uri = f"sqlite:///{tmp_path / 'o.db'}", f"sqlite:///{tmp_path / 'm.db'}"
    args = ["--storage", storage, "--tracking-uri", uri]
    assert main(["study", "create", str(path), *args]) == 0
    return path, storage, uri, args


def _start_worker(path: Path, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness.cli", "study", "run", str(path), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})


def _wait_for_a_training_trial(storage: str, worker: subprocess.Popen) -> Any:
    deadline = time.time() + 240
    while time.time() < deadline:
        assert worker.poll() is None, "the worker exited before it could be killed"
        try:
            for t in trials(storage, "killed", "tune", "mha"):
                if t.state == TrialState.RUNNING and "harness.mlflow_run_id" in t.user_attrs:
                    return t
        except KeyError:
            pass  # not created yet
        time.sleep(0.2)
    raise AssertionError("no trial started training in time")


def _state(storage: str, trial: Any) -> TrialState:
    return next(t.state for t in trials(storage, "killed", "tune", "mha") if t.number == trial.number)


# -- a real mlflow server ---------------------------------------------------------------------

@pytest.fixture
def mlflow_server(tmp_path):
    port = free_port()
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 (closed in teardown)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
         f"sqlite:///{tmp_path / 'server.db'}", "--default-artifact-root",
         (tmp_path / "server-artifacts").as_uri(), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, log=tmp_path / "server.log")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.mark.slow
def test_same_study_against_an_mlflow_server(tmp_path, mlflow_server):
    path = tiny_study(tmp_path, "served")
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    assert main(["study", "run", str(path), "--storage", storage, "--tracking-uri", mlflow_server,
                 "--report", "--out", str(tmp_path / "report")]) == 0
    client = MlflowClient(mlflow_server)
    rec = record(storage, "served")
    assert rec["tracking_uri"] == mlflow_server
    parent = client.get_run(rec["parent_run_id"])
    assert parent.info.status == "FINISHED"
    runs = children(client, parent.info.run_id)
    assert sorted((r.data.tags["harness.phase"], r.info.status) for r in runs) == [
        ("confirm", "FINISHED"), ("confirm", "FINISHED"), ("tune", "FINISHED"), ("tune", "FINISHED")]
    for phase in ("tune", "confirm"):
        for t in trials(storage, "served", phase, "mha"):
            assert client.get_run(t.user_attrs["harness.mlflow_run_id"]).data.tags[
                "mlflow.parentRunId"] == parent.info.run_id
    assert "report/summary.json" in {f.path for f in client.list_artifacts(parent.info.run_id, "report")}
    # status and report find the server from the study's record alone
    assert main(["study", "status", "served", "--storage", storage]) == 0


@pytest.mark.slow
def test_sigterm_mid_trial_requeues_at_once(tmp_path, harness_home):
    """A scheduler's SIGTERM: the worker shuts down cleanly; its trial is failed and re-queued
    immediately (no heartbeat wait), its run ends KILLED, and a new worker completes the study."""
    path, storage, uri, args = _killable_study(tmp_path)
    worker = _start_worker(path, args)
    try:
        victim = _wait_for_a_training_trial(storage, worker)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=120) == 143
    finally:
        if worker.poll() is None:
            worker.kill()
    assert _state(storage, victim) == TrialState.FAIL  # at once, not after a stale heartbeat
    requeued = [t for t in trials(storage, "killed", "tune", "mha")
                if victim.number in t.system_attrs.get("retry_history", [])]
    assert [t.state for t in requeued] == [TrialState.WAITING]
    client = MlflowClient(uri)
    run = client.get_run(victim.user_attrs["harness.mlflow_run_id"])
    assert run.info.status == "KILLED" and run.data.tags["harness.interrupted"] == "true"

    assert main(["study", "run", str(path), *args]) == 0
    tune = trials(storage, "killed", "tune", "mha")
    assert sum(t.state == TrialState.COMPLETE for t in tune) == 2


@pytest.mark.slow
def test_the_best_configuration_a_report_writes_is_complete_and_reproduces_its_run(finished, monkeypatch):
    """Issue 12: every declared field (defaults included), runnable with `harness train`, and on
    CPU the re-run gives the tuning run's validation metrics exactly."""
    import harness

    path = finished["out"] / "configs" / "mha.yaml"
    config = yaml.safe_load(path.read_text())
    assert set(config["model"]["params"]) >= {"d_model", "layers", "heads", "ffn_mult", "dropout",
                                              "norm", "norm_layer", "mlp", "tie_embeddings"}
    assert set(config["model"]["attention"]["params"]) >= {"dropout", "bias", "tied_qk", "kv_heads"}
    assert {"optimizer", "schedule", "lr", "seed", "data_seed", "max_steps"} <= set(config["train"])
    summary = json.loads((finished["out"] / "summary.json").read_text())
    best = next(c for c in summary["candidates"] if c["name"] == "mha")
    tune = trials(finished["storage"], "tiny", "tune", "mha")
    recorded = MlflowClient(finished["uri"]).get_run(
        tune[best["best_trial"]].user_attrs["harness.mlflow_run_id"]).data.metrics
    monkeypatch.setenv("HARNESS_HOME", str(finished["tmp"] / "rerun"))
    again = harness.train(str(path))
    for key in ("val/loss", "val/acc", "val/acc_len6", "cost/params"):
        assert again.metrics[key] == recorded[key], key
