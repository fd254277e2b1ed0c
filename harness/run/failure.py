"""Why a run failed, in one paragraph: which component and plugin raised (with the plugin's own
frame, ``file:line``), or that memory ran out (with the configuration), and releasing the
memory a failed run held so that the next trial of a study can run.

:func:`describe` turns an exception raised while building, training or evaluating into a
:class:`~harness.errors.RunFailed` (or :class:`~harness.errors.OutOfMemory`); the pipeline
records its message as the run's ``harness.failure`` tag and raises it, and the CLI prints it
as one paragraph with exit code 1 (never a traceback: the frame that matters is named).
"""

from __future__ import annotations

import gc
import os
import sys
import traceback
from typing import Any

from harness.errors import ConfigError, OutOfMemory, RunFailed, exception_chain
from harness.run.plan import Component, Plan

#: Texts of allocator errors that are not ``torch.OutOfMemoryError`` (CPU allocations,
#: cuBLAS/cuDNN workspaces, MPS).
OOM_TEXTS = ("out of memory", "can't allocate memory", "cannot allocate memory",
             "not enough memory", "failed to allocate", "alloc_cpu")


def is_out_of_memory(exc: BaseException) -> bool:
    """An allocation that failed, on any device."""
    if isinstance(exc, MemoryError):
        return True
    oom = getattr(sys.modules.get("torch"), "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in OOM_TEXTS)


def release_memory(device: Any) -> None:
    """Free what a failed run left: collect its cycles (frames, modules, optimiser state) and,
    on a GPU, give the allocator's cached blocks back to the driver."""
    gc.collect()
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        torch.cuda.empty_cache()


def _module_file(obj: Any) -> str | None:
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    return os.path.realpath(path) if path else None


def blame(exc: BaseException, p: Plan) -> tuple[str, Component, traceback.FrameSummary] | None:
    """The innermost frame of the exception that lies in a component's plugin module: the
    component's role, the component and that frame."""
    files: dict[str, tuple[str, Component]] = {}
    for role, comp in p.components().items():
        path = _module_file(comp.spec.build)
        if path:
            files.setdefault(path, (role, comp))
    for node in exception_chain(exc):
        for frame in reversed(traceback.extract_tb(node.__traceback__)):
            hit = files.get(os.path.realpath(frame.filename))
            if hit:
                return hit[0], hit[1], frame
    return None


def raised_by_plugin(exc: BaseException, p: Plan) -> bool:
    """Whether a ``SystemExit``, ``KeyboardInterrupt`` or other non-``Exception`` was raised
    inside a component's plugin (then it is the plugin's failure, named like any other), rather
    than by the user (Ctrl-C: :class:`~harness.errors.Interrupted`) or a signal (Lightning's
    ``SIGTERMException``, SIGUSR1's ``Preempted``)."""
    from harness.errors import Interrupted

    if isinstance(exc, Exception | Interrupted):
        return False
    if any(type(node).__name__ in ("SIGTERMException", "Preempted") or isinstance(node, Interrupted)
           for node in exception_chain(exc)):
        return False
    return blame(exc, p) is not None


def _where(frame: traceback.FrameSummary) -> str:
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def _innermost(exc: BaseException) -> traceback.FrameSummary | None:
    frames = traceback.extract_tb(exc.__traceback__)
    return frames[-1] if frames else None


def configuration(p: Plan) -> str:
    """The settings that decide memory: the model, its components' params, batch and length."""
    parts = []
    for role, comp in p.components().items():
        if role == "task":
            continue
        params = ", ".join(f"{k}={v}" for k, v in comp.as_dict()["params"].items()
                           if isinstance(v, int | float) and not isinstance(v, bool))
        parts.append(f"{role} {comp.name}" + (f" ({params})" if params else ""))
    t = p.config.train
    micro = f", train.micro_batch_size={t.micro_batch_size}" if t.micro_batch_size else ""
    return "; ".join(parts) + f"; train.batch_size={t.batch_size}{micro}, train.precision={t.precision}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:300]


def describe(exc: BaseException, p: Plan, stage: str, run_id: str | None = None) -> RunFailed:
    """The :class:`RunFailed` of an exception raised while ``stage`` (building, training,
    evaluating) the plan's run."""
    what = f"run {run_id}" if run_id else "the run"
    recorded = " It is recorded FAILED in MLflow with this reason." if run_id else ""
    if is_out_of_memory(exc):
        return OutOfMemory(
            f"{what} FAILED while {stage}: out of memory ({type(exc).__name__}: {_first_line(exc)}) "
            f"with {configuration(p)}. The memory it held was released.{recorded} Set "
            f"train.micro_batch_size below train.batch_size (the same optimizer batch in smaller "
            f"passes) or train.activation_checkpointing: true, lower the model's size, or give it "
            f"a device with more memory."
        )
    found = blame(exc, p)
    reason = f"{type(exc).__name__}: {_first_line(exc)}".rstrip(": ")
    if found is not None:
        role, comp, frame = found
        return RunFailed(
            f"{what} FAILED while {stage}: the {role} '{comp.name}' (plugin "
            f"{comp.spec.provenance()}) raised {reason} at {_where(frame)}.{recorded} Fix the "
            f"plugin, or use another {role.split('.')[0]}."
        )
    last = _innermost(exc)
    at = f" at {_where(last)}" if last else ""
    return RunFailed(f"{what} FAILED while {stage}: {reason}{at}.{recorded}")


def build_error(exc: BaseException, p: Plan) -> ConfigError | None:
    """A component that rejects its params while it is built (a ``ZeroDivisionError`` for a
    zero width, an ``IndexError`` for an empty vocabulary) is the user's to fix: a
    :class:`ConfigError` naming it and its frame; None for other failures."""
    if not isinstance(exc, ValueError | TypeError | ArithmeticError | IndexError) or is_out_of_memory(exc):
        return None
    found = blame(exc, p)
    if found is None:
        return None
    role, comp, frame = found
    return ConfigError(
        f"{role} '{comp.name}' could not be built with its params ({type(exc).__name__}: "
        f"{_first_line(exc)}, at {_where(frame)}). Check its params ({role}.params; see "
        f"`harness list -v --kind {comp.spec.kind}`)."
    )
