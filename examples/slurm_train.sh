#!/bin/bash
# One `harness train` run on several nodes and GPUs under Slurm: srun starts one task per GPU,
# Lightning reads each task's rank from Slurm (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID), and
# only rank 0 records (one MLflow run, checkpoints written once: docs/scaling_out.md). Submit:
#
#   export MLFLOW_TRACKING_URI=http://mlflow-host:5000       # reachable from every node
#   export HARNESS_HOME=/shared/harness                      # checkpoints, on a shared file system
#   sbatch examples/slurm_train.sh run.yaml [--resume RUN_ID]
#
# train.devices and train.num_nodes are set from the allocation (tasks per node, nodes); the
# strategy is ddp unless HARNESS_STRATEGY says otherwise (fsdp for models that do not fit one
# GPU). Resume a stopped run with `sbatch examples/slurm_train.sh --resume RUN_ID`: every rank
# loads the same checkpoint.
#SBATCH --job-name=harness-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:4
#SBATCH --cpus-per-task=8
#SBATCH --time=12:00:00
#SBATCH --output=harness-train-%j.out
set -euo pipefail

: "${MLFLOW_TRACKING_URI:?set MLFLOW_TRACKING_URI to a store every node reaches (a server or PostgreSQL)}"
: "${HARNESS_HOME:?set HARNESS_HOME to a folder on a file system every node mounts}"
if [ -n "${HARNESS_VENV:-}" ]; then
  source "$HARNESS_VENV/bin/activate"
fi
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
if [ "${1:-}" = "--resume" ]; then   # the run's recorded config, devices and nodes included
  exec srun --kill-on-bad-exit=1 harness train --resume "${2:?usage: --resume RUN_ID}"
fi
CONFIG=${1:?usage: sbatch examples/slurm_train.sh RUN.yaml | --resume RUN_ID}
# --kill-on-bad-exit: a rank that fails stops the others (instead of their waiting on it)
exec srun --kill-on-bad-exit=1 harness train "$CONFIG" \
  --set "train.devices=${SLURM_NTASKS_PER_NODE:?}" --set "train.num_nodes=${SLURM_NNODES:?}" \
  --set "train.strategy=${HARNESS_STRATEGY:-ddp}" --set train.accelerator=gpu
