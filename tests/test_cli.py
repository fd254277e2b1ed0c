"""The command line: cheap imports, errors as one paragraph with exit code 2, a real UI server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from servers import free_port, wait_until_healthy

from harness.cli import main

HEAVY = ("torch", "lightning", "mlflow", "optuna", "pydantic")


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("argv", [["--help"], ["list"], ["list", "--verbose"]])
def test_help_and_list_import_nothing_heavy(argv):
    code = (
        "import sys\nfrom harness.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_list_shows_every_kind_and_broken_plugins(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('kaput')\n")
    assert main(["list", "--plugin", str(broken)]) == 0
    out = capsys.readouterr().out
    for kind in ("attention (", "position (", "model (", "task ("):
        assert kind in out
    assert "multi_head" in out and "broken" in out and "kaput" in out


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


BASE = {"task": {"name": "copy", "params": {"length": 4, "vocab": 4, "num_train": 64, "num_val": 32}},
        "model": {"name": "transformer", "params": {"d_model": 32, "layers": 1, "heads": 2}},
        "train": {"max_steps": 4, "batch_size": 16, "val_every": 2, "progress": False}}


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d["model"].update(attention={"name": "multihead"}), "Did you mean 'multi_head'"),
        (lambda d: d["train"].update(lr=-1), "train.lr: Input should be greater than 0"),
        (lambda d: d["task"]["params"].update(lenght=4), "did you mean 'length'"),
        (lambda d: d.update(modle={}), "modle: unknown field"),
        (lambda d: d["model"].update(position={"name": "sinusoidal", "params": {"base": "x"}}),
         "model.position.params.base"),
    ],
)
def test_config_errors_exit_2_with_one_paragraph(tmp_path, mutate, expected):
    data = json.loads(json.dumps(BASE))
    mutate(data)
    out = run_cli("train", str(_write(tmp_path, data)))
    assert out.returncode == 2, out.stderr
    assert expected in " ".join(out.stderr.split()), out.stderr
    assert "Traceback" not in out.stderr
    assert not (Path(os.environ["HARNESS_HOME"]) / "mlflow.db").exists()


def test_missing_file_and_bad_yaml_exit_2(tmp_path):
    out = run_cli("train", str(tmp_path / "nope.yaml"))
    assert out.returncode == 2 and "does not exist" in out.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: [unclosed\n")
    out = run_cli("train", str(bad))
    message = " ".join(out.stderr.split())
    assert out.returncode == 2 and "not valid YAML at line 2" in message and "Traceback" not in message


@pytest.mark.slow
def test_train_from_flags_end_to_end(tmp_path):
    out = run_cli("train", str(_write(tmp_path, BASE)), "--set", "train.max_steps=3",
                  "--position", "none", "--experiment", "cli")
    assert out.returncode == 0, out.stderr
    assert "FINISHED" in out.stdout and "val/acc" in out.stdout



@pytest.mark.slow
def test_ui_serves_the_project_store_on_loopback(registry, harness_home):
    import harness

    cfg = json.loads(json.dumps(BASE))
    cfg["tracking"] = {"experiment": "ui-check"}
    result = harness.train(cfg, registry=registry)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "ui", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_healthy(base, proc)
        req = urllib.request.Request(base + f"/api/2.0/mlflow/runs/get?run_id={result.run_id}")
        run = json.load(urllib.request.urlopen(req, timeout=10))["run"]
        assert run["info"]["status"] == "FINISHED"
        # a run that points tracking.uri at the server is recorded there, not locally
        cfg["tracking"] = {"experiment": "via-server", "uri": base}
        remote = harness.train(cfg, registry=registry)
        req = urllib.request.Request(base + f"/api/2.0/mlflow/runs/get?run_id={remote.run_id}")
        run = json.load(urllib.request.urlopen(req, timeout=10))["run"]
        assert run["info"]["status"] == "FINISHED"
        assert any(m["key"] == "val/acc" for m in run["data"]["metrics"])
        # only loopback: the port is not bound on other interfaces
        ps = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True)
        if ps.returncode == 0:
            assert all("127.0.0.1" in line for line in ps.stdout.splitlines() if line.strip())
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
