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
    """Lightning's FSDP strategy under its own class name: Lightning refuses ``FSDPStrategy``
    itself (the name and the class) without a GPU, torch's FSDP runs on the CPU with gloo, and
    this is how the CPU tests run it. Nothing is overridden."""


def fsdp() -> HarnessFSDP:
    """FSDP with each Transformer block its own unit (its parameters gathered for its forward
    and backward only; a model without such blocks is one unit: sharded at rest, gathered
    whole for each step), checkpoints as one full state dict gathered on rank 0."""
    from harness.nn.blocks import TransformerBlock

    return HarnessFSDP(auto_wrap_policy={TransformerBlock}, state_dict_type="full")


def shared_run_id(trainer: Any) -> str | None:
    """The run id :class:`ShareRun` received from rank 0 (None without one)."""
    return next((c.run_id for c in trainer.callbacks if isinstance(c, ShareRun)), None)
