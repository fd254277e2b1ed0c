"""Stage 5 of a run: what goes into its MLflow record.

Tags name every component with its plugin, distribution and version, the git commit and the
batch format; a run's metrics are logged once at its end (per-step training curves are
logged by Lightning during the fit); figures are the extrapolation curve and attention maps.
A run that ends early says why: pruned runs end FINISHED with a tag, a description and
"(pruned)" in their name (the pruner did what the study asked: nothing broke), interrupted
ones KILLED with a tag, failed ones FAILED with the reason.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

from harness.errors import shorten
from harness.keys import (
    Metric,
    Tag,
    component_tag,
    curve_key,
    split_val_key,
    summary_metric,
    val_key,
)
from harness.run import grid
from harness.run.build import Built
from harness.run.evaluate import Evaluation, attention_maps
from harness.run.fit import Fitted
from harness.run.plan import Plan, documents_of
from harness.runtime import devices
from harness.store import tracking


def provenance_tags(p: Plan) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    tags = {}
    for role, comp in p.components().items():
        tags[component_tag(role)] = comp.name
        for attr in ("plugin", "distribution", "version"):
            tags[component_tag(role, attr)] = getattr(comp.spec, attr)
    with contextlib.suppress(PackageNotFoundError):
        tags[Tag.VERSION] = version("attention-harness")
    import torch

    tags[Tag.TORCH_VERSION] = torch.__version__
    commit = tracking.git_commit()
    if commit:
        tags[Tag.GIT_COMMIT] = commit
    tags[Tag.BATCH_FORMAT] = str(p.fmt)
    if (docs := documents_of(p.task.params)) is not None:
        tags[Tag.DOCUMENTS] = docs
    from harness.nn import fast_path
    from harness.run.plan import mixer_class

    device = devices.run_device(p.config.train.accelerator)
    tags[Tag.KERNEL] = fast_path.resolve(p.config.train.kernels, mixer_class(p.parts), device,
                                         resets=docs == "separate")
    return tags


def default_run_name(p: Plan) -> str:
    parts = [p.model.name]
    if p.attention or p.attention_roles:  # the shared variant, then overrides: linear,cross=additive
        shared = [p.attention.name] if p.attention else []
        parts.append(",".join(shared + [f"{r}={c.name}" for r, c in p.attention_roles.items()]))
    if p.mixer:
        parts.append(p.mixer.name)
    if p.position:
        parts.append(p.position.name)
    return "/".join(parts) + f" on {p.task.name}"


#: The suffix of a pruned run's name: ``rope/tune/trial-3 (pruned)``.
PRUNED_SUFFIX = " (pruned)"


def ending(exc: BaseException) -> tuple[str, dict[str, str]]:
    """MLflow status and tags of a run that ended with ``exc``.

    Pruned: FINISHED (the pruner stopped it, as the study asked: nothing broke, so the UI
    shows no failure mark) + ``harness.pruned`` + a description that says when and why; the
    caller suffixes its name with :data:`PRUNED_SUFFIX`. Interrupted: KILLED +
    ``harness.interrupted``; this covers Ctrl-C and SIGTERM, which Lightning turns into
    ``SystemExit`` (its ``SIGTERMException`` is one) after shutting the trainer down.
    Anything else: FAILED with the reason in ``harness.failure``.
    """
    if type(exc).__name__ == "TrialPruned":
        why = str(exc) or "pruned"
        return "FINISHED", {Tag.PRUNED: "true", Tag.NOTE: (
            f"**Pruned** by the study's pruner, not failed: {why}. The pruner stopped it early "
            f"because its validation at that step was behind what the candidate's other trials "
            f"reached there; its metrics are those it logged until then.")}
    if type(exc).__name__ == "Preempted":  # checkpointed on SIGUSR1 (harness.run.checkpoint)
        return "KILLED", {Tag.PREEMPTED: "true", Tag.INTERRUPTED: "true"}
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        return "KILLED", {Tag.INTERRUPTED: "true"}
    return "FAILED", {Tag.FAILURE: shorten(f"{type(exc).__name__}: {exc}", 2000)}


def run_metrics(built: Built, fitted: Fitted, evaluation: Evaluation, peak: dict[str, float],
                eval_s: float) -> dict[str, float]:
    """Every metric a finished run reports: quality per length, then cost (``cost/*``).
    Logged at step 0 (:func:`record`; the training length's ``val/*`` at the last step, ending
    their learning curves): one value per run, which MLflow charts as a bar per run (or per
    group of runs), not as a lone point at the last optimizer step."""
    import torch

    metrics = dict(evaluation.metrics)
    for name in grid.metrics_with_cells(metrics):  # the mean over the depth x length grid
        mean = grid.grid_mean(metrics, name)
        if mean is not None:
            metrics[val_key(summary_metric(name, "grid"))] = mean
    if fitted.tokens_per_s:
        metrics[Metric.TOKENS_PER_S] = fitted.tokens_per_s
    metrics.update(fitted.costs)
    metrics.update(peak)
    eval_rate = fitted.trainer.callback_metrics.get(Metric.EVAL_TOKENS_PER_S)
    if eval_rate is not None:
        metrics[Metric.EVAL_TOKENS_PER_S] = float(eval_rate)
    flops = fitted.costs.get(Metric.FLOPS_PER_TOKEN)
    utilisation = devices.mfu(flops, fitted.tokens_per_s, fitted.device) if flops and fitted.tokens_per_s else None
    if utilisation is not None:
        metrics[Metric.MFU] = utilisation
    metrics[Metric.FIT_S] = fitted.seconds
    metrics[Metric.EVAL_S] = eval_s
    metrics[Metric.THREADS] = float(torch.get_num_threads())
    metrics[Metric.TRAIN_STEPS] = float(fitted.steps)
    tokens = fitted.costs.get(Metric.TRAIN_TOKENS)
    if flops and tokens:
        metrics[Metric.TRAIN_FLOPS] = flops * tokens
    t = fitted.system.cfg
    if t.max_flops is not None:
        metrics[Metric.BUDGET_FLOPS] = float(t.max_flops)
    if t.max_tokens is not None:
        metrics[Metric.BUDGET_TOKENS] = float(t.max_tokens)
    metrics[Metric.PARAMS] = float(built.num_params)
    state = decoding_state_size(built.model, built.info.max_length)
    if state is not None:
        metrics[Metric.STATE_SIZE] = float(state)
        metrics[Metric.STATE_BYTES] = float(state * element_bytes(str(getattr(fitted.trainer, "precision", ""))))
    return metrics


def element_bytes(precision: str) -> int:
    """Bytes of one decoding-state element at a Lightning precision (``32-true``: 4; any 16-bit
    one: 2, its caches being kept in the compute dtype; ``64-true``: 8)."""
    if precision.startswith("64"):
        return 8
    return 2 if "16" in precision else 4


def length_curves(metrics: dict[str, float]) -> dict[str, dict[int, float]]:
    """``val/loss_len64``, ``val/loss_len128`` ... as ``{"extrapolation/loss": {64: .., 128: ..}}``:
    one metric per quality with the evaluation length as its step."""
    curves: dict[str, dict[int, float]] = {}
    for key, value in metrics.items():
        split = split_val_key(key)
        if split:
            curves.setdefault(curve_key(split[0]), {})[split[1]] = value
    return curves


def decoding_state_size(model: Any, length: int) -> int | None:
    """What a model keeps per sequence to decode after ``length`` positions (its
    ``state_size``), or None for a model that does not say (it does not decode)."""
    measure = getattr(model, "state_size", None)
    if measure is None:
        return None
    try:
        return int(measure(length))
    except (NotImplementedError, ValueError):  # a layer without a decoding form (Linformer)
        return None


def record(tracker: tracking.Tracker, run_id: str, p: Plan, built: Built, fitted: Fitted,
           evaluation: Evaluation, metrics: dict[str, float]) -> None:
    """Log a finished run's metrics, its not-applicable lengths and its figures."""
    # the learning curves' last points (``val/acc`` at the training length) at the last step;
    # every other final value (per length, cost) at step 0: MLflow charts a metric with one
    # value at step 0 as a bar per run, not as a lone point on a 399-400.5 axis
    last = {k: v for k, v in metrics.items() if k.startswith("val/") and split_val_key(k) is None}
    tracker.log_metrics(run_id, last, step=fitted.steps)
    # cost/params was logged when the run started (a resumed run: when it first started)
    tracker.log_metrics(run_id, {k: v for k, v in metrics.items() if k not in last and k != Metric.PARAMS},
                        step=0)
    tracker.log_series(run_id, length_curves(evaluation.metrics))  # the UI charts the curve
    if evaluation.not_applicable:
        tracker.set_tags(run_id, {Tag.NOT_APPLICABLE: ",".join(map(str, evaluation.not_applicable))})
    data = built.task.data_summary()
    if data:
        tracker.set_tags(run_id, {Tag.DATA: data, Tag.DATA_PARAMS: ",".join(built.task.data_params)})
    _log_figures(tracker, run_id, p, built, fitted, evaluation)


def _log_figures(tracker: tracking.Tracker, run_id: str, p: Plan, built: Built, fitted: Fitted,
                 evaluation: Evaluation) -> None:
    from harness.run import plots

    task, metric = built.task, "acc"
    with tempfile.TemporaryDirectory() as tmp:
        curve = {n: evaluation.metrics[val_key(metric, n)] for n in evaluation.lengths
                 if val_key(metric, n) in evaluation.metrics}
        if len(task.eval_lengths) > 1 and curve:
            path = plots.extrapolation_curve({default_run_name(p): curve}, metric=val_key(metric),
                                             train_length=task.train_length,
                                             path=Path(tmp) / "extrapolation.png")
            tracker.log_artifact(run_id, path, "plots")
            tracker.log_dict(run_id, {"metric": metric, "train_length": task.train_length,
                                      "points": {str(k): v for k, v in curve.items()}},
                             "plots/extrapolation.json")
        for name in grid.metrics_with_cells(evaluation.metrics):  # the needle test's picture
            cells = grid.cells(evaluation.metrics, name)
            drawn = grid.heatmap(cells, Path(tmp) / f"heatmap_{name}.png", metric=val_key(name),
                                 title=f"{default_run_name(p)}: {name} by depth and length",
                                 train_length=task.train_length)
            if drawn is not None:
                tracker.log_artifact(run_id, drawn, "plots")
                tracker.log_dict(run_id, {"metric": name, "train_length": task.train_length, "cells": [
                    {"length": n, "depth": d, "value": v} for (n, d), v in sorted(cells.items())]},
                    f"plots/heatmap_{name}.json")
        if p.config.train.log_attention and (p.attention is not None or p.attention_roles):
            for i, (maps, ids) in enumerate(attention_maps(fitted.system.model, task, p.fmt, count=2)):
                tokens = [task.vocab.token(t) for t in ids] or None
                path = plots.attention_maps(maps, Path(tmp) / f"attention_{i}.png",
                                            title=f"{default_run_name(p)} — example {i}",
                                            tokens=tokens, text=task.vocab.decode(ids) if ids else "")
                tracker.log_artifact(run_id, path, "attention")
