"""Resuming a run from its last checkpoint, in the same MLflow run.

``harness train --resume RUN_ID`` and ``harness.train(resume=RUN_ID)``: the run's recorded
config (its ``config.yaml``; or a config given with it, which must be the same) is planned
again, the newest checkpoint that passes its checksum is found
(:func:`harness.run.checkpoint.latest`), and the run is reopened (RUNNING again; its
``harness.interrupted`` / ``harness.preempted`` tags removed; ``harness.resumed_from_step``
set). Training continues from the checkpoint's step; metric points the run already holds
(logged after the checkpoint, before it stopped) are not logged twice
(:class:`OncePerStep`), so each curve has one point per step.

Refused, each with one paragraph and nothing changed: a run that is not in the store, that
FINISHED, that FAILED (its last checkpoint may hold the state that failed: a diverged loss, a
plugin's exception; train it again, or resume it explicitly from Python with
``allow_failed=True`` after fixing the cause), that was pruned; a run without a checkpoint;
a run whose config or components changed since it was recorded (each difference named).

**The checkpoint chooser** (:func:`harness.run.checkpoint.latest`) skips, with a ``warning:``
line each, a newest checkpoint that is damaged or foreign (a pickle ``weights_only`` refuses,
another program's file, a folder, a link to a device) and uses the newest valid one; when none
is valid the resume is refused before the run is touched, so it stays KILLED and resumable.

**One resume at a time** (:func:`resume_lock`): a lock on the run's checkpoint folder, held
while the resumed run trains; a second ``--resume`` of the same run is refused (exit 2)
instead of training it twice and logging every point twice. A refused resume changes
nothing on disk: no lock file is left behind, no folder created.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.loggers import MLFlowLogger

from harness.errors import ConfigError, HarnessError, warning
from harness.keys import Tag
from harness.run import checkpoint
from harness.store import tracking
from harness.store.masking import mask_url

PROGRESS_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
#: Config fields that may differ on resume: they change neither the model nor its training.
FREE = ("tracking.uri", "tracking.run_name", "train.progress", "train.max_time_s", "plugins")


@dataclass
class Resume:
    """What a resumed run continues from."""

    run_id: str
    path: Path  # the checkpoint
    step: int
    logged: dict[str, int] = field(default_factory=dict)  # each metric's last logged step


def recorded_config(tracker: tracking.Tracker, run_id: str) -> dict[str, Any]:
    """A run's logged ``config.yaml``."""
    previous = os.environ.get(PROGRESS_BAR)
    os.environ[PROGRESS_BAR] = "false"  # no progress bar for one small file
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = tracker.client.download_artifacts(run_id, "config.yaml", tmp)
            with open(path, encoding="utf-8") as fh:
                return dict(yaml.safe_load(fh))
    except Exception:
        raise HarnessError(f"run {run_id} has no logged config.yaml, so it cannot be resumed.") from None
    finally:
        if previous is None:
            os.environ.pop(PROGRESS_BAR, None)
        else:
            os.environ[PROGRESS_BAR] = previous


def recorded_base(run_id: str, tracking_uri: str | None) -> dict[str, Any]:
    """A run's recorded config, to apply ``--set`` and flags given with ``--resume`` to (so a
    changed field is named as a change, and a free one is accepted)."""
    tracker = tracking.Tracker(tracking_uri)
    find_run(tracker, run_id)
    data = recorded_config(tracker, run_id)
    data["tracking"] = {**(data.get("tracking") or {}), "uri": tracker.uri}
    return data


def find_run(tracker: tracking.Tracker, run_id: str) -> Any:
    try:
        return tracker.client.get_run(run_id)
    except Exception as exc:  # MlflowException: not found
        raise HarnessError(f"there is no run {run_id} in the tracking store {mask_url(tracker.uri)} "
                           f"({type(exc).__name__}). Pass the --tracking-uri it was recorded in.") from None


def check_resumable(run: Any, *, allow_failed: bool = False) -> None:
    """Refuse a run that finished, failed or was pruned (see the module)."""
    run_id, status, tags = run.info.run_id, run.info.status, run.data.tags
    if tags.get(Tag.PRUNED) == "true":
        raise HarnessError(f"run {run_id} was pruned by its study's pruner; a pruned run is not resumed.")
    if status == "FINISHED":
        raise HarnessError(f"run {run_id} FINISHED: there is nothing left to resume. Train a new "
                           f"run (harness train), or export this one (harness export {run_id}).")
    if status == "FAILED" and not allow_failed:
        reason = tags.get(Tag.FAILURE, "no reason recorded")
        raise HarnessError(
            f"run {run_id} ended FAILED ({reason[:300]}), so it is not resumed: its last "
            f"checkpoint may hold the state that failed. Fix the cause and train it again with "
            f"`harness train --from-run {run_id}`."
        )


def differences(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Each config field that differs, as ``key was A, now B`` (fields in :data:`FREE` aside)."""
    old, new = tracking.flatten(recorded), tracking.flatten(now)
    out = []
    for key in sorted(set(old) | set(new)):
        if any(key == f or key.startswith(f + ".") for f in FREE):
            continue
        a, b = old.get(key, "(unset)"), new.get(key, "(unset)")
        if tracking.param_value(a) != tracking.param_value(b):
            out.append(f"{key} was {tracking.param_value(a)}, now {tracking.param_value(b)}")
    return out


def component_differences(tags: dict[str, str], now: dict[str, str]) -> list[str]:
    """Each component tag (a component's name, plugin, distribution or version) that differs
    from the record; the harness, torch and git versions are not compared (a new version may
    change the numbers, not what the run is), nor the mixer's implementation (a run may
    continue on another device, where the kernel gate may decide otherwise)."""
    skip = {Tag.VERSION, Tag.TORCH_VERSION, Tag.GIT_COMMIT, Tag.KERNEL, Tag.KERNEL_GATE}
    return [f"{k} was {tags.get(k, '(none)')}, now {v}" for k, v in sorted(now.items())
            if k not in skip and tags.get(k) != v]


def last_steps(tracker: tracking.Tracker, run: Any) -> dict[str, int]:
    """Each metric's last logged step."""
    return {key: max((m.step for m in tracker.client.get_metric_history(run.info.run_id, key)), default=-1)
            for key in run.data.metrics}


def prepare(run: Any, tracker: tracking.Tracker, resolved_now: dict[str, Any], plan_tags: dict[str, str],
            *, allow_failed: bool = False, writes: bool = True,
            data_now: Callable[[], dict[str, str]] | None = None) -> Resume:
    """Check that ``run`` can resume with the config planned now and, with ``data_now``, the
    data its task reads now (:mod:`harness.run.identity`); find its checkpoint. ``writes``: set
    unusable newer checkpoint files aside (rank 0 of a distributed run only; the other ranks
    read what it chose)."""
    run_id = run.info.run_id
    run = tracker.client.get_run(run_id)  # as it is now, under the resume lock
    check_resumable(run, allow_failed=allow_failed)
    changed = differences(recorded_config(tracker, run_id), resolved_now)
    changed += component_differences(dict(run.data.tags), plan_tags)
    if changed:
        raise ConfigError(
            f"run {run_id} cannot resume: its config or components changed since it was "
            f"recorded ({'; '.join(changed[:8])}{' ...' if len(changed) > 8 else ''}). A resumed "
            f"run must continue exactly what it started; restore them, or start a new run."
        )
    if data_now is not None:
        from harness.run import identity

        identity.check(identity.from_tags(run.data.tags), data_now(), what=f"run {run_id} cannot resume",
                       fix=identity.FIX_DATA)
    root = checkpoint.folder(run_id)
    path = checkpoint.latest(root)
    if path is None:
        raise HarnessError(
            f"run {run_id} has no usable checkpoint in {root} (it trained with "
            f"train.checkpoint_every off, or stopped before its first one), so it cannot resume. "
            f"Set train.checkpoint_every (steps, or minutes as '10min') for runs you may resume."
        )
    moved = checkpoint.set_aside_newer(root, path) if writes else []
    if moved:
        warning(f"run {run_id}: the unusable newer checkpoint files were renamed (kept, not "
                f"deleted): {', '.join(p.name for p in moved[:6])}{' ...' if len(moved) > 6 else ''}")
    step = int(checkpoint.STEP_FILE.match(path.name)[1])  # type: ignore[index]
    return Resume(run_id, path, step, last_steps(tracker, run))


#: The file naming the process that holds a run's resume lock, there only while it is held.
LOCK_FILE = ".resume.lock"


@contextlib.contextmanager
def resume_lock(run_id: str) -> Iterator[None]:
    """Hold the run's resume lock while the block runs; a HarnessError (exit 2) when another
    process holds it (see the module). The lock is the checkpoint folder itself (``flock`` on
    the folder: the kernel releases it if the process dies); :data:`LOCK_FILE` names the
    holder while it is held and is removed with it, so a refused resume leaves the folder as
    it found it. A run without a checkpoint folder has nothing to resume: nothing is created
    (the resume is refused later for want of a checkpoint)."""
    import fcntl

    root = checkpoint.folder(run_id)
    try:
        fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        yield
        return
    except OSError as exc:
        raise HarnessError(f"run {run_id}: its checkpoint folder {root} cannot be opened to lock it "
                           f"({exc.strerror or exc}).") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        try:
            holder = (root / LOCK_FILE).read_text(errors="replace").strip()[:32]
        except OSError:
            holder = ""
        raise HarnessError(
            f"run {run_id} is being resumed already (by process {holder or 'another process'}); two "
            f"resumes of one run would train it twice. Wait for that one to end, or stop it first.") from None
    named = False
    try:
        with contextlib.suppress(OSError):
            (root / LOCK_FILE).write_text(str(os.getpid()))
            named = True
        yield
    finally:
        if named:
            with contextlib.suppress(OSError):
                (root / LOCK_FILE).unlink()
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def reopen(tracker: tracking.Tracker, resume: Resume) -> None:
    """The run RUNNING again, without the tags that said how it stopped."""
    client = tracker.client
    tags = client.get_run(resume.run_id).data.tags
    for tag in (Tag.INTERRUPTED, Tag.PREEMPTED, Tag.FAILURE):
        if tag in tags:
            client.delete_tag(resume.run_id, tag)
    client.update_run(resume.run_id, status="RUNNING")
    tracker.set_tags(resume.run_id, {Tag.RESUMED: str(resume.step)})


class OncePerStep(MLFlowLogger):
    """An MLflow logger that logs each metric at most once per step, never at or before the
    step it was last logged at: Lightning logs ``epoch`` with every batch of metrics (twice at a
    validation step), and a resumed run already holds the points logged after its checkpoint
    (``logged``: each metric's last step in the run before it resumed). Each curve then has
    one point per step, however the run stopped and resumed."""

    def __init__(self, *args: Any, logged: dict[str, int] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logged = dict(logged or {})

    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        at = step or 0
        fresh = {k: v for k, v in metrics.items() if at > self.logged.get(k, -1)}
        if fresh:
            super().log_metrics(fresh, step)
            self.logged.update(dict.fromkeys(fresh, at))
