"""``harness study run --workers N``: several workers on one machine from one command, on the
default SQLite store; the extra workers die with the command, however it ends."""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from test_study_workers import STUDY as SHARED

# the two-candidate study of the PostgreSQL worker tests, smaller, on the default SQLite store
STUDY = copy.deepcopy(SHARED) | {
    "name": "local", "budget": {"trials": 2, "steps": 10},
    "train": {"batch_size": 16, "val_every": 10, "num_threads": 1, "log_attention": False},
    "resume": {"heartbeat_s": 1, "grace_s": 10, "poll_s": 0.2},
}


def _harness(*args: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "harness.cli", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_two_workers_from_one_command_share_the_study(tmp_path, harness_home):
    path = tmp_path / "local.yaml"
    # trials long enough (about 1.5 s each) that the second worker, which needs a few seconds
    # to import torch and open the stores, joins before the first has run them all
    path.write_text(yaml.safe_dump(dict(STUDY, budget={"trials": 3, "steps": 80})))
    p = _harness("study", "run", str(path), "--workers", "2", "--report", "--out", str(tmp_path / "rep"),
                 "--format", "json")
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out
    assert "starting 1 more worker(s)" in out
    log = harness_home / "logs" / "local-worker-1.log"
    child = log.read_text()
    mine = int(re.search(r"this worker ran (\d+) trial", out).group(1))
    theirs = int(re.search(r"this worker ran (\d+) trial", child).group(1))
    total = 2 * (3 + STUDY["confirm"]["seeds"])
    assert mine + theirs == total and mine > 0 and theirs > 0, (out, child)
    assert (tmp_path / "rep" / "summary.json").exists()
    assert "report:" not in child  # only the command that was asked writes the report
    storage = f"sqlite:///{harness_home / 'optuna.db'}"
    for cand in ("sin", "nope"):
        for name, slots in ((f"local/{cand}", 3), (f"local/{cand}/confirm", 2)):
            trials = optuna.load_study(study_name=name, storage=storage).get_trials()
            assert [t.number for t in trials] == list(range(slots))  # unique, none extra
            assert sorted(t.user_attrs["harness.slot"] for t in trials) == list(range(slots))
            assert all(t.state == TrialState.COMPLETE for t in trials)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_extra_workers_die_when_the_command_is_killed(tmp_path, harness_home):
    study = dict(STUDY, budget={"trials": 50, "steps": 400})
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(study))
    p = _harness("study", "run", str(path), "--workers", "3")
    deadline = time.monotonic() + 120
    while len(_children(p.pid)) < 2 and time.monotonic() < deadline:
        assert p.poll() is None, p.communicate()[0]
        time.sleep(0.1)
    workers = _children(p.pid)
    assert len(workers) == 2 and all(_alive(w) for w in workers)
    p.send_signal(signal.SIGKILL)  # no cleanup code runs in the command
    p.communicate(timeout=30)
    deadline = time.monotonic() + 60
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers), "an extra worker outlived the command"


def test_workers_out_of_range_is_a_usage_error(tmp_path):
    from harness.cli.main import main

    for bad in ("0", "-1", "two", "65"):
        with pytest.raises(SystemExit) as exc:
            main(["study", "run", str(tmp_path / "x.yaml"), "--workers", bad])
        assert exc.value.code == 2
