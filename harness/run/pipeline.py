"""``train(config)``: the whole path of one run, one way through typed stages::

    RunConfig -> plan() -> Plan -> build() -> Built -> fit() -> Fitted -> evaluate() -> Evaluation
              -> record() in MLflow -> RunResult

(``harness.train`` in the public API; this module is not called ``train`` so it cannot
shadow that function on the package.) Everything that can be validated is validated before
the MLflow run is created; once it exists, the run always ends FINISHED, FAILED (with the
reason in the ``harness.failure`` tag) or KILLED (pruned or interrupted) — never RUNNING.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import tracking
from harness.config import RunConfig, load_run_config, parse_run_config
from harness.devices import run_device
from harness.errors import PluginError
from harness.keys import Metric
from harness.memory import PeakMemory
from harness.registry import Registry
from harness.run.build import build
from harness.run.plan import plan
from harness.run.record import default_run_name, ending, provenance_tags, record, run_metrics


@dataclass
class RunResult:
    run_id: str | None
    status: str
    metrics: dict[str, float]
    num_params: int
    config: dict[str, Any]
    not_applicable: list[int] = field(default_factory=list)  # eval lengths the model cannot run


def load_registry(config: RunConfig, registry: Registry | None) -> Registry:
    """The registry a run config needs: the given one, or every installed plugin plus the
    config's local plugin files (which must load)."""
    from harness import loader

    if registry is not None and not config.plugins:
        return registry
    reg = loader.load(config.plugins)
    local = {Path(p).resolve().stem for p in config.plugins}
    broken = [f for f in reg.failures if f.plugin in local]
    if broken:
        raise PluginError(
            "a plugin file named in the config failed to load: "
            + "; ".join(f.describe() for f in broken)
            + ". Fix the file or remove it from `plugins:`."
        )
    return reg


def as_config(config: RunConfig | dict[str, Any] | str | os.PathLike[str]) -> RunConfig:
    if isinstance(config, RunConfig):
        return config
    if isinstance(config, dict):
        return parse_run_config(config)
    return load_run_config(config)


def train(
    config: RunConfig | dict[str, Any] | str | os.PathLike[str],
    *,
    registry: Registry | None = None,
    parent_run_id: str | None = None,
    callbacks: list[Any] | None = None,
    extra_tags: dict[str, str] | None = None,
) -> RunResult:
    """Train one model on one task as the config says; return its metrics and MLflow run id.

    ``callbacks``: extra Lightning callbacks (a study adds its pruning callback).
    ``parent_run_id``: nest the run under this MLflow run (studies pass it explicitly).
    """
    from harness.run.evaluate import evaluate
    from harness.run.fit import fit

    started = time.perf_counter()
    cfg = as_config(config)
    p = plan(cfg, load_registry(cfg, registry))
    built = build(p)
    resolved = p.resolved_config()
    tracker = tracking.Tracker(cfg.tracking.uri)
    run_id = tracker.start_run(
        cfg.tracking.experiment, run_name=cfg.tracking.run_name or default_run_name(p),
        parent_run_id=parent_run_id,
        tags={**provenance_tags(p), **cfg.tracking.tags, **(extra_tags or {})},
    )
    status = "FAILED"
    metrics: dict[str, float] = {}
    not_applicable: list[int] = []
    try:
        tracker.log_params(run_id, resolved)
        tracker.log_dict(run_id, resolved, "config.yaml")
        tracker.log_metrics(run_id, {Metric.PARAMS: built.num_params})
        with PeakMemory(run_device(cfg.train.accelerator)) as peak:
            fitted = fit(p, built, run_id, tracker.uri, callbacks or [])
        evaluated = time.perf_counter()
        evaluation = evaluate(p, built, fitted)
        metrics = run_metrics(built, fitted, evaluation, peak.metrics(), time.perf_counter() - evaluated)
        record(tracker, run_id, p, built, fitted, evaluation, metrics)
        metrics[Metric.TOTAL_S] = time.perf_counter() - started
        tracker.log_metrics(run_id, {Metric.TOTAL_S: metrics[Metric.TOTAL_S]}, step=fitted.steps)
        not_applicable = evaluation.not_applicable
        status = "FINISHED"
    except BaseException as exc:
        status, tags = ending(exc)
        tracker.set_tags(run_id, tags)
        raise
    finally:
        tracker.end_run(run_id, status)
    return RunResult(run_id, status, metrics, built.num_params, resolved, not_applicable)
