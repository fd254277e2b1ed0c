"""``harness ui``: a real ``mlflow server`` on 127.0.0.1 after a tiny study, read over its REST
API (and rendered in headless Chromium where Debian's ``chromium`` is installed); the
supervisor that takes the server's whole process group down with it; the busy-port messages."""

from __future__ import annotations

import copy
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from servers import free_port
from test_study import CANDIDATE, TINY, nope

from harness import ui
from harness.cli import main
from harness.keys import Tag, curve_key, val_key
from harness.study.storage import SUMMARY_GROUP
from harness.tracking import EXPERIMENT_KIND

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no longer counts)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_gone(pids: list[int], timeout_s: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


# -- the supervisor --------------------------------------------------------------------------------
SERVER = textwrap.dedent("""\
    import subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a uvicorn worker
    print(worker.pid, flush=True)
    time.sleep(600)
""")
PARENT = textwrap.dedent("""\
    import os, subprocess, sys, time
    sup = subprocess.Popen([sys.executable, "-m", "harness.ui", "--supervise", str(os.getpid()), "--",
                            sys.executable, "-c", sys.argv[1]], start_new_session=True)
    print(sup.pid, flush=True)
    time.sleep(600)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_the_server_group_dies_with_a_parent_killed_by_sigkill():
    """`harness ui` killed with SIGKILL (no handler runs) still takes the server and its
    workers down: the kernel's parent-death signal reaches the supervisor, which stops its
    whole process group."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, SERVER], stdout=subprocess.PIPE, text=True)
    try:
        supervisor = int(parent.stdout.readline())
        deadline = time.monotonic() + 20
        while len(below := descendants(supervisor)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(below) == 2, "the server and its worker should have started"
        assert all(os.getpgid(p) == supervisor for p in below)  # one group, led by the supervisor
        parent.kill()  # SIGKILL: nothing in `harness ui` gets to clean up
        parent.wait()
        assert wait_gone([supervisor, *below]) == []
    finally:
        parent.kill()


# -- busy ports ------------------------------------------------------------------------------------
def test_a_port_held_by_another_program_is_named_with_its_owner(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["ui", "--port", str(port)]) == 2
    err = " ".join(capsys.readouterr().err.split())  # one paragraph, wrapped
    assert f"port {port} on 127.0.0.1 is in use by another program" in err
    assert f"pid {os.getpid()}" in err and "--port" in err and "Traceback" not in err
    assert main(["ui", "--port", "70000"]) == 2
    assert "between 1 and 65535" in capsys.readouterr().err


def test_a_left_over_mlflow_server_is_recognised(capsys):
    """Something answering /health on the port: an MLflow server left behind; say how to
    stop it (its pid) instead of starting a second one."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert main(["ui", "--port", str(port)]) == 2
    finally:
        server.shutdown()
        server.server_close()
    err = " ".join(capsys.readouterr().err.split())  # one paragraph, wrapped
    assert f"an MLflow server already listens on http://127.0.0.1:{port}" in err
    assert f"`kill {os.getpid()}`" in err


def test_a_just_stopped_ui_does_not_leave_its_port_busy():
    """Connections in TIME_WAIT after a server stopped do not make the port look taken."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server side closes first: its end goes to TIME_WAIT
        client.close()
        assert not ui.port_free(port)  # still listening
    assert ui.port_free(port)


# -- a tiny study in the UI ----------------------------------------------------------------------
def rest(base: str, endpoint: str, **params: Any) -> dict[str, Any]:
    return ui.rest(base, endpoint, **params)


def post(base: str, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"{base}/api/2.0/mlflow/{endpoint}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as response:
        return dict(json.load(response))


def render(url: str, shot: Path) -> str:
    """The page as headless Chromium renders it (DOM after 15 s of virtual time), and a
    screenshot of it."""
    flags = [CHROMIUM, "--no-sandbox", "--headless", "--disable-gpu", "--hide-scrollbars",
             "--virtual-time-budget=15000", "--window-size=1400,900"]
    subprocess.run([*flags, f"--screenshot={shot}", url], capture_output=True, timeout=120, check=True)
    return subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120,
                          check=True).stdout


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_harness_ui_shows_a_tiny_study(tmp_path, capfd):
    """A two-candidate study, then `harness ui --study`: the experiment opens on the runs
    table, the parent run is the summary, the children are named and tagged, the per-length
    curve has the length as its step, the deep link renders the run names (Chromium), and
    SIGTERM to `harness ui` stops the server and its workers."""
    data = copy.deepcopy(TINY) | {"candidates": [CANDIDATE, nope()], "budget": {"trials": 1, "steps": 10}}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    storage, uri = f"sqlite:///{tmp_path / 'optuna.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["study", "run", str(path), "--storage", storage, "--tracking-uri", uri]) == 0
    lengths = [4, 6]  # the training length and task.eval_lengths
    out, err = capfd.readouterr()
    assert "progress: 1/6 trials" in out and "ETA" in out and "progress: 6/6 trials" in out
    for noise in ("GPU available", "Tip:", "Creating initial MLflow database", " INFO ", "Warning"):
        assert noise not in out + err, f"library noise on the terminal: {noise!r}"

    # status and list are read-only and never touch MLflow
    stores = {p: p.read_bytes() for p in tmp_path.glob("*.db*")}
    check = ("import sys; from harness.cli import main; "
             f"assert main(['study', 'status', 'tiny', '--storage', '{storage}']) == 0; "
             f"assert main(['study', 'list', '--storage', '{storage}']) == 0; "
             "print('mlflow imported' if 'mlflow' in sys.modules else 'no mlflow')")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert "study tiny: complete" in done.stdout and "no mlflow" in done.stdout
    assert {p: p.read_bytes() for p in tmp_path.glob("*.db*")} == stores

    port = free_port()
    browser = tmp_path / "browser.sh"  # --open: what webbrowser runs ($BROWSER), given the link
    browser.write_text(f"#!/bin/sh\necho \"$1\" > {tmp_path / 'opened'}\n")
    browser.chmod(0o755)
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "ui", "--study", "tiny", "--open",
                             "--storage", storage, "--port", str(port)],
                            env=dict(os.environ, BROWSER=str(browser)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        while not any("summary (parent run)" in line for line in lines):
            line = proc.stdout.readline()
            assert line, "harness ui exited: " + "".join(lines)
            lines.append(line)
        out = "".join(lines)
        base = f"http://127.0.0.1:{port}"
        runs_link, parent_link = re.findall(re.escape(base) + r"/#/experiments/\S+", out)
        assert "workflowType=machine_learning" in runs_link and "viewStateShareKey=harness-tiny" in runs_link
        exp_id = urllib.parse.urlsplit(runs_link).fragment.split("/")[2]
        parent_id = parent_link.split("/runs/")[1].split("?")[0]
        deadline = time.monotonic() + 20
        while not (tmp_path / "opened").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "opened").read_text().strip() == runs_link

        # the experiment opens on the machine-learning runs table, grouped by candidate
        exp = rest(base, "experiments/get", experiment_id=exp_id)["experiment"]
        exp_tags = {t["key"]: t["value"] for t in exp["tags"]}
        assert exp_tags[EXPERIMENT_KIND[0]] == EXPERIMENT_KIND[1]
        view = json.loads(exp_tags["mlflow.sharedViewState.harness-tiny"])
        assert view["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": Tag.CANDIDATE}]

        # the parent run is the summary
        parent = rest(base, "runs/get", run_id=parent_id)["run"]
        metrics = {m["key"]: m["value"] for m in parent["data"]["metrics"]}
        tags = {t["key"]: t["value"] for t in parent["data"]["tags"]}
        params = {p["key"] for p in parent["data"].get("params", [])}
        for cand in ("mha", "nope"):
            assert metrics[f"{cand}/ci_low"] <= metrics[f"{cand}/mean"] <= metrics[f"{cand}/ci_high"]
            assert {f"{cand}/{val_key('acc', n)}" for n in lengths} <= set(metrics)
        assert {metrics["mha/rank"], metrics["nope/rank"]} <= {1.0, 2.0}
        note = tags["mlflow.note.content"]
        assert "| mha " in note and "| nope " in note and "Study tiny" in note
        assert params  # the protocol (budget, seeds, sampler, ...)
        assert tags[Tag.CANDIDATE] == SUMMARY_GROUP  # its own group in the grouped table

        # the children: readable names, tags to group by, per-length curves with step = length
        found = post(base, "runs/search", {"experiment_ids": [exp_id], "max_results": 100,
                                           "filter": f"tags.`{Tag.PARENT_RUN}` = '{parent_id}'"})
        children = found["runs"]
        names = sorted(r["info"]["run_name"] for r in children)
        assert names == sorted(f"{c}/{p}" for c in ("mha", "nope")
                               for p in ("tune/trial-0", "confirm/seed-1", "confirm/seed-2"))
        for run in children:
            ctags = {t["key"]: t["value"] for t in run["data"]["tags"]}
            cand, phase, which = run["info"]["run_name"].split("/")
            assert ctags[Tag.CANDIDATE] == cand and ctags[Tag.PHASE] == phase
            if phase == "confirm":
                assert ctags[Tag.SEED] == which.removeprefix("seed-")
            else:
                assert ctags[Tag.TRIAL_NUMBER] == which.removeprefix("trial-")
            history = rest(base, "metrics/get-history", run_id=run["info"]["run_id"],
                           metric_key=curve_key("acc"))["metrics"]
            assert sorted(int(m["step"]) for m in history) == lengths
            flat = {m["key"]: m["value"] for m in run["data"]["metrics"]}
            assert {int(m["step"]): m["value"] for m in history} == {
                n: flat[val_key("acc", n)] for n in lengths}

        if os.environ.get("HARNESS_UI_BROWSER") == "required":  # the nox session `ui`
            assert CHROMIUM, "no chromium on PATH: install Debian's `chromium` package"
        if CHROMIUM:  # the deep link renders the runs table with the run names
            shots = Path(os.environ.get("HARNESS_UI_SHOTS", tmp_path))
            shots.mkdir(parents=True, exist_ok=True)
            dom = render(runs_link, shots / "runs.png")
            assert all(name in dom for name in names), "run names missing from the rendered page"
            # grouped by candidate: every run in a named group, the parent under its own name
            assert SUMMARY_GROUP in dom and "Additional runs" not in dom
            assert (shots / "runs.png").stat().st_size > 10_000

        # SIGTERM to `harness ui`: the supervisor, the server and its workers all stop
        group = descendants(proc.pid)
        assert len(group) >= 2  # the supervisor and `mlflow server` (+ uvicorn)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert wait_gone(group) == []
        assert ui.port_free(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
