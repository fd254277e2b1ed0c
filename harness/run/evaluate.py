"""Stage 4 of a run: evaluate the fitted model at every evaluation length it can run.

A model that cannot run a length (a learned position table, a fixed-length mixer) declares it
(``supports_length``, or ``extrapolates=False`` on its spec or its position scheme's): those
lengths are reported as not applicable instead of crashing or being silently clamped.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from harness.data.formats import BatchFormat
from harness.run.build import Built
from harness.run.fit import QUIET, Fitted
from harness.run.plan import Plan


@dataclass
class Evaluation:
    metrics: dict[str, float]  # val/<metric> and val/<metric>_len<L>
    lengths: list[int]  # evaluated
    not_applicable: list[int] = field(default_factory=list)


def supported_lengths(p: Plan, task: Any, model: Any) -> tuple[list[int], list[int]]:
    """Split the task's evaluation lengths into those the model can run and those it cannot.

    The model's ``supports_length`` decides. A model without one runs every length unless
    its spec or its position scheme's declares ``extrapolates=False``: then it runs only
    inputs no longer than the longest training input.
    """
    return lengths_run(task, model, p.fmt, fixed_length(p), task.eval_lengths)


def fixed_length(p: Plan) -> bool:
    """Whether the plan's model (or its position scheme) declares it cannot extrapolate."""
    return bool(not p.model.spec.extrapolates or (p.position and not p.position.spec.extrapolates))


def lengths_run(task: Any, model: Any, fmt: BatchFormat, fixed: bool,
                lengths: Any) -> tuple[list[int], list[int]]:
    """``lengths`` split into those ``model`` can run and those it cannot (see
    :func:`supported_lengths`; ``fixed``: :func:`fixed_length`)."""
    ok: list[int] = []
    na: list[int] = []
    check = getattr(model, "supports_length", None)
    if check is None:
        if not fixed:
            return list(lengths), []
        trained = task.train_length if task.streams else \
            max(fmt.input_length(e, task.task_kind) for e in task.examples("train", task.train_length))
        check = trained.__ge__  # runs an input of n positions iff n <= trained
    for length in lengths:
        if length == task.train_length:
            ok.append(length)
            continue
        need = max(fmt.input_length(e, task.task_kind) for e in task.examples("val", length))
        (ok if check(need) else na).append(length)
    return ok, na


def evaluate(p: Plan, built: Built, fitted: Fitted) -> Evaluation:
    """Validate at every length the model can run (one pass over each length's examples)."""
    ok, na = supported_lengths(p, built.task, built.model)
    fitted.datamodule.val_lengths = fitted.system.val_lengths = ok
    with warnings.catch_warnings():
        for pattern in QUIET:
            warnings.filterwarnings("ignore", pattern)
        fitted.trainer.validate(fitted.system, datamodule=fitted.datamodule, verbose=False)
    # callback_metrics, not the system's state: with ddp_spawn only they come back from the workers
    metrics = {k: float(v) for k, v in fitted.trainer.callback_metrics.items() if k.startswith("val/")}
    return Evaluation(metrics, ok, na)


def attention_maps(model: Any, task: Any, fmt: BatchFormat, count: int = 2) -> list[tuple[list[Any], list[int]]]:
    """Attention weights (per layer: heads x Lq x Lk) of the first validation examples, with
    each example's input token ids (padding dropped; empty where the maps are not over one
    input sequence), for models whose forward accepts ``return_attention=True``."""
    import torch

    examples = list(task.examples("val", task.train_length)[:count])
    batch = fmt.collate(examples, task.task_kind)
    device = next(model.parameters()).device
    batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = fmt.call(model, batch, return_attention=True)
    except TypeError:
        return []
    finally:
        model.train(was_training)
    if not isinstance(out, tuple):
        return []
    layers = [w for w in out[1] if w is not None]
    if not layers:
        return []
    result = []
    for i in range(len(examples)):
        ids: list[int] = []
        if fmt.input_keys == ("tokens",):
            keep = ~batch["padding_mask"][i]
            ids = [int(t) for t in batch["tokens"][i][keep].tolist()]
        maps = [w[i].float().cpu().numpy() for w in layers]
        if ids and maps[0].shape[-1] != len(ids):  # the model attended over something else
            ids = []
        if ids:
            maps = [m[:, : len(ids), : len(ids)] for m in maps]
        result.append((maps, ids))
    return result
