"""``harness study run --workers N``: N workers on this machine from one command.

The command's own process is the first worker (it shows the progress and writes the report);
it starts N - 1 more ``harness study run`` processes on the same study, storage and tracking
store once the study exists (so no two processes create a schema at once). Each extra
worker writes its lines to ``$HARNESS_HOME/logs/<study>-worker-<i>.log``. They are ordinary
workers: every trial slot is claimed once (:func:`harness.study.storage.claim_slot`), and the
cores are split between them (:mod:`harness.runtime.threads`). On a machine with GPUs each
worker gets its own (:func:`gpu_plan`: ``CUDA_VISIBLE_DEVICES`` per worker process, this
one's included, set before CUDA starts in any of them).

The extra workers die with the command: on Linux the kernel sends them SIGTERM when it
exits in any way, SIGKILL included (``prctl(PR_SET_PDEATHSIG)``); on any platform the
command stops them (SIGTERM, then SIGKILL after ``grace_s``) when it leaves early, by
Ctrl-C or an error. A worker stopped by SIGTERM records its trial FAILED and queued again,
as any interrupted worker does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from harness.store import tracking


def worker_command(file: str, study: str, profile: str | None, sets: list[str]) -> list[str]:
    """The ``harness study run`` line of an extra worker: the same study, profile and
    overrides as the command that starts it, no report. The stores are not on it (a URL may
    hold a password, and every local user can read a command line): see :func:`worker_env`."""
    cmd = [sys.executable, "-m", "harness.cli", "study", "run", file, "--study-name", study]
    if profile:
        cmd += ["--profile", profile]
    for item in sets:
        cmd += ["--set", item]
    return cmd


def worker_env(storage: str | None, tracking_uri: str | None) -> dict[str, str]:
    """The stores of an extra worker, as variables (its environment is private to the user):
    ``HARNESS_STORAGE`` (read like ``--storage``) and ``MLFLOW_TRACKING_URI``."""
    from harness.study.storage import ENV_STORAGE

    env = {}
    if storage:
        env[ENV_STORAGE] = storage
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    return env


def _die_with_parent() -> None:  # runs in the child between fork and exec
    from harness.runtime.children import die_with_parent

    die_with_parent(signal.SIGTERM)


def log_path(study: str, index: int) -> Path:
    return tracking.home() / "logs" / f"{study}-worker-{index}.log"


def gpu_plan(workers: int, per_worker: int) -> tuple[list[dict[str, str]], str | None]:
    """Each worker's ``CUDA_VISIBLE_DEVICES`` (worker 0 is this process) and the sentence that
    says so (None on a machine without GPUs, or with ``per_worker`` 0: nothing assigned).
    Refuses more workers than the GPUs (:func:`harness.runtime.devices.assign_gpus`)."""
    from harness.runtime import devices

    pool = devices.visible_gpus()
    assigned = devices.assign_gpus(pool, workers, per_worker)
    if not any(assigned):
        return [{} for _ in range(workers)], None
    return ([{"CUDA_VISIBLE_DEVICES": ",".join(a)} for a in assigned],
            devices.describe_gpus(assigned))


@contextlib.contextmanager
def extra_workers(count: int, command: list[str], study: str, grace_s: float = 30.0,
                  env: dict[str, str] | None = None, own: list[dict[str, str]] | None = None,
                  ) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start ``count`` workers running ``command`` (with ``env`` added to this process's
    environment, and ``own[i - 1]`` to worker ``i``'s: its GPUs); on leaving, wait for them
    when they are finishing (the study is complete) or stop them (anything else)."""
    common = dict(os.environ, HARNESS_HOME=str(tracking.home()), **(env or {}))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(1, count + 1):
            log = log_path(study, i)
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "wb") as out:
                procs.append(subprocess.Popen(
                    command, env={**common, **(own[i - 1] if own else {})}, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None))
        yield procs
    except BaseException as exc:
        if type(exc).__name__ == "Preempted":  # SIGUSR1 reached them too: let them checkpoint
            wait(procs, grace_s)
        else:
            stop(procs, grace_s)
        raise
    else:
        wait(procs, grace_s)


def wait(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for each worker to finish by itself, then stop what is left."""
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop([p], timeout_s)


def stop(procs: list[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM to every live worker (each records its trial and exits), SIGKILL after
    ``grace_s``."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
    for p in procs:
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait()
