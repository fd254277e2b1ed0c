"""CPU threads when several study workers share one machine.

Each ``harness study run`` process is a worker; several on one machine would each start as
many torch threads as there are cores and fight over them (with OpenMP's default ACTIVE wait
policy, idle threads spin and take cores from the others). Instead:

- a worker registers itself in a per-machine folder while it runs (:func:`register_worker`:
  one file named by its process id; files of dead processes are ignored and removed), so a
  worker can count the workers alive on its machine (:func:`local_workers`);
- a run in a worker whose config leaves ``train.num_threads`` unset uses usable cores ÷ local
  workers, at least one (:func:`worker_threads`, recomputed at every trial, so workers that
  join or leave change the split from the next trial on); a run outside a worker keeps
  torch's default; ``train.num_threads`` set in the config always wins;
- workers run with ``OMP_WAIT_POLICY=PASSIVE`` unless the user set a policy
  (:func:`passive_wait`, called before torch is imported).

The run records the threads it used as ``cost/cpu_threads``. The measurement behind the
default (1 worker x 2 threads against 2 workers x 1 thread) is in
``benchmarks/thread_policy.md``. The folder is ``$HARNESS_WORKERS_DIR`` or
``harness-workers-<uid>`` in the system's temporary folder.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

_registered: Path | None = None


def passive_wait() -> None:
    """OpenMP threads sleep instead of spinning when idle, unless the user chose a policy.
    OpenMP reads the variable when torch loads it: call this before importing torch."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def workers_dir() -> Path:
    env = os.environ.get("HARNESS_WORKERS_DIR")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(env) if env else Path(tempfile.gettempdir()) / f"harness-workers-{uid}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def local_workers(folder: Path | None = None) -> int:
    """The workers alive on this machine (registered files of dead processes are removed)."""
    folder = folder or workers_dir()
    count = 0
    for entry in folder.glob("*") if folder.is_dir() else ():
        if entry.name.isdigit() and _alive(int(entry.name)):
            count += 1
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
    return count


def register_worker(folder: Path | None = None) -> Callable[[], None]:
    """Count this process as a worker of this machine until the returned function is called."""
    global _registered
    folder = folder or workers_dir()
    folder.mkdir(parents=True, exist_ok=True)
    entry = folder / str(os.getpid())
    entry.touch()
    previous, _registered = _registered, folder

    def unregister() -> None:
        global _registered
        _registered = previous
        with contextlib.suppress(OSError):
            entry.unlink()
    return unregister


def worker_threads() -> int | None:
    """Threads for a run in a registered worker: usable cores ÷ local workers (at least 1);
    None outside a worker (the run keeps torch's default)."""
    if _registered is None:
        return None
    return max(1, usable_cores() // max(1, local_workers(_registered)))


def run_threads(asked: int | None) -> int | None:
    """The torch CPU threads a run uses: ``train.num_threads`` (or a worker's share), never more
    than the usable cores. More would only oversubscribe them, and every OpenMP thread torch
    ever starts stays alive, idle, for the rest of the process (a library call asked for 4,096
    threads left 8,000 behind in the caller's process). None: torch's default."""
    threads = asked or worker_threads()
    return min(threads, usable_cores()) if threads else None


@contextlib.contextmanager
def torch_threads_kept() -> Iterator[None]:
    """Give torch back the thread count it had when the block started (a run sets its own)."""
    import torch

    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)
