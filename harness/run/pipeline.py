"""``train(config)``: the whole path of one run, one way through typed stages::

    RunConfig -> plan() -> Plan -> build() -> Built -> fit() -> Fitted -> evaluate() -> Evaluation
              -> record() in MLflow -> RunResult

(``harness.train`` in the public API; this module is not called ``train`` so it cannot
shadow that function on the package.) Everything that can be validated is validated before
the MLflow run is created; once it exists, the run always ends FINISHED, FAILED (with the
reason in the ``harness.failure`` tag), FINISHED as pruned (``harness.pruned``, its name
suffixed " (pruned)") or KILLED (interrupted) — never RUNNING.

On several processes (``ddp``, ``torchrun``, Slurm) only rank 0 records; the other ranks
train and evaluate in step with it and record nothing (:mod:`harness.run.distributed`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

from harness.config import RunConfig, load_run_config, parse_run_config
from harness.errors import ConfigError, HarnessError, Interrupted, RunFailed
from harness.keys import Metric, Tag
from harness.registry.specs import Registry
from harness.run import distributed, failure
from harness.run.accumulate import with_batch_tokens
from harness.run.build import build, build_model, gate_kernels
from harness.run.plan import Plan, load_registry, plan
from harness.run.record import (
    PRUNED_SUFFIX,
    default_run_name,
    ending,
    provenance_tags,
    record,
    run_metrics,
)
from harness.run.resources import check_data, check_memory
from harness.run.sanity import meaningless
from harness.runtime.devices import device_tags, run_device
from harness.runtime.memory import PeakMemory
from harness.runtime.threads import torch_threads_kept
from harness.store import tracking
from harness.store.masking import mask_url


@dataclass
class RunResult:
    run_id: str | None
    status: str
    metrics: dict[str, float]
    num_params: int
    config: dict[str, Any]
    not_applicable: list[int] = field(default_factory=list)  # eval lengths the model cannot run
    rank: int = 0  # > 0: a process of a distributed run that recorded nothing (rank 0 did)


def as_config(config: RunConfig | dict[str, Any] | str | os.PathLike[str]) -> RunConfig:
    if isinstance(config, RunConfig):
        return config
    if isinstance(config, dict):
        return parse_run_config(config)
    return load_run_config(config)


def train(
    config: RunConfig | dict[str, Any] | str | os.PathLike[str] | None = None,
    *,
    registry: Registry | None = None,
    parent_run_id: str | None = None,
    callbacks: list[Any] | None = None,
    extra_tags: dict[str, str] | None = None,
    resume: str | None = None,
    tracking_uri: str | None = None,
    allow_failed: bool = False,
) -> RunResult:
    """Train one model on one task as the config says; return its metrics and MLflow run id.

    ``callbacks``: extra Lightning callbacks (a study adds its pruning callback).
    ``parent_run_id``: nest the run under this MLflow run (studies pass it explicitly).

    Failures are one paragraph, never a traceback: a bad config raises a ``ConfigError``
    before anything is recorded; a run that cannot fit in memory raises ``OutOfMemory``
    before anything is allocated; an exception while building, training or evaluating
    raises ``RunFailed`` naming the plugin and its frame (the run recorded FAILED, the memory
    it held released); Ctrl-C raises ``Interrupted`` saying which run was kept (KILLED).

    ``resume``: continue that MLflow run from its last checkpoint (:mod:`harness.run.resume`;
    ``config`` may be left out: the run's recorded one is used; ``tracking_uri``: the store
    it is in; ``allow_failed``: resume a FAILED run too).
    """
    started = time.perf_counter()
    run: Any = None
    if resume is not None:
        from harness.run.resume import check_resumable, find_run, recorded_config

        given = as_config(config) if config is not None else None
        tracker = tracking.Tracker(tracking_uri or (given.tracking.uri if given else None))
        run = find_run(tracker, resume)
        check_resumable(run, allow_failed=allow_failed)
        if given is None:
            data = recorded_config(tracker, resume)
            data["tracking"] = {**data.get("tracking", {}), "uri": tracker.uri}
            config = parse_run_config(data, f"the config of run {resume}")
    if config is None:
        raise ConfigError("harness.train needs a config (a path, dict or RunConfig), or resume=RUN_ID.")
    cfg = as_config(config)
    if parent_run_id is None:  # a study checked its store once, before its first trial
        tracking.preflight(cfg.tracking.uri)
    p = plan(cfg, load_registry(cfg, registry))
    rank = check_trainer_settings(cfg)
    p = with_budget_steps(with_batch_tokens(p))
    warned = meaningless(p)
    for text in warned if parent_run_id is None and not rank else ():  # a study says them once
        print(f"warning: {text}", file=sys.stderr, flush=True)
    if warned:
        extra_tags = {**(extra_tags or {}), Tag.WARNINGS: "; ".join(warned)}
    resumed = None
    with contextlib.ExitStack() as held:
        held.enter_context(torch_threads_kept())  # the caller's process keeps its own setting
        if run is not None:
            from harness.run.resume import prepare, resume_lock

            if not rank:  # one resume of a run at a time; ranks > 0 follow rank 0's
                held.enter_context(resume_lock(run.info.run_id))
            resumed = prepare(run, tracker, masked(p.resolved_config()), provenance_tags(p),
                              allow_failed=allow_failed, writes=not rank, data_now=lambda: task_identity(p))
        device = run_device(cfg.train.accelerator)
        if rank:
            return _follow(p, _build(p, device), callbacks or [], resumed, rank)
        return _run(p, _build(p, device), device, parent_run_id, callbacks or [], extra_tags or {},
                    started, resumed)


def task_identity(p: Plan) -> dict[str, str]:
    """What the plan's task reads now (:func:`harness.run.identity.of_task`), its task built
    for it alone (a resumed or re-run run compares it with its record before anything else)."""
    from harness.run import identity
    from harness.run.build import build_task

    return identity.of_task(build_task(p, seed=p.config.train.data_seed))


def with_budget_steps(p: Plan) -> Plan:
    """The plan with ``train.max_steps`` set from a compute budget (``train.max_flops`` or
    ``max_tokens``; :mod:`harness.run.flops`), before anything is recorded."""
    from harness.run.flops import probe, resolve_steps

    t = p.config.train
    if t.max_flops is None and t.max_tokens is None:
        return p
    cost = probe(p, measure_uncounted=t.flops_count == "all")
    steps = resolve_steps(p, cost)
    from harness.runtime.bounds import steps_problem

    what = f"train.max_flops = {t.max_flops:.3g}" if t.max_flops is not None else f"train.max_tokens = {t.max_tokens}"
    if (problem := steps_problem(steps, what)) is not None:
        raise ConfigError(f"{problem}. Lower the budget.")
    train = t.model_copy(update={"max_steps": steps})
    return replace(p, config=p.config.model_copy(update={"train": train}), step_cost=cost)


def count_uncounted(p: Plan, metrics: dict[str, float]) -> None:
    """With ``train.flops_count: all``, the realised compute also counts the element-wise and
    FFT work the counter misses (per token, as the run's probe measured it)."""
    cost = p.step_cost
    if p.config.train.flops_count != "all" or cost is None or Metric.TRAIN_TOKENS not in metrics:
        return
    metrics[Metric.UNCOUNTED_FLOPS_PER_TOKEN] = cost.uncounted_per_token
    if Metric.TRAIN_FLOPS in metrics:
        metrics[Metric.TRAIN_FLOPS] += cost.uncounted_per_token * metrics[Metric.TRAIN_TOKENS]


def _build(p: Plan, device: Any) -> Any:
    """The task and the model, after the memory check; a plugin's exception named."""
    check_data(p)
    try:
        built = build(p, check=lambda info: check_memory(p, info, device, build_model))
        gate_kernels(p, built, device)
        return built
    except (HarnessError, Interrupted):
        raise
    except BaseException as exc:
        if not isinstance(exc, Exception) and not failure.raised_by_plugin(exc, p):
            raise  # a real interrupt or exit, not a plugin's
        error = failure.build_error(exc, p) or failure.describe(exc, p, "building it")
    failure.release_memory(device)
    raise error


def _follow(p: Plan, built: Any, callbacks: list[Any], resume: Any, rank: int) -> RunResult:
    """A process of rank > 0: trains and evaluates in step with rank 0 and records nothing (no
    MLflow run started, written or ended, no checkpoint, no weights); its run id comes from
    rank 0 once the processes are connected (:class:`harness.run.distributed.ShareRun`)."""
    from harness.run.evaluate import evaluate
    from harness.run.fit import fit

    run_id = resume.run_id if resume is not None else distributed.PENDING
    fitted = fit(p, built, run_id, tracking.tracking_uri(p.config.tracking.uri), callbacks, resume,
                 records=False)
    evaluation = evaluate(p, built, fitted)
    distributed.unsharded(built, fitted, None)  # rank 0 gathers the full weights
    return RunResult(distributed.shared_run_id(fitted.trainer) or run_id, "FINISHED",
                     evaluation.metrics, built.num_params, p.resolved_config(),
                     evaluation.not_applicable, rank=rank)


def _run(p: Plan, built: Any, device: Any, parent_run_id: str | None, callbacks: list[Any],
         extra_tags: dict[str, str], started: float, resume: Any = None) -> RunResult:
    """Fit, evaluate and record one built run in its own MLflow run (``resume``: in the run
    it continues), which always ends FINISHED, FAILED or KILLED."""
    from harness.run import identity
    from harness.run.evaluate import evaluate
    from harness.run.fit import fit
    from harness.run.trained import save_final

    cfg = p.config
    resolved = p.resolved_config()
    data = identity.of_task(built.task)  # what the run's results may be computed with
    tracker = tracking.Tracker(cfg.tracking.uri)
    if built.kernel_warning:  # the kernel gate fell back to the reference
        print(f"warning: {built.kernel_warning}", file=sys.stderr, flush=True)
        said = [extra_tags[Tag.WARNINGS]] if Tag.WARNINGS in extra_tags else []
        extra_tags = {**extra_tags, Tag.WARNINGS: "; ".join([*said, built.kernel_warning])}
    run_name = cfg.tracking.run_name or default_run_name(p)
    if resume is not None:
        from harness.run.resume import reopen

        run_id = resume.run_id
        run_name = tracker.client.get_run(run_id).info.run_name or run_name
        if extra_tags:  # first: a study's reconcile reads them once the run is RUNNING
            tracker.set_tags(run_id, extra_tags)
        reopen(tracker, resume)
        tracker.set_tags(run_id, {**device_tags(device), **built.kernel_tags})  # it may continue on another device
    else:
        run_id = tracker.start_run(
            cfg.tracking.experiment, run_name=run_name,
            parent_run_id=parent_run_id,
            tags={**provenance_tags(p), **device_tags(device), **built.kernel_tags, **cfg.tracking.tags,
                  **extra_tags, Tag.DATA_IDENTITY: json.dumps(data)},
        )
    status = "FAILED"
    metrics: dict[str, float] = {}
    not_applicable: list[int] = []
    error: RunFailed | None = None
    stage = "starting"
    try:
        logged = masked(resolved)
        if resume is None:  # a resumed run has them already
            tracker.log_params(run_id, logged)
            tracker.log_dict(run_id, logged, "config.yaml")
            tracker.log_metrics(run_id, {Metric.PARAMS: built.num_params})
        with PeakMemory(device) as peak:
            stage = "training"
            fitted = fit(p, built, run_id, tracker.uri, callbacks, resume,
                         meta={"run_id": run_id, "config": json.dumps(logged), "data": data})
            tracker.set_tags(run_id, distributed.run_tags(fitted.trainer))
            stage = "evaluating"
            evaluated = time.perf_counter()
            evaluation = evaluate(p, built, fitted)
            eval_s = time.perf_counter() - evaluated
            built = distributed.unsharded(built, fitted, lambda: build_model(p, built.info))
        stage = "recording"
        if cfg.train.save_model:
            save_final(run_id, built, p, logged)
        metrics = run_metrics(built, fitted, evaluation, peak.metrics(), eval_s)
        count_uncounted(p, metrics)
        record(tracker, run_id, p, built, fitted, evaluation, metrics)
        metrics[Metric.TOTAL_S] = time.perf_counter() - started
        tracker.log_metrics(run_id, {Metric.TOTAL_S: metrics[Metric.TOTAL_S]})
        not_applicable = evaluation.not_applicable
        status = "FINISHED"
    except BaseException as exc:
        by_plugin = failure.raised_by_plugin(exc, p)  # a plugin's SystemExit is no interrupt
        status, tags = ("FAILED", {}) if by_plugin else ending(exc)
        if isinstance(exc, Interrupted):
            exc.kept = (f"MLflow run {run_id}, ended KILLED (tag {Tag.INTERRUPTED}=true) with "
                        f"what it logged while {stage}")
        elif by_plugin or (isinstance(exc, Exception) and not isinstance(exc, HarnessError)
                           and status == "FAILED"):
            error = failure.describe(exc, p, stage, run_id)
            tags[Tag.FAILURE] = str(error)
        tracker.set_tags(run_id, tags)
        if Tag.PRUNED in tags:
            tracker.rename(run_id, run_name + PRUNED_SUFFIX)
        if error is None:
            raise
    finally:
        tracker.end_run(run_id, status)
    if error is not None:  # raised outside the handler: the failed run's frames are freed
        del built
        failure.release_memory(device)
        raise error
    return RunResult(run_id, status, metrics, built.num_params, resolved, not_applicable)


def masked(resolved: dict[str, Any]) -> dict[str, Any]:
    """The resolved config as it is logged: the tracking URI without its password."""
    logged = dict(resolved)
    track = dict(logged.get("tracking") or {})
    if track.get("uri"):
        track["uri"] = mask_url(str(track["uri"]))
    logged["tracking"] = track
    return logged


def check_trainer_settings(cfg: RunConfig) -> int:
    """Lightning's own checks of the accelerator, devices, nodes, strategy and precision, run
    before anything is recorded (a GPU asked for on a machine without one, devices it lacks,
    nodes the launcher did not start); returns this process's rank in the run
    (:func:`harness.run.distributed.planned_rank`)."""
    import logging
    import warnings

    import lightning as L

    t = cfg.train
    before = logging.root.manager.disable  # the CLI may have quieted INFO already: keep that
    logging.disable(max(before, logging.INFO))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = L.Trainer(
                accelerator=t.accelerator, devices=t.devices, num_nodes=t.num_nodes,
                strategy=distributed.strategy(t.strategy), plugins=distributed.plugins(),
                precision=t.precision if t.precision != "auto" else "32-true",  # type: ignore[arg-type]
                logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, max_steps=1)
    except Exception as exc:  # MisconfigurationException, ValueError, TypeError, RuntimeError
        raise ConfigError(
            f"train: Lightning cannot train with accelerator={t.accelerator!r}, devices="
            f"{t.devices!r}, num_nodes={t.num_nodes}, strategy={t.strategy!r}, precision="
            f"{t.precision!r} on this machine: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
        ) from None
    finally:
        logging.disable(before)
    distributed.check_launch(trainer)
    if t.cuda_graphs:
        from harness.run.fit import capture_problem

        if problem := capture_problem(t, trainer.strategy.root_device.type):
            raise ConfigError(problem)
    return distributed.planned_rank(trainer)

