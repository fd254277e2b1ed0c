"""One run on several processes, recorded once.

A run with several devices or machines runs as one process per device. Lightning's ``ddp``
starts them by running the same command again per rank (``LOCAL_RANK`` set); ``torchrun``
and Slurm's ``srun`` start them all at once (``RANK``, ``SLURM_PROCID``). Each process runs
the whole pipeline: plan, build, fit, evaluate. Only rank 0 records (:func:`planned_rank`
decides before anything is recorded): it creates or reopens the MLflow run, logs params,
metrics, tags and figures, writes checkpoints and the final weights, and ends the run. The
other ranks never start, write to or end an MLflow run and never write a checkpoint; they
train and validate in step with rank 0 and learn its run id once the process group exists
(:class:`ShareRun`, through Lightning's own broadcast). On ``--resume`` every rank loads the
same checkpoint (from a file system every node sees); a rank that found another one stops
the run with a message.

``train.strategy: fsdp`` shards parameters, gradients and optimizer state over the devices
(:func:`strategy`); its checkpoints hold the full state dict, gathered on rank 0, so they
resume on any number of devices and load as any other.

SIGUSR1 on any rank stops every rank at one agreed step (:class:`AgreeOnStop`).

The run's distributed facts are tags (:func:`run_tags`): world size, nodes, strategy and
launcher. See docs/scaling_out.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.strategies import FSDPStrategy

from harness.errors import HarnessError
from harness.keys import Tag

#: The run id of ranks > 0 until rank 0's arrives (never created, never written to).
PENDING = "pending-rank"


def planned_rank(trainer: Any) -> int:
    """This process's global rank in its run, read as Lightning reads it, before any process
    group exists: ``trainer`` is built for the run's accelerator, devices, nodes and strategy,
    so it holds the cluster environment Lightning detected (torchrun's ``RANK``, Slurm's
    ``SLURM_PROCID``, the ``LOCAL_RANK`` and ``NODE_RANK`` it gives the processes it starts
    itself). 0 for one process, and for spawn launchers (their processes never run the
    pipeline). Nothing is changed: Lightning's own ``set_world_ranks`` would set its global
    rank-zero switch."""
    from lightning.fabric.plugins.environments import LightningEnvironment

    strategy = trainer.strategy
    env = getattr(strategy, "cluster_environment", None)
    if env is None:
        return 0
    if isinstance(env, LightningEnvironment):  # ranks from LOCAL_RANK and NODE_RANK
        return int(env.node_rank()) * int(strategy.num_processes) + int(env.local_rank())
    return int(env.global_rank())


def check_launch(trainer: Any) -> None:
    """Several nodes need a launcher that starts them (torchrun, Slurm, or NODE_RANK set by
    hand), and under torchrun the processes it started must be the run's devices times its
    nodes: otherwise each process would train alone (a run each) or wait for ranks that never
    come."""
    import os

    from lightning.fabric.plugins.environments import TorchElasticEnvironment

    from harness.errors import ConfigError

    env = getattr(trainer.strategy, "cluster_environment", None)
    if trainer.num_nodes > 1 and type(env).__name__ == "LightningEnvironment" and "NODE_RANK" not in os.environ:
        raise ConfigError(
            f"train.num_nodes is {trainer.num_nodes}, but nothing started the other nodes: no "
            f"torchrun, Slurm or other cluster launcher is visible, and NODE_RANK is not set, so "
            f"this process would wait for them forever. Launch each node with torchrun "
            f"(--nnodes {trainer.num_nodes}) or srun, or set train.num_nodes to 1 "
            f"(docs/scaling_out.md).")
    if not TorchElasticEnvironment.detect():
        return
    launched, planned = int(os.environ["WORLD_SIZE"]), trainer.num_nodes * trainer.num_devices
    if launched != planned:
        raise ConfigError(
            f"train: torchrun started {launched} processes, but train.devices x train.num_nodes "
            f"is {trainer.num_devices} x {trainer.num_nodes} = {planned}. Set train.devices to "
            f"torchrun's --nproc-per-node and train.num_nodes to its --nnodes (and strategy: ddp "
            f"or fsdp).")


class ShareRun(L.Callback):
    """Once the process group exists, every rank takes rank 0's run id (ranks > 0 start with
    :data:`PENDING`) and checks that it resumes from rank 0's checkpoint step; the checkpoint
    callback ``saver`` then points at the run's folder on every rank."""

    def __init__(self, run_id: str, saver: Any, resume_step: int | None) -> None:
        self.run_id, self.saver, self.resume_step = run_id, saver, resume_step

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if trainer.world_size <= 1:
            return
        run_id, step = trainer.strategy.broadcast((self.run_id, self.resume_step), src=0)
        if step != self.resume_step:
            raise HarnessError(
                f"rank {trainer.global_rank} would resume run {run_id} from the checkpoint of "
                f"step {self.resume_step}, rank 0 from step {step}: every node must see the same "
                f"checkpoints. Put HARNESS_HOME on a file system every node mounts.")
        self.run_id = run_id
        from harness.run.checkpoint import folder

        self.saver.root = Path(folder(run_id))


class AgreeOnStop(L.Callback):
    """SIGUSR1 on any rank stops every rank at the same step. A scheduler's warning reaches
    the ranks at slightly different steps (or only one of them: ``kill -USR1`` on the
    command); a checkpoint taken at different steps would deadlock FSDP's gathering and leave
    DDP's ranks waiting for each other. While a run has several processes, SIGUSR1 only notes
    the request; every ``every`` steps the ranks combine their notes (one all-reduce of a
    flag: on a GPU a host sync every ``every`` steps, not every step) and, if any rank has
    one, all of them ask :mod:`harness.run.checkpoint` to checkpoint at that same step and
    stop. Listed before the checkpoint callback, so its hook runs first."""

    def __init__(self, every: int = 10) -> None:
        self.every, self.noted = every, False
        self.previous: Any = None

    def _note(self, *_: Any) -> None:
        self.noted = True

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        import signal
        import threading

        if trainer.world_size > 1 and hasattr(signal, "SIGUSR1") and \
                threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGUSR1, self._note)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        from harness.run.checkpoint import request_stop, stop_requested

        if self.previous is None or stop_requested() or trainer.global_step % self.every:
            return
        if trainer.strategy.reduce_boolean_decision(self.noted, all=False):
            request_stop()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGUSR1, self.previous)
            self.previous = None


def run_tags(trainer: Any) -> dict[str, str]:
    """What trained the run: processes, machines, Lightning's strategy class and who started
    the processes (``none`` for one process)."""
    strategy = trainer.strategy
    return {Tag.WORLD_SIZE: str(trainer.world_size), Tag.NUM_NODES: str(trainer.num_nodes),
            Tag.STRATEGY: type(strategy).__name__,
            Tag.LAUNCHER: launcher(getattr(strategy, "cluster_environment", None))}


def launcher(env: Any) -> str:
    names = {"TorchElasticEnvironment": "torchrun", "SLURMEnvironment": "slurm",
             "LightningEnvironment": "lightning"}
    return "none" if env is None else names.get(type(env).__name__, type(env).__name__)


def plugins() -> list[Any]:
    """Under Slurm, its environment without Lightning's automatic requeue: the harness handles
    SIGUSR1 itself (a checkpoint, exit 75; examples/slurm_study.sh requeues), and Lightning's
    handler would write a second checkpoint outside the run's folder and requeue the job a
    second time."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def strategy(name: str) -> Any:
    """``train.strategy`` as Lightning takes it: a name, except ``fsdp`` (:func:`fsdp`)."""
    return fsdp() if name == "fsdp" else name


class HarnessFSDP(FSDPStrategy):
    """Lightning's FSDP strategy, runnable on the CPU with gloo (how the CPU tests run it):
    Lightning refuses ``FSDPStrategy`` itself without a GPU (its check names the class, so a
    subclass passes) and wraps the model with ``device_id=None`` there, which torch's FSDP
    refuses; torch's FSDP itself runs on the CPU given ``device_id=cpu``. On a GPU nothing
    differs from Lightning's."""

    _root: Any = None

    def _setup_model(self, model: Any) -> Any:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        if self._root is not None and self._root.module is model:
            # validating after fit: the blocks are wrapped, and Lightning (seeing them) would
            # not wrap the root again, leaving the root's parameters flat and sharded
            return self._root
        if self.root_device.type == "cpu" and not any(isinstance(m, FSDP) for m in model.modules()):
            model = FSDP(model, cpu_offload=self.cpu_offload, mixed_precision=self.mixed_precision_config,
                         sharding_strategy=self.sharding_strategy, device_id=self.root_device,
                         **self.kwargs)
            self.kwargs.pop("auto_wrap_policy", None)  # applied: Lightning would warn it is not
        self._root = super()._setup_model(model)
        return self._root

    # Lightning gathers a full state dict with offload_to_cpu=True, which torch 2.13's FSDP
    # cannot do for parameters already on the CPU (a storage error, or a crash): no offload there.
    def _full(self) -> Any:
        from torch.distributed.fsdp import (
            FullOptimStateDictConfig,
            FullStateDictConfig,
            StateDictType,
        )
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        assert self.model is not None
        offload = self.root_device.type != "cpu"
        return FSDP.state_dict_type(self.model, StateDictType.FULL_STATE_DICT,
                                    FullStateDictConfig(offload_to_cpu=offload, rank0_only=True),
                                    FullOptimStateDictConfig(offload_to_cpu=offload, rank0_only=True))

    def lightning_module_state_dict(self) -> dict[str, Any]:
        if self.root_device.type != "cpu":
            return super().lightning_module_state_dict()
        assert self.model is not None
        with self._full():
            return self.model.state_dict()

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        if self.root_device.type != "cpu":
            return super().optimizer_state(optimizer)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import OptimStateKeyType

        optimizer = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer's own
        assert self.model is not None
        with self._full():
            state = FSDP.optim_state_dict(self.model, optimizer)
            if self.global_rank == 0:  # keyed by parameter index, as Lightning stores it
                state = FSDP.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
            return state  # type: ignore[no-any-return]


def unsharded(built: Any, fitted: Any, rebuild: Any) -> Any:
    """After FSDP, rank 0's ``built`` (and its fitted system) with a plain model holding the
    full weights (gathered from every rank: call it on all ranks), for what rank 0 does alone
    afterwards (figures, attention maps, the final weights); ``built`` itself otherwise."""
    from dataclasses import replace

    trainer = fitted.trainer
    if not isinstance(trainer.strategy, FSDPStrategy):
        return built
    state = trainer.strategy.lightning_module_state_dict()  # full on rank 0, empty elsewhere
    if trainer.global_rank != 0:
        return built
    model = rebuild()
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    fitted.system.model = model
    return replace(built, model=model)


def fsdp() -> HarnessFSDP:
    """FSDP with each Transformer block its own unit (its parameters gathered for its forward
    and backward only; a model without such blocks is one unit: sharded at rest, gathered
    whole for each step), checkpoints as one full state dict gathered on rank 0."""
    from harness.nn.blocks import TransformerBlock

    return HarnessFSDP(auto_wrap_policy={TransformerBlock}, state_dict_type="full")


def clipping(strategy_name: str, grad_clip: float | None) -> tuple[float | None, list[Any]]:
    """``train.grad_clip`` as Lightning's ``gradient_clip_val``, and the callbacks that go
    before the checkpoint callback: :class:`AgreeOnStop`, and for FSDP
    :class:`ClipShardedGradients` (Lightning clips FSDP gradients only by value)."""
    if strategy_name == "fsdp" and grad_clip:
        return None, [AgreeOnStop(), ClipShardedGradients(grad_clip)]
    if grad_clip:
        return None, [AgreeOnStop(), ClipGradients(grad_clip)]
    return None, [AgreeOnStop()]


class ClipGradients(L.Callback):
    """Clip the optimiser's gradients to a total norm, as Lightning's ``gradient_clip_val``
    does (``torch.nn.utils.clip_grad_norm_`` over the optimiser's parameters, after backward and
    the gradients' all-reduce, before the step), for every optimiser: Lightning refuses to clip
    for a fused one (``fused=True`` Adam(W), which the harness uses on a GPU: every GPU run with
    ``train.grad_clip`` failed at its first step, found by the GPU proof), since under a
    ``16-mixed`` GradScaler such an optimiser unscales inside its step; here the scaler
    unscales first (``GradScaler.unscale_``, which fused optimisers accept), so the clip sees
    true gradients; under bf16 or float32 there is nothing to unscale."""

    def __init__(self, max_norm: float) -> None:
        self.max_norm = max_norm

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        import torch

        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None and getattr(optimizer, "_step_supports_amp_scaling", False):
            scaler.unscale_(optimizer)  # Lightning unscales the others itself before this hook
        params = [p for group in optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, self.max_norm)


class ClipShardedGradients(L.Callback):
    """Clip FSDP's sharded gradients to a total norm (``FullyShardedDataParallel.clip_grad_norm_``:
    the norm over every shard, the same clip as one process's), after backward, before the
    optimizer step. (With ``16-mixed`` the gradients are still scaled here: use bf16.)"""

    def __init__(self, max_norm: float) -> None:
        self.max_norm = max_norm

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        trainer.strategy.model.clip_grad_norm_(self.max_norm)


def shared_run_id(trainer: Any) -> str | None:
    """The run id :class:`ShareRun` received from rank 0 (None without one)."""
    from harness.run.grouped import members

    return next((c.run_id for c in members(trainer.callbacks) if isinstance(c, ShareRun)), None)
