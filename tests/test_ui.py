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
import tempfile
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
from text import flat

from harness.cli import ui
from harness.cli.main import main
from harness.keys import Tag, curve_key, val_key
from harness.store.tracking import EXPERIMENT_KIND
from harness.study.storage import SUMMARY_GROUP

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
    sup = subprocess.Popen([sys.executable, "-m", "harness.cli.ui", "--supervise", str(os.getpid()), "--",
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
    err = flat(capsys.readouterr().err)  # one paragraph, wrapped
    assert f"port {port} on 127.0.0.1 is in use by another program" in err
    assert f"pid {os.getpid()}" in err and "--port" in err and "Traceback" not in err
    assert main(["ui", "--port", "70000"]) == 2
    assert "between 1 and 65535" in flat(capsys.readouterr().err)


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
    err = flat(capsys.readouterr().err)  # one paragraph, wrapped
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


def render(url: str, shot: Path, budget_ms: int = 15000, size: str = "1400,900") -> str:
    """The page as headless Chromium renders it (DOM after ``budget_ms`` of virtual time), and
    a screenshot of it; a fresh profile each time (no view state left from another page)."""
    def chromium(*args: str) -> str:
        with tempfile.TemporaryDirectory() as profile:
            flags = [CHROMIUM, "--no-sandbox", "--headless", "--disable-gpu", "--disable-quic",
                     "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                     "--hide-scrollbars", f"--virtual-time-budget={budget_ms}",
                     f"--window-size={size}"]
            return subprocess.run([*flags, *args, url], capture_output=True, text=True,
                                  timeout=180, check=True).stdout

    chromium(f"--screenshot={shot}")
    return chromium("--dump-dom")


def group_rows(dom: str, metric: str) -> dict[str, tuple[int, float]]:
    """The runs table's group rows as rendered: candidate -> (row index, the group's value of
    ``metric``)."""
    rows: dict[str, tuple[int, float]] = {}
    for chunk in dom.split('role="row"')[1:]:
        row = re.search(r'row-index="(\d+)" row-id="tag\.harness\.candidate\.([\w-]+)"', chunk[:400])
        value = re.search(r"cell-metrics\.`" + re.escape(metric) + r'`-\d+" class="ag-cell-value">'
                          r"<span[^>]*>([-0-9.e]+)", chunk)
        if row and value:
            rows[row[2]] = (int(row[1]), float(value[1]))
    return rows


PRUNING = {  # from test_study: slots 1 and 2 of mha draw an lr that does not learn: pruned at step 10
    "objective": {"metric": "loss", "length": 6}, "search": {"lr": [0.03, 1.0e-6]},
    "sampler": {"name": "random", "seed": 6}, "pruner": {"name": "median", "startup_trials": 1},
    "budget": {"trials": 3, "steps": 30}, "confirm": {"seeds": 2},
    "train": {"batch_size": 16, "val_every": 10, "warmup_steps": 0, "num_threads": 1},
}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_harness_ui_shows_a_tiny_study(tmp_path, capfd, harness_home):
    """A two-candidate study with a profile and pruned trials, then plain `harness ui --open`
    (the README's first command): it prints the study's links and opens the confirmation runs
    grouped by candidate, ranked by the objective, each group row the candidate's confirmed
    mean (the report's number, tuning and pruned trials left out); the tuning view shows the
    pruned trials as such; the chart view opens on the candidates' comparison, the cost charts
    last; the parent run's title and description's first lines say the verdict; per-length
    metrics are one value per run (step 0) and `extrapolation/*` has the length as its step;
    the short study name works; SIGTERM stops the server and its workers."""
    data = copy.deepcopy(TINY) | {"candidates": [CANDIDATE, nope()], "profiles": {"cpu": {}}} | PRUNING
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["study", "run", str(path), "--report"]) == 0
    lengths = [4, 6]  # the training length and task.eval_lengths
    out, err = capfd.readouterr()
    assert "progress: 1/10 trials" in out and "ETA" in out and "progress: 10/10 trials" in out
    verdict = out[out.rindex("\nverdict:"):]  # the answer, at the end
    assert "mean over 2 confirmation seed(s)" in flat(verdict)
    for noise in ("GPU available", "Tip:", "Creating initial MLflow database", " INFO ", "Warning"):
        assert noise not in out + err, f"library noise on the terminal: {noise!r}"

    # status and list are read-only and never touch MLflow; the file's name finds the study
    stores = {p: p.read_bytes() for p in harness_home.glob("*.db*")}
    check = ("import sys; from harness.cli.main import main; "
             "assert main(['study', 'status', 'tiny']) == 0; "
             "assert main(['study', 'list']) == 0; "
             "print('mlflow imported' if 'mlflow' in sys.modules else 'no mlflow')")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert "study tiny-cpu: complete" in done.stdout and "no mlflow" in done.stdout
    assert {p: p.read_bytes() for p in harness_home.glob("*.db*")} == stores

    port = free_port()
    browser = tmp_path / "browser.sh"  # --open: what webbrowser runs ($BROWSER), given the link
    browser.write_text(f"#!/bin/sh\necho \"$1\" > {tmp_path / 'opened'}\n")
    browser.chmod(0o755)
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "ui", "--open", "--port", str(port)],
                            env=dict(os.environ, BROWSER=str(browser)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        while not any(line.strip().startswith("experiment ") for line in lines):
            line = proc.stdout.readline()
            assert line, "harness ui exited: " + "".join(lines)
            lines.append(line)
        out = "".join(lines)
        base = f"http://127.0.0.1:{port}"
        links = dict(re.findall(r"^\s+(.+?)\s+(" + re.escape(base) + r"/#/\S+)$", out, re.M))
        runs_link = links["study tiny-cpu: candidates ranked (confirmation runs)"]
        parent_link = links["study tiny-cpu: verdict and ranked table (parent run)"]
        tuning_link = links["study tiny-cpu: tuning trials"]
        assert "workflowType=machine_learning" in runs_link and "viewStateShareKey=harness-tiny-cpu" in runs_link
        assert tuning_link.endswith("viewStateShareKey=harness-tiny-cpu-tuning")
        assert list(links).index("study tiny-cpu: candidates ranked (confirmation runs)") == 0
        assert ui.ASSISTANT_NOTE in out  # MLflow's Assistant panel: how to close it for good
        exp_id = urllib.parse.urlsplit(runs_link).fragment.split("/")[2]
        parent_id = parent_link.split("/runs/")[1].split("?")[0]
        deadline = time.monotonic() + 20
        while not (tmp_path / "opened").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "opened").read_text().strip() == runs_link

        # the views: confirmation runs grouped by candidate, ranked; tuning trials apart
        objective = val_key("loss", 6)
        exp = rest(base, "experiments/get", experiment_id=exp_id)["experiment"]
        exp_tags = {t["key"]: t["value"] for t in exp["tags"]}
        assert exp_tags[EXPERIMENT_KIND[0]] == EXPERIMENT_KIND[1]
        view = json.loads(exp_tags["mlflow.sharedViewState.harness-tiny-cpu"])
        assert view["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": Tag.CANDIDATE}]
        assert view["groupBy"]["aggregateFunction"] == "average"
        assert view["searchFilter"] == f"tags.`{Tag.PHASE}` = 'confirm'"
        assert view["orderByKey"] == f"metrics.`{objective}`" and view["orderByAsc"] is True  # loss
        assert view["selectedColumns"][0] == f"metrics.`{objective}`"
        tuning = json.loads(exp_tags["mlflow.sharedViewState.harness-tiny-cpu-tuning"])
        assert tuning["searchFilter"] == f"tags.`{Tag.PHASE}` = 'tune'"
        assert tuning["groupBy"]["aggregateFunction"] == "min"

        # the parent run is the summary
        parent = rest(base, "runs/get", run_id=parent_id)["run"]
        metrics = {m["key"]: m["value"] for m in parent["data"]["metrics"]}
        tags = {t["key"]: t["value"] for t in parent["data"]["tags"]}
        params = {p["key"] for p in parent["data"].get("params", [])}
        for cand in ("mha", "nope"):
            assert metrics[f"{cand}/ci_low"] <= metrics[f"{cand}/mean"] <= metrics[f"{cand}/ci_high"]
            assert {f"{cand}/{val_key('loss', n)}" for n in lengths} <= set(metrics)
        assert {metrics["mha/rank"], metrics["nope/rank"]} <= {1.0, 2.0}
        note = tags["mlflow.note.content"]
        assert note.startswith("Ranked by val/loss at length 6 (mean [95% Student t interval]")
        assert "| mha " in note and "| nope " in note and "Study tiny-cpu" in note and "@" not in note
        assert parent["info"]["run_name"].startswith("tiny-cpu · ")  # the verdict as its title
        assert params  # the protocol (budget, seeds, sampler, ...)
        assert tags[Tag.CANDIDATE] == SUMMARY_GROUP  # its own group in the grouped table

        # the children: readable names, tags to group by, one value per length and run
        found = post(base, "runs/search", {"experiment_ids": [exp_id], "max_results": 100,
                                           "filter": f"tags.`{Tag.PARENT_RUN}` = '{parent_id}'"})
        children = found["runs"]
        pruned = {r["info"]["run_name"] for r in children
                  if any(t["key"] == Tag.PRUNED for t in r["data"]["tags"])}
        assert pruned >= {"mha/tune/trial-1 (pruned)", "mha/tune/trial-2 (pruned)"}
        names = sorted(r["info"]["run_name"].removesuffix(" (pruned)") for r in children)
        assert names == sorted(f"{c}/{p}" for c in ("mha", "nope")
                               for p in ("tune/trial-0", "tune/trial-1", "tune/trial-2",
                                         "confirm/seed-1", "confirm/seed-2"))
        for run in children:
            ctags = {t["key"]: t["value"] for t in run["data"]["tags"]}
            cand, phase, which = run["info"]["run_name"].removesuffix(" (pruned)").split("/")
            assert ctags[Tag.CANDIDATE] == cand and ctags[Tag.PHASE] == phase
            assert run["info"]["status"] == "FINISHED"  # pruned ones too: nothing broke
            assert "mlflow.note.content" in ctags  # the first thing its page shows
            if phase == "confirm":
                assert ctags[Tag.SEED] == which.removeprefix("seed-")
            else:
                assert ctags[Tag.TRIAL_NUMBER] == which.removeprefix("trial-")
            if run["info"]["run_name"] in pruned:
                continue
            history = rest(base, "metrics/get-history", run_id=run["info"]["run_id"],
                           metric_key=curve_key("loss"))["metrics"]
            assert sorted(int(m["step"]) for m in history) == lengths
            metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
            assert {int(m["step"]): m["value"] for m in history} == {
                n: metrics[val_key("loss", n)] for n in lengths}
            for n in lengths:  # one value per run, at step 0: a bar in MLflow's charts
                per_length = rest(base, "metrics/get-history", run_id=run["info"]["run_id"],
                                  metric_key=val_key("loss", n))["metrics"]
                assert [int(m["step"]) for m in per_length] == [0]
            curve = rest(base, "metrics/get-history", run_id=run["info"]["run_id"],
                         metric_key=val_key("loss"))["metrics"]
            steps = sorted({int(m["step"]) for m in curve})  # the learning curve, validations
            assert len(steps) >= 3 and steps[0] > 0 and steps[-1] == 30  # and the final value last

        if os.environ.get("HARNESS_UI_BROWSER") == "required":  # the nox session `ui`
            assert CHROMIUM, "no chromium on PATH: install Debian's `chromium` package"
        if CHROMIUM:
            shots = Path(os.environ.get("HARNESS_UI_SHOTS", tmp_path))
            shots.mkdir(parents=True, exist_ok=True)
            # the first link: each candidate's confirmed mean, best first, as the report says
            dom = render(runs_link, shots / "runs.png")
            rows = group_rows(dom, objective)
            assert set(rows) == {"mha", "nope"}, "group rows missing from the rendered table"
            for cand, (_, value) in rows.items():
                assert value == pytest.approx(metrics[f"{cand}/mean"], rel=1e-9)
            assert sorted(rows, key=lambda c: rows[c][0]) == sorted(rows, key=lambda c: rows[c][1])
            assert "/tune/" not in dom and "Additional runs" not in dom
            assert (shots / "runs.png").stat().st_size > 10_000
            # the tuning trials: pruned ones named so, under their candidate
            dom = render(tuning_link, shots / "tuning.png")
            assert "mha/tune/trial-1 (pruned)" in dom and "/confirm/" not in dom
            icons = {}  # each run's status icon (its SVG path): pruned ones as the completed
            for chunk in dom.split('role="row"')[1:]:
                name = re.search(r">(\w+/tune/trial-\d+(?: \(pruned\))?)<", chunk)
                icon = re.search(r'cell-runDateAndNestInfo-\d+".*?<path fill="currentColor" d="([^"]+)"',
                                 chunk, re.S)
                if name and icon:
                    icons[name[1]] = icon[1]
            assert len(icons) == 6 and any(n.endswith(" (pruned)") for n in icons)
            assert len(set(icons.values())) == 1, "a pruned trial shows another status than a complete one"
            # the chart view opens on the comparison; the cost charts come last, collapsed
            dom = render(runs_link + "&compareRunsMode=CHART", shots / "charts.png", 40000, "1600,1200")
            first = dom.index("Candidates: confirmed means")
            assert first < dom.index(f">{objective}<") < dom.index(">cost<")
            assert first < dom.index(f">{curve_key('loss')}<") < dom.index(">cost<")
            # the parent run: the verdict in its title, the ranking above "Show more"
            dom = render(parent_link, shots / "parent.png", size="1400,1600")
            assert parent["info"]["run_name"] in dom
            ranked = re.search(r"<p>Ranked by val/loss at length 6 \(mean \[95% Student t interval\] "
                               r"over 2 confirmation seed\(s\); a shared rank: not resolved apart\): "
                               r"(?:<strong>)?1\. (\w+)", dom)
            assert ranked, "the ranking is not the description's first line"
            assert ranked.start() < dom.index("Show more")

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
