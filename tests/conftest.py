"""Shared fixtures: every test gets its own project-local store; torch stays polite on 2 cores."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import signal  # noqa: E402

import pytest  # noqa: E402

# The Ctrl-C tests send SIGINT to the commands they start, as a terminal would. A shell that
# starts pytest in the background without job control (`cmd &` in a script, nohup) ignores
# SIGINT for it, and an ignored signal stays ignored in every process started below, so those
# commands would never see the press: Python's own handler back, as in a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def harness_home(tmp_path, monkeypatch):
    """An empty HARNESS_HOME per test; no inherited tracking URI or plugin filters."""
    home = tmp_path / ".harness"
    monkeypatch.setenv("HARNESS_HOME", str(home))
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))  # never the user's cache
    monkeypatch.setenv("HARNESS_WORKERS_DIR", str(tmp_path / "workers"))  # workers of this test only
    # every space of a CLI paragraph a line break (harness.errors.fill): a test asserting a phrase
    # on wrapped text fails every time, not by a path's length (assert on tests/text.py's flat)
    monkeypatch.setenv("HARNESS_WRAP_WIDTH", "1")
    for var in ("MLFLOW_TRACKING_URI", "HARNESS_PLUGINS", "HARNESS_DISABLE_PLUGINS",
                "HARNESS_NO_AUTOLOAD", "HARNESS_TRACE_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return home


@pytest.fixture(scope="session", autouse=True)
def _torch_threads():
    try:
        import torch
    except ImportError:  # pragma: no cover
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def registry():
    """All installed plugins, loaded once per session."""
    import harness

    return harness.load_plugins()


# -- no test leaks threads ------------------------------------------------------------------------
# A suite that leaked a thread or two per test grew to about 4,100 threads (issue 40): where a
# container caps a process's tasks (a pids limit of 4,096 is common) it died with "can't start
# new thread". After every test the process's threads are counted (the kernel's count: torch's
# OpenMP workers and other native threads included); past the bound, the test that crossed it
# errors, naming the threads by kind. The bound leaves room for the pools that grow with the
# machine (OpenMP, torch's inter-op pool, Arrow's: one thread per core each) and is set with
# $HARNESS_TEST_MAX_THREADS.
def thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: Python's own threads
        import threading

        return threading.active_count()


def thread_bound() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return int(os.environ.get("HARNESS_TEST_MAX_THREADS") or 4 * cores + 100)


def thread_kinds() -> str:
    """The threads alive, counted by name (Python's names, and the kernel's for the rest)."""
    import collections
    import threading

    kinds = collections.Counter(t.name.rstrip("0123456789_-") for t in threading.enumerate())
    native: collections.Counter[str] = collections.Counter()
    for comm in Path("/proc/self/task").glob("*/comm"):
        with contextlib.suppress(OSError):
            native[comm.read_text().strip()] += 1
    return f"Python threads {dict(kinds)}; all threads by kernel name {dict(native)}"


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    count, bound = thread_count(), thread_bound()
    if count > bound:
        pytest.fail(f"this process has {count} threads after {item.nodeid}, more than the suite's "
                    f"bound {bound} (HARNESS_TEST_MAX_THREADS): a test leaks threads. "
                    f"{thread_kinds()}", pytrace=False)
