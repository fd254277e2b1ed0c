"""``harness ui``: the MLflow UI on 127.0.0.1, links that open on the runs, nothing left behind.

The processes::

    harness ui                    this process: waits, forwards Ctrl-C / SIGTERM / SIGHUP
     └─ supervisor                python -m harness.cli.ui --supervise PID -- mlflow server ...
         └─ mlflow server         its own session and process group, led by the supervisor
             └─ uvicorn (workers)

The supervisor leads the server's process group. It stops the whole group (SIGTERM, then
SIGKILL for what is left after 10 s) when it is told to (SIGTERM, SIGINT, SIGHUP), when
its parent dies (the kernel's parent-death signal, ``prctl(PR_SET_PDEATHSIG)``, on Linux;
elsewhere it notices within half a second), or when the server exits on its own. So
``harness ui`` killed in any way, even SIGKILL, leaves no server holding the port.

Links: MLflow 3 opens experiments in its GenAI view (traces, no runs table) unless told
otherwise, so the links name the machine-learning view
(``#/experiments/ID/runs?workflowType=machine_learning``), and the experiments the harness
creates carry ``mlflow.experimentKind`` (:data:`harness.store.tracking.EXPERIMENT_KIND`). The
server is asked over its REST API; this process never imports mlflow.

Plain ``harness ui`` prints, for each study of the project's storage recorded in the store it
serves (the most recent first), the study's links (:func:`study_links`): its candidates (the
confirmation runs grouped and ranked), its parent run (the verdict) and its tuning trials;
then each experiment. The views the links open are stored on the experiment first
(:func:`harness.study.summary.study_views`, over the REST API), so a study created by an
earlier version opens the current ones. ``--open`` opens the first link where a browser can
show it without taking over the terminal (:func:`can_open_browser`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import HarnessError, shorten
from harness.runtime.children import die_with_parent

HOST = "127.0.0.1"
#: MLflow 3.17 opens its Assistant panel by itself on a browser's first visit to a local server
#: (a flag in the browser's localStorage; no server setting or environment variable turns it
#: off), over a third of the page's width: say how to get the page back.
ASSISTANT_NOTE = ("  (MLflow opens its Assistant panel on a browser's first visit to a local server; "
                  "close it once with its × and it stays closed in that browser)")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
GRACE_S = 10.0


# -- links ----------------------------------------------------------------------------------------
def experiment_link(base: str, experiment_id: str, view: str | None = None) -> str:
    """The runs table (``view``: a shared view state stored on the experiment)."""
    shared = f"&viewStateShareKey={urllib.parse.quote(view)}" if view else ""
    return f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning{shared}"


def run_link(base: str, experiment_id: str, run_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"


def rest(base: str, endpoint: str, **params: Any) -> dict[str, Any]:
    """GET ``/api/2.0/mlflow/<endpoint>`` as JSON."""
    url = f"{base}/api/2.0/mlflow/{endpoint}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as response:
        return dict(json.load(response))


def post(base: str, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` as JSON to ``/api/2.0/mlflow/<endpoint>``."""
    req = urllib.request.Request(f"{base}/api/2.0/mlflow/{endpoint}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as response:
        return dict(json.load(response))


@dataclass
class StudyRef:
    name: str
    parent_run_id: str
    tracking_uri: str
    views: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> shared view state
    created: float = 0.0


def _ref(handle: Any) -> StudyRef:
    from harness.study.summary import study_views

    return StudyRef(handle.name, handle.parent_run_id, str(handle.record.get("tracking_uri", "")),
                    study_views(handle.name, handle.config, handle.record),
                    float(handle.record.get("created", 0.0)))


def find_study(name: str, storage_url: str | None) -> StudyRef:
    """A study's parent run and tracking store, from its record (storage opened read-only)."""
    from harness.study.storage import open_storage, open_study

    storage = open_storage(storage_url, read_only=True)
    return _ref(open_study(name, storage, storage_url or "the default storage", check_tracking=False))


MAX_STUDIES = 5  # plain `harness ui` prints the links of the most recent studies


def local_studies(uri: str, storage_url: str | None = None) -> list[StudyRef]:
    """The studies of the storage (default: the project's) recorded in the tracking store
    ``uri``, the most recent first (none when there is no SQLite storage yet: nothing is
    created)."""
    from harness.study.storage import open_storage, open_study, study_names
    from harness.study.storage import storage_url as resolved

    url = resolved(storage_url)  # --storage, else $HARNESS_STORAGE, else the project's
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return []
    try:
        storage = open_storage(url, read_only=True)
        refs = []
        for name in study_names(storage):
            handle = open_study(name, storage, url, check_tracking=False)
            if handle.record.get("ready") and handle.record.get("tracking_uri") == uri:
                refs.append(_ref(handle))
    except HarnessError:  # a storage it cannot read: the experiments' links still help
        return []
    return sorted(refs, key=lambda r: -r.created)


def links(base: str, study: StudyRef | None, others: Sequence[StudyRef] = ()) -> list[tuple[str, str]]:
    """(what, link) pairs: a study's views and parent run (``study``, or each of ``others``,
    the studies of the store, most recent first), then each experiment's runs."""
    if study is not None:
        return study_links(base, study, strict=True)
    out = []
    for ref in list(others)[:MAX_STUDIES]:
        out += study_links(base, ref, strict=False)
    if len(others) > MAX_STUDIES:
        names = [r.name for r in others[MAX_STUDIES:]]
        older = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        out.append((f"{len(others) - MAX_STUDIES} older studies ({older}):",
                    "harness ui --study NAME"))
    found = rest(base, "experiments/search", max_results=50).get("experiments", [])
    found.sort(key=lambda e: -int(e.get("last_update_time", 0)))
    return out + [(f"experiment {e['name']}", experiment_link(base, str(e["experiment_id"])))
                  for e in found if e["name"] != "Default" or len(found) == 1]


def study_links(base: str, study: StudyRef, strict: bool) -> list[tuple[str, str]]:
    """A study's links: its candidates (the confirmation runs grouped and ranked), its tuning
    trials and its parent run (the verdict). The views are stored on the experiment first
    (over the REST API), so a study created by an earlier version opens them too.
    ``strict``: a parent run missing from this store is an error, else the study is skipped."""
    from harness.study.summary import TUNING, VIEW_TAG, view_key

    try:
        run = rest(base, "runs/get", run_id=study.parent_run_id)["run"]
    except urllib.error.HTTPError:
        if not strict:
            return []
        raise HarnessError(
            f"the parent run {study.parent_run_id} of study '{study.name}' is not in the "
            f"tracking store this UI serves; the study was recorded in {study.tracking_uri}: "
            f"pass --tracking-uri {study.tracking_uri}."
        ) from None
    exp = str(run["info"]["experiment_id"])
    tags = {t["key"]: t["value"] for t in
            rest(base, "experiments/get", experiment_id=exp)["experiment"].get("tags", [])}
    for key, state in study.views.items():
        value = json.dumps(state)
        if tags.get(VIEW_TAG + key) != value:
            with contextlib.suppress(OSError):  # a read-only server: the views it has
                post(base, "experiments/set-experiment-tag",
                     {"experiment_id": exp, "key": VIEW_TAG + key, "value": value})
                tags[VIEW_TAG + key] = value

    def view(key: str) -> str | None:
        return key if VIEW_TAG + key in tags else None

    name = study.name
    return [(f"study {name}: candidates ranked (confirmation runs)",
             experiment_link(base, exp, view(view_key(name)))),
            (f"study {name}: verdict and ranked table (parent run)",
             run_link(base, exp, study.parent_run_id)),
            (f"study {name}: tuning trials", experiment_link(base, exp, view(view_key(name, TUNING))))]


# -- the port -------------------------------------------------------------------------------------
def port_free(port: int) -> bool:
    """Whether the server could listen on ``port``: like uvicorn, with SO_REUSEADDR, so the
    TIME_WAIT connections a just-stopped UI leaves do not count as a listener."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def port_owner(port: int) -> int | None:
    """The pid of the process listening on 127.0.0.1:``port`` (Linux; None if unknown)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(proc.name)
    return None


def busy_port_error(port: int) -> HarnessError:
    base = f"http://{HOST}:{port}"
    pid = port_owner(port)
    who = f" (pid {pid}: {_cmdline(pid)})" if pid else ""
    try:
        urllib.request.urlopen(base + "/health", timeout=2)
        what = (f"an MLflow server already listens on {base}{who}, perhaps left over from an "
                f"earlier `harness ui` that was killed. Use it as it is, stop it"
                + (f" (`kill {pid}`)" if pid else "") + ", or pass --port N for a new one.")
    except OSError:
        what = (f"port {port} on {HOST} is in use by another program{who}. Pass --port N "
                f"(any free port) or stop that program.")
    return HarnessError(what)


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "unknown command"
    return raw.strip()[:120]


# -- harness ui -----------------------------------------------------------------------------------
def server_command(port: int, quiet: bool) -> list[str]:
    """The ``mlflow server`` line: no store URI on it (see :func:`server_env`)."""
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", HOST, "--port", str(port),
           "--workers", "1"]
    if quiet:
        cmd += ["--uvicorn-opts", "--log-level warning"]
    return cmd


def server_env(uri: str) -> dict[str, str]:
    """The server's stores, through the variables ``mlflow server`` reads for its options: a
    database URI may hold a password, and a process's command line is readable by every local
    user (``/proc/PID/cmdline``); its environment is not."""
    from harness.store import tracking

    env = {"MLFLOW_BACKEND_STORE_URI": uri, "MLFLOW_REGISTRY_STORE_URI": uri}
    if not uri.startswith(("http://", "https://")):  # never ./mlruns of the folder it started in
        env["MLFLOW_DEFAULT_ARTIFACT_ROOT"] = (os.environ.get(tracking.ENV_ARTIFACTS)
                                               or tracking.artifact_root().as_uri())
    return env


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        self.signum = signum


def run(args: argparse.Namespace) -> int:
    """``harness ui``: start the server under a supervisor, print (and open) the links, wait."""
    from harness.store import tracking

    if not 0 < args.port < 65536:
        raise HarnessError(f"--port {args.port} is not a TCP port; give one between 1 and 65535.")
    study = find_study(args.study, args.storage) if args.study else None
    explicit = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    uri = tracking.tracking_uri(explicit or (study.tracking_uri if study else None))
    others = local_studies(uri, args.storage) if study is None else []
    if uri.startswith(("http://", "https://")):  # a tracking server: its UI is already there
        base = tracking.without_credentials(uri).rstrip("/")
        tracking.probe_server(base)  # seconds; then a refused or failing request is one paragraph
        try:
            found = links(base, study, others)
        except (OSError, ValueError, KeyError) as exc:  # URLError is an OSError
            raise HarnessError(f"the MLflow server {_redact(base)} did not answer its REST API "
                               f"({type(exc).__name__}: {shorten(str(exc), 200)}). Check the URI "
                               f"and that it is an MLflow server.") from None
        _show(found, args.open)
        return 0
    if not port_free(args.port):
        raise busy_port_error(args.port)
    base = f"http://{HOST}:{args.port}"
    print(f"starting the MLflow UI on {base} over {_redact(uri)} ...", flush=True)
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", **server_env(uri))
    # quiet (no --verbose): the server's start-up chatter goes to a log file
    log = tracking.home() / "logs" / "mlflow-ui.log" if args.quiet else None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") if log is not None else contextlib.nullcontext() as out:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "harness.cli.ui", "--supervise", str(os.getpid()), "--",
             *server_command(args.port, args.quiet)],
            env=env, start_new_session=True, stdout=out, stderr=out)
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}

    def stop(signum: int, _frame: Any) -> None:
        raise _Stop(signum)

    for s in STOP_SIGNALS:
        signal.signal(s, stop)
    try:
        wait_until_healthy(base, supervisor, log)
        print(f"MLflow UI: {base}  (Ctrl-C stops it)")
        print(ASSISTANT_NOTE)
        _show(links(base, study, others), args.open)
        return supervisor.wait()
    except (_Stop, KeyboardInterrupt) as exc:
        signum = exc.signum if isinstance(exc, _Stop) else signal.SIGINT
        print("\nstopping the MLflow UI ...", file=sys.stderr, flush=True)
        return 0 if signum == signal.SIGINT else 128 + signum
    finally:
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        _stop_supervisor(supervisor)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _show(found: list[tuple[str, str]], open_first: bool) -> None:
    width = max((len(what) for what, _ in found), default=0)
    for what, link in found:
        print(f"  {what:<{width}}  {link}")
    if not found:
        print("  no experiments yet: run `harness train ...` or `harness study run FILE`")
    sys.stdout.flush()
    if open_first and found:
        if not can_open_browser():
            print("  --open: no display here (DISPLAY, WAYLAND_DISPLAY and BROWSER unset): open "
                  "the first link in a browser yourself")
            return
        import webbrowser

        webbrowser.open(found[0][1])


def can_open_browser() -> bool:
    """Whether ``--open`` can show a page without taking over this terminal: a graphical
    display on Linux and the BSDs, any platform else, or ``$BROWSER`` set by the user (Python's
    fallback on a machine without a display is a text browser in the terminal)."""
    if not sys.platform.startswith(("linux", "freebsd", "openbsd", "netbsd")):
        return True
    return any(os.environ.get(v) for v in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER"))


def _redact(uri: str) -> str:
    from harness.study.storage import redact

    return redact(uri)


def wait_until_healthy(base: str, supervisor: subprocess.Popen[bytes], log: Path | None,
                       timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(base + "/health", timeout=2)
            return
        except OSError:
            if supervisor.poll() is not None:
                where = "above" if log is None else f"in {log}"
                tail = "" if log is None else ": " + " ".join(
                    log.read_text(errors="replace").strip().splitlines()[-3:])
                raise HarnessError(
                    f"the MLflow server did not start (exit code {supervisor.returncode}); its "
                    f"messages are {where}{tail}"
                ) from None
            if time.monotonic() > deadline:
                raise HarnessError(f"the MLflow server did not answer at {base} within "
                                   f"{timeout_s:.0f} s.") from None
            time.sleep(0.3)


def _stop_supervisor(supervisor: subprocess.Popen[bytes]) -> None:
    if supervisor.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            supervisor.send_signal(signal.SIGTERM)
    try:
        supervisor.wait(timeout=GRACE_S + 5)
    except subprocess.TimeoutExpired:  # it could not stop the group: do it from here
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(supervisor.pid, signal.SIGKILL)
        supervisor.wait()


# -- the supervisor -------------------------------------------------------------------------------
def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` other than this one (Linux's /proc)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(proc.name))
    return out


def stop_group(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM to this process group (not to this process), SIGKILL to what is left later."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    pgid = os.getpgrp()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        if not _left(pgid, child):
            return
        time.sleep(0.1)
    for pid in _left(pgid, child):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    child.wait()


def _left(pgid: int, child: subprocess.Popen[bytes]) -> list[int]:
    """The group's processes still alive (without /proc: the server's own process only)."""
    child.poll()
    if Path("/proc/self/stat").exists():
        return group_members(pgid)
    return [] if child.returncode is not None else [child.pid]


def supervise(parent: int, command: list[str]) -> int:
    """Run ``command`` in this process's group until told to stop or the parent is gone."""
    stopping: list[int] = []
    for s in STOP_SIGNALS:
        signal.signal(s, lambda signum, _frame: stopping.append(signum))
    die_with_parent()
    if os.getppid() != parent:  # it died before the kernel knew to tell us
        return 0
    child = subprocess.Popen(command)
    code = 0
    try:
        while not stopping and os.getppid() == parent:
            try:
                code = child.wait(timeout=0.5)
                break  # the server exited by itself
            except subprocess.TimeoutExpired:
                continue
    finally:
        stop_group(child)
    return code


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--supervise" and sys.argv[3] == "--":
        sys.exit(supervise(int(sys.argv[2]), sys.argv[4:]))
    sys.exit("usage: python -m harness.cli.ui --supervise PARENT_PID -- COMMAND ...")
