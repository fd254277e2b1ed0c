"""Stage 3 of a run: fit the model with Lightning (the system of :mod:`harness.run.system`).

Returns a :class:`Fitted`: the trainer, system and data module (evaluation reuses them) and
what fitting measured (steps, throughput, FLOPs per token, the probed step's peak tensor
memory, the data-wait share: :mod:`harness.run.meters`). Callbacks are top-level classes,
so a run pickles for Lightning's ``ddp_spawn``.

``train.compile: true`` compiles the model in place (``nn.Module.compile``: its parameters
and state dict are unchanged) with :data:`COMPILE_BACKEND`; graph breaks fall back to eager
code as ``torch.compile`` always does, and a backend that fails (no C++ compiler for
inductor on the CPU, an unsupported operation) fails the run with a
:class:`~harness.run.system.CompileFailed` error that says to set ``train.compile: false``.
``train.precision``: see :func:`harness.runtime.devices.precision`; ``train.tf32`` and
``train.deterministic``: :func:`harness.runtime.devices.matmul_precision` and
:func:`harness.runtime.devices.deterministic`. ``train.micro_batch_size``: gradient
accumulation (:mod:`harness.run.accumulate`), with ``val_every`` still in optimizer steps;
``train.activation_checkpointing``: :mod:`harness.nn.checkpointing`, applied before compiling.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import lightning as L

from harness.errors import HarnessError
from harness.keys import Metric
from harness.nn.checkpointing import checkpoint_blocks
from harness.run import checkpoint, distributed
from harness.run.build import Built
from harness.run.console import StepBar
from harness.run.grouped import Grouped
from harness.run.meters import DataWait, EvalThroughput, StepProbe, Throughput
from harness.run.plan import Plan
from harness.run.resume import OncePerStep, Resume
from harness.run.system import HarnessDataModule, HarnessSystem
from harness.run.trainlog import log_every
from harness.runtime import devices
from harness.store import tracking

#: Lightning warnings nobody can act on here (a DataLoader over in-memory examples needs no workers).
QUIET = (".*does not have many workers.*", ".*LeafSpec.*")


#: torch.compile's backend for ``train.compile`` (tests swap it for a failing one).
COMPILE_BACKEND = "inductor"


@dataclass
class Fitted:
    trainer: Any
    system: HarnessSystem
    datamodule: HarnessDataModule
    steps: int
    tokens_per_s: float | None
    seconds: float = 0.0  # wall time of trainer.fit
    device: Any = None  # the (first) device it trained on
    #: the cost metrics fitting measured (flops per token, peak tensor memory, data wait)
    costs: dict[str, float] = field(default_factory=dict)


def fit(p: Plan, built: Built, run_id: str, tracking_uri: str, callbacks: list[Any],
        resume: Resume | None = None, meta: dict[str, Any] | None = None,
        records: bool = True) -> Fitted:
    """Train ``built.model`` as ``p.config.train`` says, logging to the MLflow run ``run_id``;
    ``resume``: continue from that checkpoint (:mod:`harness.run.resume`). ``meta`` goes into
    every checkpoint (:mod:`harness.run.checkpoint`). ``records=False``: a rank > 0 of a
    distributed run, with no logger (not even an MLflow client: :mod:`harness.run.distributed`)."""
    t = p.config.train
    device = devices.run_device(t.accelerator)
    dm = HarnessDataModule(built.task, p.fmt, t.batch_size, t.seed, t.micro_batch_size, one_shape=t.cuda_graphs)
    if t.activation_checkpointing:
        checkpoint_blocks(built.model)
    devices.matmul_precision(device, t.tf32)
    if t.compile or t.cuda_graphs:
        built.model.compile(backend=COMPILE_BACKEND, **({"mode": "reduce-overhead"} if t.cuda_graphs else {}))
    system = HarnessSystem(built.model, built.task, p.fmt, t)
    wait = DataWait()
    probe = StepProbe(p.fmt, step=1 if t.max_steps > 1 else 0, compiled=t.compile or t.cuda_graphs)
    every = checkpoint.schedule(t.checkpoint_every, device.type)
    callbacks = [*callbacks, checkpoint.Checkpointing(  # off: only SIGUSR1 saves
        checkpoint.folder(run_id), every, keep=t.checkpoint_keep, best=t.checkpoint_best,
        metric=t.checkpoint_metric, mode=t.checkpoint_mode, meta=meta or {}, datamodule=dm)]
    kwargs: dict[str, Any] = {"experiment_name": p.config.tracking.experiment, "tracking_uri": tracking_uri,
              "run_id": run_id, "log_model": False}
    logger: Any = False  # a rank > 0: rank 0 logs
    if records:
        logger = OncePerStep(**kwargs, logged=resume.logged if resume else None)
    clip, clippers = distributed.clipping(t.strategy, t.grad_clip)
    trainer = L.Trainer(
        max_steps=t.max_steps,
        max_time={"seconds": t.max_time_s} if t.max_time_s else None,  # type: ignore[dict-item]
        val_check_interval=min(t.val_every, t.max_steps) * dm.accumulate,  # counts micro-batches
        accumulate_grad_batches=dm.accumulate,
        check_val_every_n_epoch=None,
        accelerator=t.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=distributed.strategy(t.strategy),
        plugins=distributed.plugins(),
        precision=devices.precision(t.precision, device),  # type: ignore[arg-type]
        gradient_clip_val=clip,
        logger=logger,
        # the harness's stateless callbacks as one (harness.run.grouped): fewer calls a step
        callbacks=[Grouped([Throughput(p.fmt, wait), probe, EvalThroughput(p.fmt), *clippers,
                            distributed.ShareRun(run_id, callbacks[-1], resume.step if resume else None),
                            *([CaptureCheck()] if t.cuda_graphs else [])]),
                   *callbacks, *([StepBar()] if t.progress else [])],
        profiler=wait,
        enable_checkpointing=t.checkpoint,
        enable_progress_bar=t.progress,
        enable_model_summary=False,
        log_every_n_steps=log_every(t),  # the system logs training metrics itself (harness.run.trainlog)
        num_sanity_val_steps=0,
        default_root_dir=tracking.home() / "lightning",
        deterministic=devices.deterministic(device, t.deterministic),
    )
    started = time.perf_counter()
    with warnings.catch_warnings():
        for pattern in QUIET:
            warnings.filterwarnings("ignore", pattern)
        if resume is None:
            trainer.fit(system, datamodule=dm)
        else:  # tensors and plain data only (harness.run.checkpoint)
            trainer.fit(system, datamodule=dm, ckpt_path=resume.path, weights_only=True)
    seconds = time.perf_counter() - started
    results = trainer.callback_metrics
    rate = float(results.get(Metric.TOKENS_PER_S, 0.0))
    costs = {k: float(results[k]) for k in FIT_COSTS if k in results}
    saver = callbacks[-1]
    if saver.saved:  # what checkpointing cost this process
        costs[Metric.CHECKPOINT_S] = saver.seconds
        costs[Metric.CHECKPOINT_MB] = checkpoint.disk_bytes(saver.root) / 2**20
    return Fitted(trainer, system, dm, int(results.get(Metric.TRAIN_STEPS, trainer.global_step)),
                  rate or None, seconds, device, costs)


# -- train.cuda_graphs ------------------------------------------------------------------------
def capture_problem(train: Any, device_type: str) -> str | None:
    """Why ``train.cuda_graphs`` cannot capture this run's steps (checked before anything is
    recorded), or None. Batches of changing shape are refused when the training loader is
    made (:class:`~harness.run.system.HarnessDataModule`), a step torch could not capture
    after its first steps (:class:`CaptureCheck`)."""
    fix = "Set train.cuda_graphs: false"
    if device_type != "cuda":
        return (f"train.cuda_graphs: CUDA graphs replay kernels recorded on a CUDA device, and this "
                f"run trains on the {device_type}. {fix}, or train on a GPU (train.accelerator: gpu).")
    if train.strategy.startswith("fsdp"):
        return (f"train.cuda_graphs: FSDP gathers and frees each layer's parameters around every "
                f"step with collectives a CUDA graph cannot hold. {fix}, or train with strategy ddp.")
    return None


class CaptureFailed(HarnessError):
    """``train.cuda_graphs``: torch could not capture the model's step in CUDA graphs."""


class CaptureCheck(L.Callback):
    """``train.cuda_graphs``: once the first steps have been recorded (torch records CUDA
    graphs at a compiled function's second and third calls), refuse a run whose step torch
    skipped (a host read, a CPU tensor, a mutated input in the model: torch counts each skip
    and logs why under ``TORCH_LOGS=perf_hints``)."""

    AFTER = 3

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        if trainer.global_step != self.AFTER:
            return
        from torch._dynamo.utils import counters

        skips = int(counters["inductor"].get("cudagraph_skips", 0))
        if skips:
            raise CaptureFailed(
                f"train.cuda_graphs: torch could not capture the training step of model "
                f"{type(pl_module.model).__name__} in CUDA graphs ({skips} part(s) skipped: a host "
                f"read such as .item(), a CPU tensor or a mutated input in the model; run with "
                f"TORCH_LOGS=perf_hints to see which). Set train.cuda_graphs: false.")


#: What fitting measures besides throughput (see :mod:`harness.run.meters`).
FIT_COSTS = (Metric.FLOPS_PER_TOKEN, Metric.PEAK_TENSOR_MB, Metric.DATA_WAIT_SHARE, Metric.TRAIN_TOKENS)
