"""Resumable checkpoints: what a bit-exact continuation needs, written so a crash never leaves a
half-written file behind, and found again after one.

**Where.** ``<store>/checkpoints/<run_id>/`` (:func:`folder`: the harness store, never
outside it): ``step-000001200.ckpt`` files, each with a ``.sha256`` sidecar, ``best.ckpt``
(a hard link to the checkpoint with the best ``train.checkpoint_metric``) and, once a run
finished, ``model.safetensors`` (its final weights, :mod:`harness.run.trained`).

**What.** Lightning's own checkpoint (model, optimizer, learning-rate scheduler, gradient
scaler, loop counters) plus, under ``"harness"``: every random-number generator's state
(Python, NumPy, torch CPU and CUDA, as tensors and lists so that ``torch.load(...,
weights_only=True)`` reads them), the training data's position (the data order's state at
the start of the current epoch and the batches of that epoch already trained on), the step,
and the run's resolved config and component versions (what ``--resume`` compares).

**When.** ``train.checkpoint_every``: every N optimizer steps, or every so many minutes
(``"10min"``); unset, off on the CPU and every 30 minutes elsewhere. A checkpoint due at a
validation step is written after that validation (its metrics are logged and reported to
a study's pruner first, and it is a candidate for ``best``); any other one after its
training step. SIGUSR1 (:func:`request_stop`) writes one at the next step and stops the
run with :class:`Preempted`.

**Atomic, checked, bounded.** A checkpoint is written to a temporary file, flushed to disk
and renamed into place, then its SHA-256 is written next to it the same way; a file without
a matching sidecar is corrupt or truncated, and :func:`latest` falls back to the previous
one with a warning naming both (the harness's own ``warning:`` line). :func:`latest` is the
checkpoint chooser: a step file that is not a regular file (a folder, a link to
``/dev/zero``), whose sidecar is not one, or whose content is not a checkpoint this harness
wrote (a pickle ``weights_only`` refuses, another program's ``torch.save`` dict) is skipped
the same way; nothing about the run changes while it chooses. The newest ``train.checkpoint_keep`` are kept (and
``best.ckpt``); the folder's size is logged as ``cost/checkpoint_disk_mb`` after each save.

**The data order's protocol.** A training loader that can resume has ``state_dict()`` (its
state at the start of the current epoch) and ``load_state_dict(state)``, where ``state``
also holds ``consumed_batches``: the batches of that epoch already trained on, which the
loader skips. (The number consumed is counted here, not by the loader: Lightning fetches a
batch ahead.)
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L

from harness.errors import HarnessError, warning
from harness.keys import Metric
from harness.runtime import paths
from harness.store import tracking

#: ``train.checkpoint_every`` left unset on a device other than the CPU.
DEFAULT_GPU_MINUTES = 30.0
STEP_FILE = re.compile(r"^step-(\d{9})\.ckpt$")
BEST = "best.ckpt"
#: The exit code of a process that checkpointed and stopped on SIGUSR1 (EX_TEMPFAIL: run it
#: again and it resumes).
PREEMPTED_EXIT = 75


class Preempted(SystemExit):
    """The run checkpointed at ``step`` and stopped because SIGUSR1 asked it to (a scheduler's
    warning before a time limit or a preemption). A ``SystemExit`` so that Lightning tears
    down and re-raises it as it is; the run ends KILLED, tagged ``harness.preempted``. A study
    worker signalled between trials raises it with no step and no run: nothing was training."""

    def __init__(self, step: int | None = None, run_id: str = "") -> None:
        super().__init__(PREEMPTED_EXIT)
        self.step, self.run_id = step, run_id  # none: between runs (a study worker), nothing to save


# -- where ------------------------------------------------------------------------------
def folder(run_id: str) -> Path:
    """The checkpoint folder of a run, inside the store (an id that would escape is refused)."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", run_id):
        raise HarnessError(f"{run_id!r} is not an MLflow run id (letters and digits).")
    return tracking.home() / "checkpoints" / run_id


def step_path(root: Path, step: int) -> Path:
    return root / f"step-{step:09d}.ckpt"


def step_files(root: Path) -> list[tuple[int, Path]]:
    """The step checkpoints of a folder, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m[1]), root / m[0]) for name in os.listdir(root) if (m := STEP_FILE.match(name))]
    return sorted(found)


def disk_bytes(root: Path) -> int:
    """Bytes the folder's files take (hard links counted once)."""
    seen, total = set(), 0
    for path in root.iterdir() if root.is_dir() else []:
        st = path.stat()
        if path.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


# -- writing and reading ------------------------------------------------------------------
def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _write_atomic(path: Path, data: bytes | memoryview) -> None:
    paths.write_atomic(path, data)  # a temporary file unique to this process and call


def write(path: Path, payload: dict[str, Any]) -> int:
    """Write ``payload`` (``torch.save``) atomically with its SHA-256 sidecar; returns bytes."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getbuffer()
    digest = hashlib.sha256(data).hexdigest()
    _write_atomic(path, data)
    _write_atomic(_sidecar(path), f"{digest}  {path.name}\n".encode())
    with contextlib.suppress(OSError):  # the renames themselves reach the disk
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return len(data)


#: A sidecar is one line (64 hex digits, two spaces, the file's name): anything larger is not one.
SIDECAR_MAX_BYTES = 4096


def _regular(path: Path) -> str | None:
    """None when ``path`` is a regular file, else what it is (a folder, a device, missing)."""
    import stat

    from harness.runtime.files import kind_of

    try:
        st = os.stat(path)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    return None if stat.S_ISREG(st.st_mode) else f"it is {kind_of(st.st_mode)}, not a file"


def verify(path: Path) -> str | None:
    """None when ``path`` is a regular file that matches its sidecar's SHA-256, else what is
    wrong (never reads a FIFO or a device)."""
    if (problem := _regular(path)) is not None:
        return problem
    side = _sidecar(path)
    if not side.exists() and not side.is_symlink():
        return "its .sha256 sidecar is missing (the write did not finish)"
    if (problem := _regular(side)) is not None or side.stat().st_size > SIDECAR_MAX_BYTES:
        return f"its .sha256 sidecar is not a checksum file ({problem or 'too large'})"
    try:
        text = side.read_text(errors="replace")
        expected = text.split()[0] if text.strip() else ""
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    if digest.hexdigest() != expected:
        return "its SHA-256 does not match its sidecar (corrupt or truncated)"
    return None


def read(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    """A checkpoint's contents; tensors and plain data only (``weights_only=True``)."""
    import torch

    return torch.load(path, map_location=map_location, weights_only=True)  # type: ignore[no-any-return]


def foreign(path: Path) -> str | None:
    """None when ``path`` (already verified) loads with ``weights_only`` and holds what this
    harness writes (Lightning's state and the harness's own), else what it is instead."""
    try:
        state = read(path)
    except Exception as exc:  # pickle's and torch's many errors: a file of another program
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"it is not a checkpoint this harness wrote (torch refuses to load it safely: {first[:160]})"
    if not isinstance(state, dict) or not isinstance(state.get("harness"), dict) \
            or not isinstance(state.get("state_dict"), dict):
        return "it is not a checkpoint this harness wrote (no harness state and model weights in it)"
    return None


def problem_with(path: Path) -> str | None:
    """None when ``path`` is a checkpoint a run can resume from, else what is wrong."""
    return verify(path) or foreign(path)


def latest(root: Path, *, check_content: bool = True) -> Path | None:
    """The newest step checkpoint a run can resume from (:func:`problem_with`; with
    ``check_content=False`` only :func:`verify`); each newer one that fails is named in a
    ``warning:`` line with the one used instead."""
    bad: list[str] = []
    for _, path in reversed(step_files(root)):
        problem = problem_with(path) if check_content else verify(path)
        if problem is None:
            for line in bad:
                warning(f"{line}; using {path.name} instead")
            return path
        bad.append(f"checkpoint {path} is unusable: {problem}")
    for line in bad:
        warning(f"{line}; no earlier checkpoint is usable")
    return None


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` step checkpoints (``best.ckpt`` is a link: it stays);
    only files (a folder in the way is not the harness's to remove)."""
    for _, path in step_files(root)[:-keep]:
        for p in (path, _sidecar(path)):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                if p.is_symlink() or not p.is_dir():
                    p.unlink()


def set_aside_newer(root: Path, chosen: Path) -> list[Path]:
    """Rename the step files newer than ``chosen`` (the ones the chooser found unusable) to
    ``unusable-<name>``, so the resumed run's new checkpoints and their pruning never meet
    them; nothing is deleted. Returns the new names."""
    step = int(STEP_FILE.match(chosen.name)[1])  # type: ignore[index]
    moved = []
    for number, path in step_files(root):
        if number > step:
            for p in (path, _sidecar(path)):
                if p.exists() or p.is_symlink():
                    target = p.with_name(f"unusable-{p.name}")
                    if not target.exists():
                        os.replace(p, target)
                        moved.append(target)
    return moved


def link_best(root: Path, path: Path) -> None:
    """Make ``best.ckpt`` (and its sidecar) the checkpoint at ``path``, atomically."""
    for src, name in ((path, BEST), (_sidecar(path), BEST + ".sha256")):
        tmp = paths.temp_name(root / name, "tmp")
        try:
            os.link(src, tmp)
        except OSError:  # a file system without hard links
            import shutil

            shutil.copyfile(src, tmp)
        os.replace(tmp, root / name)


# -- random-number generators -----------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Every generator's state as tensors, lists and numbers (``weights_only`` loads them)."""
    import random

    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    assert not isinstance(keys, str)
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": list(cuda),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np
    import torch

    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- when -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Schedule:
    steps: int | None = None
    minutes: float | None = None

    @property
    def off(self) -> bool:
        return self.steps is None and self.minutes is None


def schedule(every: int | str | None, device_type: str) -> Schedule:
    """``train.checkpoint_every`` as a schedule (see the module)."""
    if every is None:
        return Schedule() if device_type == "cpu" else Schedule(minutes=DEFAULT_GPU_MINUTES)
    if isinstance(every, int):
        return Schedule(steps=every)
    if every == "off":
        return Schedule()
    return Schedule(minutes=float(every.removesuffix("min")))


# -- SIGUSR1 ------------------------------------------------------------------------------------
_STOP = {"requested": False}


def request_stop(*_: Any) -> None:
    """Ask the running fit to checkpoint at its next step and stop (the SIGUSR1 handler)."""
    _STOP["requested"] = True


def stop_requested() -> bool:
    return _STOP["requested"]


@contextlib.contextmanager
def stop_on_sigusr1(forward: Any = ()) -> Any:
    """While the block runs, SIGUSR1 checkpoints the run at its next step and stops it (and
    is passed on to the processes in ``forward``: a study's extra workers)."""
    if not hasattr(signal, "SIGUSR1") or not threading_main():
        yield
        return

    def handler(*_: Any) -> None:
        request_stop()
        for proc in forward:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)
        _STOP["requested"] = False


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# -- the callback ---------------------------------------------------------------------------------
class Checkpointing(L.Callback):
    """Writes checkpoints as ``train.checkpoint_every`` says and restores the state Lightning
    does not (generators, data position) when a run resumes from one."""

    def __init__(self, root: Path, every: Schedule, *, keep: int, best: bool, metric: str,
                 mode: str, meta: dict[str, Any], datamodule: Any) -> None:
        self.root, self.every, self.keep, self.best, self.metric = root, every, keep, best, metric
        self.mode, self.meta, self.datamodule = mode, meta, datamodule
        self.best_value: float | None = None
        self.last_step = 0
        self.last_time = time.monotonic()
        self.seconds = 0.0  # spent saving
        self.resumed: dict[str, Any] | None = None
        self.saved: list[int] = []
        self._state: dict[str, Any] = {}  # what the checkpoint being written holds for us
        self.stop_at: int | None = None  # SIGUSR1: the step checkpointed; stop before the next

    # restoring ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return self._state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        harness = state_dict
        self.resumed = harness
        self.best_value = harness.get("best_value")
        self.last_step = int(harness.get("step", 0))
        if harness.get("order") is not None:
            self.datamodule.resume_order = harness["order"]

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.last_time = time.monotonic()
        if self.resumed and self.resumed.get("rng") is not None:
            set_rng_state(self.resumed["rng"])  # last, right before the next training step

    # saving ------------------------------------------------------------------------------
    def _due(self, step: int) -> bool:
        if stop_requested():
            return True
        if self.every.steps is not None:
            return step - self.last_step >= self.every.steps
        if self.every.minutes is not None:
            return time.monotonic() - self.last_time >= 60 * self.every.minutes
        return False

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if trainer.accumulate_grad_batches > 1 and trainer.fit_loop.epoch_loop._should_accumulate():
            return  # within an optimizer step's micro-batches: its gradients are not applied yet
        if not self._due(step) or self._validates_at(trainer, step):
            return  # a validation step saves after its validation (on_validation_end)
        self.save(trainer, batch_idx + 1, value=None)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        step = trainer.global_step
        value = trainer.callback_metrics.get(self.metric)
        value = float(value) if value is not None else None
        improved = self.best and not self.every.off and value is not None and math.isfinite(value) and (
            self.best_value is None or (value < self.best_value if self.mode == "min" else value > self.best_value))
        if self._due(step) or improved:
            consumed = trainer.fit_loop.epoch_loop.batch_progress.current.completed
            # the system puts the generator back as it was before validating (it runs after
            # this hook): save that state, the one the next training step starts from
            before = getattr(pl_module, "_rng_before_validation", None)
            self.save(trainer, consumed, value=value, best=bool(improved), torch_rng=before)

    @staticmethod
    def _validates_at(trainer: Any, step: int) -> bool:
        every = trainer.val_check_batch  # in micro-batches when gradients accumulate
        if isinstance(every, int):
            every //= trainer.accumulate_grad_batches
        return step >= trainer.max_steps or (isinstance(every, int) and step % every == 0)

    def save(self, trainer: Any, consumed: int, value: float | None, best: bool = False,
             torch_rng: Any = None) -> None:
        started = time.perf_counter()
        step = trainer.global_step
        if best:
            self.best_value = value
        rng = rng_state()
        if torch_rng is not None:
            rng["torch"] = torch_rng
        self._state = {**self.meta, "step": step, "rng": rng,
                       "order": order_state(self.datamodule, consumed),
                       "metric": self.metric, "value": value, "best_value": self.best_value}
        payload = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        payload["harness"] = self._state  # also where readers other than Lightning find it
        # Lightning saves a resumable loader's state_dict() too and loads it back after ours: that
        # one counts a batch fetched ahead as consumed. The data position is ours alone.
        loop = payload.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
        loop.pop("combined_loader", None)
        self._state = {}
        path = step_path(self.root, step)
        if trainer.is_global_zero:
            write(path, payload)
            if best:
                link_best(self.root, path)
            prune(self.root, self.keep)
        self.saved.append(step)
        self.last_step, self.last_time = step, time.monotonic()
        self.seconds += time.perf_counter() - started
        if trainer.logger is not None and trainer.is_global_zero:
            trainer.logger.log_metrics({Metric.CHECKPOINT_MB: disk_bytes(self.root) / 2**20,
                                        Metric.CHECKPOINT_S: self.seconds}, step=step)
        if stop_requested():  # stop before the next step: this one's metrics get logged first
            self.stop_at = step

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.stop_at is not None:
            raise Preempted(self.stop_at, str(self.meta.get("run_id") or ""))


def order_state(datamodule: Any, consumed: int) -> dict[str, Any] | None:
    """The training data's position: its loader's state at the start of the current epoch and
    the batches of that epoch trained on (see the module), or None for a loader that cannot
    resume."""
    loader = getattr(datamodule, "train_order", None)
    if loader is None or not hasattr(loader, "state_dict"):
        return None
    return {**loader.state_dict(), "consumed_batches": int(consumed)}
