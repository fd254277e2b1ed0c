"""One run: resolve, build, fit, evaluate at every length, measure cost, record in MLflow.

``train(config)`` is the whole path of a run (``harness.train`` in the public API; this
module is not called ``train`` so it cannot shadow that function on the package). Everything that can be validated is validated
before the MLflow run is created; once it exists, the run always ends FINISHED, FAILED
(with the reason in the ``harness.failure`` tag) or KILLED (pruned or interrupted) —
never RUNNING.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import tracking
from harness.config import RunConfig, load_run_config, parse_run_config
from harness.data import BatchFormat
from harness.errors import PluginError
from harness.keys import Metric, Tag, component_tag, val_key
from harness.memory import PeakMemory
from harness.registry import Registry
from harness.run.plan import Plan, build_model, build_task, count_parameters, plan, task_info


@dataclass
class RunResult:
    run_id: str | None
    status: str
    metrics: dict[str, float]
    num_params: int
    config: dict[str, Any]
    not_applicable: list[int] = field(default_factory=list)  # eval lengths the model cannot run


def load_registry(config: RunConfig, registry: Registry | None) -> Registry:
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


def _throughput_callback() -> Any:
    import lightning as L
    import torch

    class Throughput(L.Callback):
        """Training tokens per second, skipping the first steps (warm-up, compilation)."""

        def __init__(self, skip: int = 3) -> None:
            self.skip, self.tokens, self.seconds, self._t0 = skip, 0, 0.0, 0.0

        def _sync(self, module: Any) -> None:
            if module.device.type == "cuda":
                torch.cuda.synchronize(module.device)

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, idx: int) -> None:
            self._sync(module)
            self._t0 = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, module: Any, out: Any, batch: Any, idx: int) -> None:
            self._sync(module)
            if trainer.global_step > self.skip:
                self.seconds += time.perf_counter() - self._t0
                key = "tokens" if "tokens" in batch else "tgt_in"
                self.tokens += int(batch[key].numel()) + int(batch.get("src", batch[key][:, :0]).numel())

        @property
        def tokens_per_s(self) -> float | None:
            return self.tokens / self.seconds if self.seconds > 0 else None

    return Throughput()


def _precision(requested: str) -> str:
    import torch

    if requested != "auto":
        return requested
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


def supported_lengths(p: Plan, task: Any, model: Any) -> tuple[list[int], list[int]]:
    """Split the task's evaluation lengths into those the model can run and those it cannot.

    The model's ``supports_length`` decides. A model without one runs every length unless
    its spec or its position scheme's declares ``extrapolates=False``: then it runs only
    inputs no longer than the longest training input.
    """
    ok: list[int] = []
    na: list[int] = []
    check = getattr(model, "supports_length", None)
    if check is None:
        fixed = not p.model.spec.extrapolates or (p.position and not p.position.spec.extrapolates)
        if not fixed:
            return list(task.eval_lengths), []
        trained = max(p.fmt.input_length(e, task.task_kind) for e in task.examples("train", task.train_length))
        check = trained.__ge__  # runs an input of n positions iff n <= trained
    for length in task.eval_lengths:
        if length == task.train_length:
            ok.append(length)
            continue
        need = max(p.fmt.input_length(e, task.task_kind) for e in task.examples("val", length))
        (ok if check(need) else na).append(length)
    return ok, na


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
    cfg = as_config(config)
    reg = load_registry(cfg, registry)
    p = plan(cfg, reg)
    task = build_task(p, seed=cfg.train.data_seed)
    info = task_info(p, task)

    import lightning as L
    import torch

    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    L.seed_everything(cfg.train.seed, workers=True, verbose=False)
    model = build_model(p, info)
    num_params = count_parameters(model)
    resolved = p.resolved_config()

    tracker = tracking.Tracker(cfg.tracking.uri)
    tags = {**provenance_tags(p), **cfg.tracking.tags, **(extra_tags or {})}
    run_id = tracker.start_run(
        cfg.tracking.experiment, run_name=cfg.tracking.run_name or default_run_name(p),
        parent_run_id=parent_run_id, tags=tags,
    )
    status = "FAILED"
    metrics: dict[str, float] = {}
    na: list[int] = []
    try:
        tracker.log_params(run_id, resolved)
        tracker.log_dict(run_id, resolved, "config.yaml")
        tracker.log_metrics(run_id, {Metric.PARAMS: num_params})
        metrics, na = _fit_and_evaluate(p, task, model, cfg, tracker, run_id, callbacks or [])
        metrics[Metric.PARAMS] = num_params
        status = "FINISHED"
    except BaseException as exc:
        status, tags = _ending(exc)
        tracker.set_tags(run_id, tags)
        raise
    finally:
        tracker.end_run(run_id, status)
    return RunResult(run_id, status, metrics, num_params, resolved, na)


def _is_pruned(exc: BaseException) -> bool:
    return type(exc).__name__ == "TrialPruned"


def _ending(exc: BaseException) -> tuple[str, dict[str, str]]:
    """MLflow status and tags of a run that ended with ``exc``.

    Pruned: KILLED + ``harness.pruned``. Interrupted: KILLED + ``harness.interrupted``; this
    covers Ctrl-C and SIGTERM, which Lightning turns into ``SystemExit`` (its
    ``SIGTERMException`` is one) after shutting the trainer down. Anything else: FAILED with
    the reason in ``harness.failure``.
    """
    if _is_pruned(exc):
        return "KILLED", {Tag.PRUNED: "true"}
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        return "KILLED", {Tag.INTERRUPTED: "true"}
    return "FAILED", {Tag.FAILURE: f"{type(exc).__name__}: {exc}"}


def _fit_and_evaluate(
    p: Plan, task: Any, model: Any, cfg: RunConfig, tracker: tracking.Tracker, run_id: str,
    callbacks: list[Any],
) -> tuple[dict[str, float], list[int]]:
    import lightning as L
    from lightning.pytorch.loggers import MLFlowLogger

    from harness.run.system import HarnessDataModule, HarnessSystem

    t = cfg.train
    dm = HarnessDataModule(task, p.fmt, t.batch_size, t.seed)
    system = HarnessSystem(model, task, p.fmt, t)
    throughput = _throughput_callback()
    logger = MLFlowLogger(
        experiment_name=cfg.tracking.experiment, tracking_uri=tracker.uri, run_id=run_id,
        log_model=False,
    )
    root = tracking.home() / "lightning"
    trainer = L.Trainer(
        max_steps=t.max_steps,
        max_time={"seconds": t.max_time_s} if t.max_time_s else None,  # type: ignore[dict-item]
        val_check_interval=min(t.val_every, t.max_steps),
        check_val_every_n_epoch=None,
        accelerator=t.accelerator,
        devices=t.devices,
        strategy=t.strategy,
        precision=_precision(t.precision),  # type: ignore[arg-type]
        gradient_clip_val=t.grad_clip,
        logger=logger,
        callbacks=[throughput, *callbacks],
        enable_checkpointing=t.checkpoint,
        enable_progress_bar=t.progress,
        enable_model_summary=False,
        log_every_n_steps=max(1, min(50, t.val_every // 4)),
        num_sanity_val_steps=0,
        default_root_dir=root,
        deterministic="warn" if t.accelerator != "cpu" else True,
    )
    with warnings.catch_warnings(), PeakMemory(trainer.strategy.root_device) as peak:
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        warnings.filterwarnings("ignore", ".*LeafSpec.*")
        trainer.fit(system, datamodule=dm)
        ok, na = supported_lengths(p, task, model)
        dm.val_lengths = system.val_lengths = ok
        trainer.validate(system, datamodule=dm, verbose=False)

    metrics = dict(system.final_metrics)
    if throughput.tokens_per_s:
        metrics[Metric.TOKENS_PER_S] = throughput.tokens_per_s
    metrics.update(peak.metrics())
    metrics[Metric.TRAIN_STEPS] = float(trainer.global_step)
    tracker.log_metrics(run_id, metrics, step=trainer.global_step)
    if na:
        tracker.set_tags(run_id, {Tag.NOT_APPLICABLE: ",".join(map(str, na))})
    _log_figures(p, task, system, cfg, tracker, run_id, ok)
    return metrics, na


def _log_figures(p: Plan, task: Any, system: Any, cfg: RunConfig, tracker: tracking.Tracker,
                 run_id: str, lengths: list[int]) -> None:
    from harness import plots
    with tempfile.TemporaryDirectory() as tmp:
        metric = "acc"
        curve = {n: system.final_metrics[val_key(metric, n)] for n in lengths
                 if val_key(metric, n) in system.final_metrics}
        if len(task.eval_lengths) > 1 and curve:
            path = plots.extrapolation_curve({default_run_name(p): curve}, metric=val_key(metric),
                                             train_length=task.train_length,
                                             path=Path(tmp) / "extrapolation.png")
            tracker.log_artifact(run_id, path, "plots")
            tracker.log_dict(run_id, {"metric": metric, "train_length": task.train_length,
                                      "points": {str(k): v for k, v in curve.items()}},
                             "plots/extrapolation.json")
        if cfg.train.log_attention and (p.attention is not None or p.attention_roles):
            for i, maps in enumerate(attention_maps(system.model, task, p.fmt, count=2)):
                path = plots.attention_maps(maps, Path(tmp) / f"attention_{i}.png",
                                            title=f"{default_run_name(p)} — example {i}")
                tracker.log_artifact(run_id, path, "attention")


def attention_maps(model: Any, task: Any, fmt: BatchFormat, count: int = 2) -> list[list[Any]]:
    """Attention weights (per layer: heads x Lq x Lk) of the first validation examples, for
    models whose forward accepts ``return_attention=True``."""
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
    return [[w[i].float().cpu().numpy() for w in layers] for i in range(len(examples))] if layers else []


def provenance_tags(p: Plan) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    tags = {}
    for role, comp in p.components().items():
        tags[component_tag(role)] = comp.name
        for attr in ("plugin", "distribution", "version"):
            tags[component_tag(role, attr)] = getattr(comp.spec, attr)
    with contextlib.suppress(PackageNotFoundError):
        tags[Tag.VERSION] = version("attention-harness")
    commit = tracking.git_commit()
    if commit:
        tags[Tag.GIT_COMMIT] = commit
    tags[Tag.BATCH_FORMAT] = str(p.fmt)
    return tags


def default_run_name(p: Plan) -> str:
    parts = [p.model.name]
    if p.attention or p.attention_roles:  # the shared variant, then overrides: linear,cross=additive
        shared = [p.attention.name] if p.attention else []
        parts.append(",".join(shared + [f"{r}={c.name}" for r, c in p.attention_roles.items()]))
    if p.position:
        parts.append(p.position.name)
    return "/".join(parts) + f" on {p.task.name}"
