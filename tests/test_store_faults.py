"""Issue 25, faults found by the second probe: a store that exists is never silently replaced
(empty, truncated, overwritten, damaged, another program's, read-only, on a full disk, under a
HARNESS_HOME that is a file); a study refused before anything runs when its objective is not
logged or its sampler options cannot sample; a worker whose every trial failed exits 1;
passwords with URL-special characters masked; unreachable stores failing in seconds; bounded
messages; a plugin's exit at build named; declared choices enforced; legal-but-meaningless
settings warned about; artifacts kept inside the store. Real stores, real commands."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from test_study import tiny_study
from test_study_workers import postgres_url  # noqa: F401  (the PostgreSQL fixture)
from text import flat, one_paragraph

from harness.cli.main import main
from harness.store.guard import StoreError, check_sqlite, explain

FAULTY = str(Path(__file__).with_name("faulty_plugin.py"))
TINY = ["--task", "copy", "--model", "transformer", "--set", "model.params.d_model=16",
        "--set", "model.params.layers=1", "--set", "train.batch_size=4", "--set",
        "task.params.num_train=16", "--set", "task.params.num_val=8", "--max-steps", "1",
        "--no-progress"]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, str, float]:
    started = time.monotonic()
    inherited = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # MLflow sets it
    done = subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**inherited, "OMP_WAIT_POLICY": "PASSIVE", **(env or {})})
    return done.returncode, done.stderr, time.monotonic() - started


@pytest.fixture(scope="module")
def real_store(tmp_path_factory) -> Path:
    """An mlflow.db holding one real run (made once; tests damage copies of it)."""
    home = tmp_path_factory.mktemp("store") / ".harness"
    code, err, _ = _cli("train", *TINY, env={"HARNESS_HOME": str(home)})
    assert code == 0, err
    return home / "mlflow.db"


def _damage(kind: str, path: Path) -> None:
    data = path.read_bytes()
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "overwritten":
        path.write_bytes(b"not a database at all\n" * 100)
    elif kind == "damaged page":
        page = int.from_bytes(data[16:18], "big")
        path.write_bytes(data[: 2 * page] + b"\xab" * page + data[3 * page:])
    elif kind == "optuna tables":
        path.unlink()
        with contextlib.closing(sqlite3.connect(path)) as con:
            con.execute("CREATE TABLE studies (study_id INTEGER PRIMARY KEY)")
            con.execute("CREATE TABLE version_info (version_info_id INTEGER PRIMARY KEY)")
            con.commit()


DAMAGE = ["empty", "truncated", "overwritten", "damaged page", "optuna tables"]


# -- 1. data loss ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_mlflow_store_is_refused_and_left_as_it_was(kind, real_store, harness_home, capsys):
    harness_home.mkdir(parents=True)
    store = harness_home / "mlflow.db"
    shutil.copy(real_store, store)
    _damage(kind, store)
    before = _digest(store)
    assert main(["train", *TINY]) == 2
    err = one_paragraph(capsys.readouterr().err)
    assert str(store) in err and "Nothing was written" in err or "nothing was written" in err
    assert _digest(store) == before  # not recreated, not touched
    assert not (Path.cwd() / "mlruns").exists()


@pytest.mark.parametrize("kind", DAMAGE)
def test_the_guard_refuses_every_damage_and_passes_the_real_store(kind, real_store, tmp_path):
    store = tmp_path / "mlflow.db"
    shutil.copy(real_store, store)
    check_sqlite(store, "mlflow")  # the undamaged store passes
    _damage(kind, store)
    with pytest.raises(StoreError, match="mlflow.db"):
        check_sqlite(store, "mlflow")


def test_an_empty_optuna_db_is_refused_and_no_second_parent_run_is_made(tmp_path, harness_home, capsys):
    path = tiny_study(tmp_path)
    assert main(["study", "create", str(path)]) == 0
    optuna_db = harness_home / "optuna.db"
    optuna_db.write_bytes(b"")  # what a crash or a full disk can leave
    capsys.readouterr()
    assert main(["study", "run", str(path)]) == 2
    err = one_paragraph(capsys.readouterr().err)
    assert "optuna.db" in err and "empty (0 bytes" in err
    assert optuna_db.stat().st_size == 0
    client = MlflowClient(f"sqlite:///{harness_home / 'mlflow.db'}")
    parents = [r for e in client.search_experiments() for r in client.search_runs(
        [e.experiment_id], "tags.`harness.kind` = 'study'")]
    assert len(parents) == 1


@pytest.mark.parametrize("command", [["status", "tiny"], ["list"]])
def test_study_status_and_list_on_a_truncated_optuna_db(command, tmp_path, harness_home, capsys):
    path = tiny_study(tmp_path)
    assert main(["study", "create", str(path)]) == 0
    optuna_db = harness_home / "optuna.db"
    optuna_db.write_bytes(optuna_db.read_bytes()[:5000])
    capsys.readouterr()
    assert main(["study", *command]) == 2
    err = one_paragraph(capsys.readouterr().err)
    assert "optuna.db" in err and "truncated" in err


def test_harness_home_pointing_at_a_file(tmp_path, monkeypatch, capsys):
    home = tmp_path / "a-file"
    home.write_text("x")
    monkeypatch.setenv("HARNESS_HOME", str(home))
    assert main(["train", *TINY]) == 2
    err = one_paragraph(capsys.readouterr().err)
    assert str(home) in err and "is a file" in err and home.read_text() == "x"


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` at ``path`` (root only; skipped elsewhere)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                            str(path)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_read_only_store_is_refused_before_anything_is_written(real_store, tmp_path, monkeypatch, capsys):
    with _tmpfs(tmp_path / "ro", "16m") as mount:
        home = mount / ".harness"
        home.mkdir()
        shutil.copy(real_store, home / "mlflow.db")
        before = _digest(home / "mlflow.db")
        assert subprocess.run(["mount", "-o", "remount,ro", str(mount)]).returncode == 0
        monkeypatch.setenv("HARNESS_HOME", str(home))
        assert main(["train", *TINY]) == 2
        err = one_paragraph(capsys.readouterr().err)
        assert "read-only" in err and "nothing was written" in err
        assert _digest(home / "mlflow.db") == before


def test_a_full_disk_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    with _tmpfs(tmp_path / "full", "64k") as mount:
        monkeypatch.setenv("HARNESS_HOME", str(mount / ".harness"))
        assert main(["train", *TINY]) == 2
        err = one_paragraph(capsys.readouterr().err)
        assert "full" in err and "nothing was written" in err


def test_a_disk_that_fills_while_sqlite_writes_is_explained(tmp_path):
    """The real error SQLite raises when its disk fills mid-write becomes one paragraph."""
    with _tmpfs(tmp_path / "fills", "256k") as mount:
        con = sqlite3.connect(mount / "x.db")
        con.execute("CREATE TABLE t (v BLOB)")
        with pytest.raises(sqlite3.OperationalError) as caught:
            for _ in range(1000):
                con.execute("INSERT INTO t VALUES (?)", (os.urandom(4096),))
                con.commit()
        con.close()
    error = explain(caught.value)
    assert error is not None and "full" in str(error) and error.exit_code == 2


# -- 2. a study that cannot produce a result ------------------------------------------------------
def _no_study_created(home: Path) -> bool:
    db = home / "optuna.db"
    if not db.exists():
        return True
    with contextlib.closing(sqlite3.connect(db)) as con:
        return con.execute("SELECT count(*) FROM studies").fetchone()[0] == 0


@pytest.mark.parametrize(("top", "field"), [
    ({"objective": {"metric": "accuracy", "direction": "maximize"}}, "objective.metric"),
    ({"sampler": {"name": "tpe", "options": {"n_startup_trials": "x"}}}, "sampler"),
    ({"sampler": {"name": "tpe", "options": {"n_startup_trials": 1, "n_ei_candidates": "x"}}}, "sampler"),
])
def test_a_study_that_would_fail_every_trial_is_refused_at_create(top, field, tmp_path, harness_home, capsys):
    path = tiny_study(tmp_path, **top)
    assert main(["study", "create", str(path)]) == 2
    err = one_paragraph(capsys.readouterr().err)
    assert field in err
    assert _no_study_created(harness_home)


def test_the_objective_may_be_a_metric_the_task_declares(tmp_path):
    import harness
    from harness.study.space import logged_metrics

    registry = harness.load_plugins()
    reverse = registry.get("task", "reverse").build
    from harness.params import resolve

    spec = registry.get("task", "reverse")
    task = reverse(resolve(spec.config, {}, "task.params"), seed=0)
    assert {"acc", "loss", "exact", "greedy_exact"} <= (logged_metrics(task) or set())


def test_a_worker_whose_every_trial_failed_exits_1(tmp_path, capsys):
    import copy

    from test_study import CANDIDATE

    cand = copy.deepcopy(CANDIDATE)
    cand["model"]["mixer"] = {"name": "boom", "search_declared": False}
    path = tiny_study(tmp_path, candidates=[cand], plugins=[FAULTY], budget={"trials": 1, "steps": 4},
                      confirm={"seeds": 1})
    code = main(["study", "run", str(path)])
    out = capsys.readouterr()
    assert code == 1
    assert "every trial this worker ran failed" in flat(out.err) and "Traceback" not in out.err


# -- 3. secrets -----------------------------------------------------------------------------------
SPECIAL = ["sl/ash", "a/b/c", "q?x#y", "p%2Fq", "at@sign/slash", "col:on/x"]


@pytest.mark.parametrize("password", SPECIAL)
def test_a_password_with_url_special_characters_is_masked(password):
    from harness.store.masking import mask_text

    url = f"postgresql+psycopg://user:{password}@127.0.0.1:5432/db"
    for text in (url, f"storage {url} is down", f"(`--storage {url}`)"):
        masked = mask_text(text)
        assert password not in masked and "user:***@127.0.0.1:5432/db" in masked


def test_a_raw_slash_password_is_masked_in_what_mlflow_records(tmp_path):
    import json

    from harness.store.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    storage = "postgresql+psycopg://user:sl/ash@127.0.0.1:5432/db"
    tracker = Tracker(uri)
    run_id = tracker.start_run("e", tags={"storage": storage})
    tracker.log_params(run_id, {"storage": storage})
    tracker.end_run(run_id, "FINISHED")
    run = MlflowClient(uri).get_run(run_id)
    recorded = json.dumps([run.data.params, run.data.tags])
    assert "sl/ash" not in recorded and "ash@" not in recorded
    assert b"sl/ash" not in (tmp_path / "m.db").read_bytes()


def test_study_commands_never_print_a_raw_slash_password(tmp_path, capsys):
    path = tiny_study(tmp_path)
    storage = "postgresql+psycopg://user:sl/ash@127.0.0.1:9/none"
    for args in (["study", "create", str(path), "--storage", storage], ["study", "list", "--storage", storage],
                 ["study", "status", "tiny", "--storage", storage]):
        code = main(args)
        out = capsys.readouterr()
        assert code == 2 and "sl/ash" not in out.out + out.err and "Traceback" not in out.err


def test_the_extra_workers_get_the_stores_by_environment_not_argv(tmp_path):
    from harness.study.spawn import worker_command, worker_env

    storage = "postgresql+psycopg://user:s3cret@db/x"
    cmd = worker_command("s.yaml", "tiny", None, ["budget.trials=1"])
    env = worker_env(storage, "postgresql://u:s3cret@db/m")
    assert not any("s3cret" in part for part in cmd)
    assert env == {"HARNESS_STORAGE": storage, "MLFLOW_TRACKING_URI": "postgresql://u:s3cret@db/m"}


def test_harness_storage_is_read_like_storage(tmp_path, monkeypatch):
    from harness.study.storage import storage_url

    monkeypatch.setenv("HARNESS_STORAGE", "sqlite:///elsewhere.db")
    assert storage_url(None) == "sqlite:///elsewhere.db" and storage_url("sqlite:///x.db") == "sqlite:///x.db"


def _cmdlines(root: int) -> dict[int, str]:
    """The command lines of ``root``'s descendants (every local user can read these)."""
    found: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            found[int(proc.name)] = f"{stat[1]} " + (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    family, grew = {root}, True
    while grew:
        grew = False
        for pid, line in found.items():
            if pid not in family and int(line.split(" ", 1)[0]) in family:
                family.add(pid)
                grew = True
    return {pid: found[pid].split(" ", 1)[1] for pid in family - {root} if pid in found}


@pytest.mark.slow
def test_harness_ui_puts_no_store_uri_on_a_command_line(tmp_path):
    from servers import free_port

    secret_dir = tmp_path / "s3cret-marker"
    secret_dir.mkdir()
    uri = f"sqlite:///{secret_dir / 'm.db'}"
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "ui", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        seen: dict[int, str] = {}
        while time.monotonic() < deadline:
            seen.update(_cmdlines(proc.pid))
            if any("mlflow" in line and "server" in line for line in seen.values()) and len(seen) >= 3:
                break
            time.sleep(0.5)
        assert any("--supervise" in line for line in seen.values()), seen
        assert any("mlflow" in line and "server" in line for line in seen.values()), seen
        assert not any("s3cret-marker" in line for line in seen.values()), seen
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.mark.slow
def test_study_run_workers_put_no_storage_url_on_a_command_line(tmp_path, harness_home):
    secret_dir = tmp_path / "s3cret-marker"
    secret_dir.mkdir()
    storage = f"sqlite:///{secret_dir / 'o.db'}"
    path = tiny_study(tmp_path, budget={"trials": 2, "steps": 10})
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    output = tmp_path / "out.log"
    with open(output, "w") as sink:  # a file, not a pipe nobody reads while it runs
        proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "study", "run", str(path),
                                 "--workers", "2", "--storage", storage], env=env, stdout=sink,
                                stderr=subprocess.STDOUT)
    seen: dict[int, str] = {}
    try:
        while proc.poll() is None:
            seen.update({pid: line for pid, line in _cmdlines(proc.pid).items() if line})
            time.sleep(0.05)
    finally:
        proc.wait(timeout=600)
    out = output.read_text()
    workers = [line for line in seen.values() if "harness.cli" in line and "study run" in line]
    assert proc.returncode == 0, out
    logs = " ".join(p.read_text() for p in (harness_home / "logs").glob("*.log"))
    assert workers, (seen, out[-2000:], logs[-2000:])
    assert not any("s3cret-marker" in line for line in seen.values()), workers


# -- 4. sizes that cannot fit, unreachable stores -------------------------------------------------
@pytest.mark.parametrize(("setting", "code", "words"), [
    ("task.params.length=1000000000", 1, "Nothing was generated"),
    ("task.params.num_train=1e30", 2, "task.params.num_train"),
    ("task.params.num_val=1e30", 2, "task.params.num_val"),
    ("model.params.norm=bogus", 2, "'pre', 'post'"),
])
def test_sizes_that_cannot_fit_and_unknown_choices_end_at_once(setting, code, words, capsys):
    assert main(["train", *TINY, "--set", setting]) == code
    err = one_paragraph(capsys.readouterr().err)
    assert words in err


def test_performer_features_of_1e30_are_refused(capsys):
    assert main(["train", *TINY, "--attention", "performer", "--set",
                 "model.attention.params.features=1e30"]) == 2
    assert "features" in one_paragraph(capsys.readouterr().err)


@pytest.mark.parametrize("command", [["train", *TINY], ["study", "create", "STUDY"], ["ui"]])
def test_an_unreachable_tracking_server_fails_within_seconds(command, tmp_path):
    path = tiny_study(tmp_path)
    args = [str(path) if a == "STUDY" else a for a in command]
    code, err, took = _cli(*args, "--tracking-uri", "http://127.0.0.1:9", timeout=120)
    assert code == 2, err
    err = one_paragraph(err)
    assert "127.0.0.1:9" in err and took < 60  # seconds on a quiet machine; torch's import dominates


@pytest.mark.parametrize(("uri", "words"), [
    ("foo://x", "'foo:'"), ("file:///proc/x", "/proc/x"), ("sqlite:////proc/x.db", "/proc/x.db"),
])
def test_tracking_uris_that_cannot_hold_runs(uri, words, capsys):
    assert main(["train", *TINY, "--tracking-uri", uri]) == 2
    assert words in one_paragraph(capsys.readouterr().err)


# -- 5. bounded messages, plugins that quit -------------------------------------------------------
def _bomb(depth: int = 8) -> str:
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for i in range(1, depth):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines)


@pytest.mark.parametrize("where", ["task.params.eval_lengths", "model.params.pattern"])
def test_a_yaml_bomb_ends_in_a_short_error_at_once(where, tmp_path, capsys):
    section, _, field = where.split(".")
    text = _bomb() + "\ntask: {name: copy}\nmodel: {name: transformer}\n"
    text = text.replace(f"{section}: {{name: ", f"{section}: {{{field}: *a7, name: ") if section == "task" else text
    text = text.replace("model: {name: transformer}", "model: {name: transformer, params: {pattern: *a7}}") \
        if section == "model" else text
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    started = time.monotonic()
    assert main(["train", str(path), "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert time.monotonic() - started < 10 and len(err) < 2000 and "Traceback" not in err


def test_a_huge_key_list_is_a_short_error(tmp_path, capsys):
    keys = {f"k{i}": i for i in range(10_000)}
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump({"task": {"name": "copy", "params": keys}, "model": {"name": "transformer"}}))
    assert main(["train", str(path), "--max-steps", "1"]) == 2
    err = one_paragraph(capsys.readouterr().err)
    assert len(err) < 1000 and "more" in err


@pytest.mark.parametrize(("how", "words"), [("exit", "SystemExit"), ("interrupt", "KeyboardInterrupt"),
                                            ("base", "BaseException")])
def test_a_plugin_that_quits_while_built_is_named(how, words):
    code, err, _ = _cli("train", *TINY, "--set", "model.mixer.name=quits", "--set",
                        f"model.mixer.params.how={how}", "--plugin", FAULTY)
    err = one_paragraph(err)
    assert code == 1 and "mixer 'quits'" in err and words in err and "faulty_plugin.py:" in err


def test_torch_errors_show_their_first_line_only():
    from harness.run.build import _user_error

    exc = ValueError("Trying to create tensor with negative dimension -5\nException raised from "
                     "check_size_nonnegative at ../c10/core/impl.h:12\nframe #0: c10::Error ...")
    text = str(_user_error("model 'transformer'", exc))
    assert "negative dimension" in text and "frame #0" not in text and "\n" not in text


# -- 6. warnings ----------------------------------------------------------------------------------
def test_legal_but_meaningless_settings_are_warned_and_recorded(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    assert main(["train", *TINY, "--tracking-uri", uri, "--position", "rope", "--set",
                 "model.position.params.scale=4", "--set", "train.lr=100", "--set",
                 "train.warmup_steps=5", "--set", "train.batch_size=32", "--set",
                 "train.label_smoothing=0.999", "--set", "train.weight_decay=100", "--set",
                 "task.params.vocab=1", "--set", "train.max_time_s=1e-9"]) == 0
    err = capsys.readouterr().err
    expected = ["train.warmup_steps", "train.batch_size", "train.max_time_s", "train.label_smoothing",
                "train.lr", "train.weight_decay", "model.position.params: scale=4", "task.params: vocab=1"]
    for words in expected:
        assert f"warning: {words}" in err, (words, err)
    (run,) = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("harness").experiment_id])
    assert all(words in run.data.tags["harness.warnings"] for words in expected)


def test_a_plain_run_has_no_warnings(tmp_path, capsys):
    assert main(["train", *TINY]) == 0
    assert "warning:" not in capsys.readouterr().err


# -- 7. artifacts inside the store ----------------------------------------------------------------
def test_the_default_experiment_is_refused(capsys):
    assert main(["train", *TINY, "--experiment", "Default"]) == 2
    assert "tracking.experiment" in one_paragraph(capsys.readouterr().err)
    assert not (Path.cwd() / "mlruns").exists()


def test_an_experiment_whose_artifacts_lie_outside_the_store_is_refused(harness_home, tmp_path, capsys):
    uri = f"sqlite:///{harness_home / 'mlflow.db'}"
    assert main(["train", *TINY]) == 0  # creates the store
    MlflowClient(uri).create_experiment("by-hand", artifact_location=(tmp_path / "elsewhere").as_uri())
    capsys.readouterr()
    assert main(["train", *TINY, "--experiment", "by-hand"]) == 2
    assert "outside this store" in one_paragraph(capsys.readouterr().err)


def test_runs_keep_their_artifacts_under_the_store(harness_home, tmp_path):
    assert main(["train", *TINY]) == 0
    client = MlflowClient(f"sqlite:///{harness_home / 'mlflow.db'}")
    exp = client.get_experiment_by_name("harness")
    assert exp.artifact_location.startswith((harness_home / "artifacts").resolve().as_uri())
    assert not (tmp_path / "mlruns").exists()


def test_a_database_store_gets_explicit_artifact_locations(harness_home, monkeypatch):
    """Any database URI (PostgreSQL in the slow tests) gets the same explicit location; with
    HARNESS_ARTIFACT_URI, under that URI."""
    from harness.store.tracking import Tracker

    tracker = Tracker("postgresql://u@db.example/x")
    assert tracker.artifact_location("e") == (harness_home / "artifacts" / "e").resolve().as_uri()
    monkeypatch.setenv("HARNESS_ARTIFACT_URI", "s3://bucket/harness/")
    assert tracker.artifact_location("e") == "s3://bucket/harness/e"
    assert Tracker("http://127.0.0.1:5000").artifact_location("e") is None


@pytest.mark.slow
@pytest.mark.postgres
def test_with_postgresql_artifacts_stay_under_the_store(tmp_path, harness_home, postgres_url,  # noqa: F811
                                                        monkeypatch):
    """A PostgreSQL tracking store, the command started in another folder: the experiment's
    artifacts are under HARNESS_HOME, not ./mlruns of that folder."""
    url = postgres_url.rsplit("/", 1)[0] + "/mlflow_art"
    _create_database(postgres_url, "mlflow_art")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, err, _ = _cli("train", *TINY, "--tracking-uri", url, env={"HARNESS_HOME": str(harness_home)},
                        timeout=600)
    assert code == 0, err
    exp = MlflowClient(url).get_experiment_by_name("harness")
    assert exp.artifact_location.startswith((harness_home / "artifacts").resolve().as_uri())
    assert not (elsewhere / "mlruns").exists()


@pytest.mark.slow
@pytest.mark.postgres
def test_a_raw_slash_password_on_postgresql_is_never_shown_or_stored(tmp_path, harness_home,
                                                                    postgres_url, capsys):  # noqa: F811
    """The server trusts local connections, so a URL with any password connects: the probe's
    case, a raw '/' in the password, through study create, list and status."""
    storage = postgres_url.replace("postgres@", "postgres:sl/ash@", 1)
    path = tiny_study(tmp_path)
    for args in (["study", "create", str(path), "--storage", storage], ["study", "list", "--storage", storage],
                 ["study", "status", "tiny", "--storage", storage]):
        assert main(args) == 0, args
        out = capsys.readouterr()
        assert "sl/ash" not in out.out + out.err and "ash@" not in out.out + out.err
    assert b"sl/ash" not in (harness_home / "mlflow.db").read_bytes()


def _create_database(url: str, name: str) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    engine.dispose()


def test_a_copied_project_uses_its_own_mlflow_store(tmp_path, harness_home, monkeypatch, capsys):
    """A study's record names the absolute mlflow.db it was created with; a copy of the
    project's store folder uses the mlflow.db next to its own optuna.db, never the original."""
    path = tiny_study(tmp_path)
    assert main(["study", "create", str(path)]) == 0
    copy_home = tmp_path / "copy" / ".harness"
    shutil.copytree(harness_home, copy_home)
    original = _digest(harness_home / "mlflow.db")
    monkeypatch.setenv("HARNESS_HOME", str(copy_home))
    from harness.study.storage import open_storage, open_study

    url = f"sqlite:///{copy_home / 'optuna.db'}"
    handle = open_study("tiny", open_storage(url), url)
    assert handle.tracker.uri == f"sqlite:///{copy_home / 'mlflow.db'}"
    assert _digest(harness_home / "mlflow.db") == original


def test_a_study_may_not_search_outside_a_declared_choice(tmp_path, harness_home, capsys):
    import copy

    from test_study import CANDIDATE

    cand = copy.deepcopy(CANDIDATE)
    cand["model"]["search"] = {"norm": ["pre", "bogus"]}
    path = tiny_study(tmp_path, candidates=[cand])
    assert main(["study", "create", str(path)]) == 2
    err = one_paragraph(capsys.readouterr().err)
    assert "search.norm" in err and "'pre', 'post'" in err
    assert _no_study_created(harness_home)


def test_a_damaged_mlflow_store_leaves_no_half_created_study(tmp_path, harness_home, capsys):
    harness_home.mkdir(parents=True)
    (harness_home / "mlflow.db").write_bytes(b"")
    path = tiny_study(tmp_path)
    assert main(["study", "create", str(path)]) == 2
    assert "mlflow.db" in one_paragraph(capsys.readouterr().err)
    assert _no_study_created(harness_home)


def test_sampler_options_are_refused_without_optunas_log(tmp_path, harness_home):
    """The throw-away study that tries the sampler fails its first trial: that is the error,
    not a logged traceback (a real process: Optuna's handler writes to the real stderr)."""
    path = tiny_study(tmp_path, sampler={"name": "tpe", "options": {"n_startup_trials": "x"}})
    code, err, _ = _cli("study", "create", str(path), env={"HARNESS_WRAP_WIDTH": "0"})  # lines counted
    assert code == 2 and "sampler" in one_paragraph(err) and len(err.splitlines()) <= 4
