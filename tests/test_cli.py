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
from text import flat

from harness.cli.main import main

HEAVY = ("torch", "lightning", "mlflow", "optuna", "pydantic")


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("argv", [["--help"], ["list"], ["list", "--verbose"]])
def test_help_and_a_repeated_list_import_nothing_heavy(argv):
    code = (
        "import sys\nfrom harness.cli.main import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    if argv[0] == "list":  # the first listing loads the plugins (torch) and caches the result
        first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert "torch" in first.stdout.strip().splitlines()[-1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_list_shows_every_kind_and_broken_plugins(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('kaput')\n")
    assert main(["list", "--plugin", str(broken)]) == 0
    out = capsys.readouterr().out
    for kind in ("attention (", "mixer (", "position (", "model (", "task ("):
        assert kind in out
    assert "multi_head" in out and "broken" in out and "kaput" in out


def test_the_cached_listing_follows_changes_to_a_plugin_file(tmp_path, capsys):
    plugin = tmp_path / "mine.py"
    source = (
        "from harness.plugin import TaskSpec, hookimpl\n"
        "from harness_plugins.tasks.copy import CopyTask\n"
        "@hookimpl\ndef harness_register_task(register):\n"
        "    register(TaskSpec(name='{name}', build=CopyTask))\n"
    )
    plugin.write_text(source.format(name="first_name"))
    assert main(["list", "--kind", "task", "--plugin", str(plugin)]) == 0
    assert "first_name" in capsys.readouterr().out
    plugin.write_text(source.format(name="second_name"))
    os.utime(plugin, ns=(plugin.stat().st_atime_ns, plugin.stat().st_mtime_ns + 10**9))
    assert main(["list", "--kind", "task", "--plugin", str(plugin)]) == 0
    out = capsys.readouterr().out
    assert "second_name" in out and "first_name" not in out


def test_a_plugin_that_exits_or_imports_slowly_is_named_and_the_rest_load(tmp_path):
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(3)\n")
    slow = tmp_path / "slow.py"
    slow.write_text("import time\ntime.sleep(0.6)\n")
    out = run_cli("list", "--plugin", str(exits), "--plugin", str(slow))
    assert out.returncode == 0, out.stderr
    assert "exits" in out.stdout and "SystemExit: 3" in out.stdout
    assert "multi_head" in out.stdout
    warning = next(line for line in out.stdout.splitlines() if "slow takes" in line)
    assert float(warning.split("slow takes ")[1].split(" s")[0]) >= 0.6


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
    assert expected in flat(out.stderr), out.stderr
    assert "Traceback" not in out.stderr
    assert not (Path(os.environ["HARNESS_HOME"]) / "mlflow.db").exists()


def test_missing_file_and_bad_yaml_exit_2(tmp_path):
    out = run_cli("train", str(tmp_path / "nope.yaml"))
    assert out.returncode == 2 and "does not exist" in flat(out.stderr)
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: [unclosed\n")
    out = run_cli("train", str(bad))
    message = flat(out.stderr)
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


def test_train_prints_no_library_chatter_unless_verbose(tmp_path):
    """Issue 11: no "GPU available" lines, no Lightning tips, no MLflow INFO lines (a check
    that re-enabled logging once let them all back)."""
    env = {**os.environ, "HARNESS_HOME": str(tmp_path / ".harness"), "OMP_WAIT_POLICY": "PASSIVE"}
    args = [sys.executable, "-c", "import sys; from harness.cli.main import main; sys.exit(main())", "train", "--task", "copy", "--model", "transformer",
            "--max-steps", "2", "--no-progress", "--set", "train.num_threads=1"]
    quiet = subprocess.run(args, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    for noise in ("GPU available", "litlogger", "Trainer.fit", "INFO"):
        assert noise not in quiet.stdout + quiet.stderr, noise
    loud = subprocess.run([*args[:3], "--verbose", *args[3:]], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert "GPU available" in loud.stdout + loud.stderr
