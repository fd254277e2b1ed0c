"""One home for the names the harness writes and reads back.

Study phases, MLflow tags, MLflow metric keys and Optuna trial attributes are each spelled
here once; every module imports them from here (a literal repeated in several modules is a
rename waiting to break something). Tags, attributes and metric keys are plain ``str``
constants (not enum members): they travel through pickles that allow only builtins, such as
the results Lightning's ``ddp_spawn`` sends back with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """The two phases of a study: tune each candidate, then confirm its best configuration
    with fresh seeds."""

    TUNE = "tune"
    CONFIRM = "confirm"


class Tag:
    """MLflow run tags written by the harness."""

    # every run
    VERSION = "harness.version"
    TORCH_VERSION = "harness.torch_version"
    RERUN_OF = "harness.rerun_of"  # the run `harness train --from-run` re-ran
    BATCH_FORMAT = "harness.batch_format"
    DOCUMENTS = "harness.documents"  # packed | separate: windows of packed documents (corpus_lm)
    KERNEL = "harness.kernel"  # the mixer's implementation: fla | reference | pytorch (no mixer)
    KERNEL_GATE = "harness.kernel_gate"  # the fast path's check against the reference: passed/failed: why
    FAILURE = "harness.failure"  # the reason a run FAILED
    PRUNED = "harness.pruned"  # stopped by the pruner: FINISHED, named "... (pruned)"
    INTERRUPTED = "harness.interrupted"  # KILLED by Ctrl-C, SIGTERM or a dead worker
    PREEMPTED = "harness.preempted"  # KILLED after checkpointing on SIGUSR1 (resumable)
    RESUMED = "harness.resumed_from_step"  # the checkpoint step the run last resumed from
    NOT_APPLICABLE = "harness.not_applicable_lengths"  # lengths the model cannot run
    WARNINGS = "harness.warnings"  # legal but meaningless settings (harness.run.sanity)
    WORLD_SIZE = "harness.world_size"  # processes that trained the run (harness.run.distributed)
    NUM_NODES = "harness.num_nodes"
    STRATEGY = "harness.strategy"  # Lightning's strategy class: SingleDeviceStrategy, DDPStrategy, ...
    LAUNCHER = "harness.launcher"  # who started the processes: lightning, torchrun, slurm, ...
    # the machine a run trained on (harness.runtime.devices.device_tags)
    DEVICE = "harness.device"  # the GPU's model name, or "cpu: <the CPU's model name>"
    DEVICE_CAPABILITY = "harness.device.capability"  # CUDA compute capability, "9.0"
    CUDA_VERSION = "harness.cuda_version"  # the CUDA torch was built with
    DRIVER_VERSION = "harness.driver_version"  # the NVIDIA kernel driver
    DATA = "harness.data"  # what the task read (Task.data_summary): a user's corpus or files
    DATA_PARAMS = "harness.data_params"  # the task params that summary replaces (comma list)
    #: what a run's results may be computed with (JSON: vocabulary, tokenizer and data
    #: digests; harness.run.identity), set when the run starts
    DATA_IDENTITY = "harness.data_identity"
    #: characters of `harness eval`'s text outside the run's vocabulary, read as <unk>
    EVAL_UNKNOWN = "harness.eval_unknown"
    # the runs of a study (parent and children)
    STUDY = "harness.study"
    KIND = "harness.kind"  # "study" on a study's parent run
    STORAGE = "harness.storage"
    FINGERPRINT = "harness.fingerprint"
    NOTES = "harness.notes"
    STUDY_STATE = "harness.study_state"  # complete | incomplete
    PHASE = "harness.phase"
    CANDIDATE = "harness.candidate"
    TRIAL = "harness.trial"  # "<optuna study>#<trial number>": the key back to Optuna
    TRIAL_NUMBER = "harness.trial_number"
    SLOT = "harness.slot"
    SEED = "harness.seed"
    WORKER = "harness.worker"
    DOWNSTREAM_FAILED = "harness.downstream_failed"  # why a study's lm-eval tasks did not run
    GIT_COMMIT = "mlflow.source.git.commit"
    PARENT_RUN = "mlflow.parentRunId"
    NOTE = "mlflow.note.content"  # the run's description (Markdown), shown first on its page


def component_tag(role: str, field: str | None = None) -> str:
    """The tag naming a run's component: ``harness.attention`` (its name) or
    ``harness.attention.plugin`` (``field``: plugin, distribution, version)."""
    return f"harness.{role}" + (f".{field}" if field else "")


class Attr:
    """Optuna user attributes of the harness's studies and trials."""

    RECORD = "harness.record"  # on the record study: config, fingerprint, parent run, ...
    CANDIDATE = "harness.candidate"  # on each candidate's study
    SLOT = "harness.slot"  # slot number of an enqueued trial
    SEED = "harness.seed"  # training seed of a confirmation slot
    RUN = "harness.mlflow_run_id"
    CONFIG = "harness.run_config"  # the run config a trial trained
    FAILURE = "harness.failure"
    TUNING_TRIAL = "harness.tuning_trial"  # the tuning trial a confirmation re-runs


class Metric:
    """MLflow metric keys that are not per-length validation metrics."""

    TRAIN_LOSS = "train/loss"
    TRAIN_ACC = "train/acc"
    TRAIN_STEPS = "train/steps"
    # cost: logged by every run (harness.run.record), ranked and plotted by studies
    PARAMS = "cost/params"
    STATE_SIZE = "cost/state_size"  # decoding-state elements per sequence at the training length
    STATE_BYTES = "cost/state_bytes"  # the same in bytes, at the run's precision (4 for fp32)
    TOKENS_PER_S = "cost/train_tokens_per_s"  # training steps, warm-up steps excluded
    EVAL_TOKENS_PER_S = "cost/eval_tokens_per_s"  # the final evaluation, every length
    FLOPS_PER_TOKEN = "cost/flops_per_token"  # one training step (forward + backward), counted
    MFU = "cost/mfu"  # model FLOPs utilisation against the device's dense bf16 peak (GPU)
    PEAK_GPU_MB = "cost/peak_gpu_mem_mb"  # device allocator high-water mark while training
    PEAK_TENSOR_MB = "cost/peak_tensor_mb"  # CPU: tensor storages alive at a step's peak
    PROCESS_PEAK_RSS_MB = "cost/process_peak_rss_mb"  # the whole process, not the model
    DATA_WAIT_SHARE = "cost/data_wait_share"  # share of training time spent waiting for data
    FIT_S = "cost/fit_s"  # wall time of fitting (training and its validations)
    EVAL_S = "cost/eval_s"  # wall time of the final evaluation
    TOTAL_S = "cost/total_s"  # wall time of the whole run, planning to recording
    THREADS = "cost/cpu_threads"  # torch CPU threads the run used
    # compute budgets (harness.run.flops): what a run trained, and what it was given
    TRAIN_TOKENS = "cost/train_tokens"  # input tokens of every training step, padding included
    TRAIN_FLOPS = "cost/train_flops"  # realised: flops_per_token x train_tokens
    BUDGET_FLOPS = "cost/budget_flops"  # train.max_flops, when the run had one
    BUDGET_TOKENS = "cost/budget_tokens"  # train.max_tokens, when the run had one
    UNCOUNTED_FLOPS_PER_TOKEN = "cost/uncounted_flops_per_token"  # train.flops_count: all
    CHECKPOINT_MB = "cost/checkpoint_disk_mb"  # the run's checkpoint folder after a save
    CHECKPOINT_S = "cost/checkpoint_s"  # wall time spent saving checkpoints (this process)
    #: `harness eval`: characters of the tasks' text outside the run's vocabulary (read as <unk>)
    EVAL_UNKNOWN_CHARS = "eval/unknown_chars"


def val_key(metric: str, length: int | None = None) -> str:
    """The MLflow key of a validation metric: ``val/acc`` at the training length (during
    training), ``val/acc_len256`` at an evaluation length (MLflow forbids ``@`` in keys)."""
    return f"val/{metric}" if length is None else f"val/{metric}_len{length}"


def depth_metric(metric: str, depth: int) -> str:
    """A metric of the needles at one depth (percent): ``recall_depth25`` (its MLflow key at
    length 256: ``val/recall_depth25_len256``; :mod:`harness.run.grid` reads them back)."""
    return f"{metric}_depth{depth}"


def summary_metric(metric: str, over: str) -> str:
    """A metric summarised over an evaluation grid (``objective.over``): ``recall_grid`` (the
    mean over every depth x length cell), ``recall_longest`` (the longest length held)."""
    return f"{metric}_{over}"


def split_val_key(key: str) -> tuple[str, int] | None:
    """The inverse of :func:`val_key` for a per-length key: ``val/acc_len256`` ->
    ``("acc", 256)``; None for any other key."""
    import re

    m = re.fullmatch(r"val/(.+)_len(\d+)", key)
    return (m[1], int(m[2])) if m else None


def curve_key(metric: str) -> str:
    """The metric whose steps are evaluation lengths: ``extrapolation/acc``."""
    return f"extrapolation/{metric}"
