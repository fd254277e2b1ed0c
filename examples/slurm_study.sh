#!/bin/bash
# Run one harness study on N machines with a Slurm job array: each array task is one worker.
# Workers share the study through PostgreSQL (Optuna's storage) and log to one MLflow server;
# every trial slot is claimed exactly once, and they may all start at the same moment on an
# empty database. Submit with (4 workers):
#
#   export HARNESS_STORAGE=postgresql+psycopg://harness@db-host:5432/optuna   # password: ~/.pgpass
#   export MLFLOW_TRACKING_URI=http://mlflow-host:5000
#   sbatch --array=0-3 examples/slurm_study.sh studies/g2p_seq2seq.yaml
#
# Time limits and preemption: 120 s before the limit Slurm sends SIGUSR1 to this script
# (--signal=B:USR1@120), which passes it to the worker; the worker checkpoints its trial
# (train.checkpoint_every sets the regular ones), ends it KILLED (harness.preempted=true) and
# exits 75; the script then requeues this task (--requeue), and the requeued worker (or any
# other) continues the trial from that checkpoint in the same MLflow run. Checkpoints live in
# $HARNESS_HOME/checkpoints: put HARNESS_HOME on a file system every node sees. A worker
# killed outright (SIGKILL, a lost node) is retried from its last regular checkpoint once its
# heartbeat goes stale. Re-submit the same array to finish a study.
#
# One worker per GPU: a task that asks for G GPUs (--gres=gpu:G) runs G workers with
# HARNESS_WORKERS_PER_TASK=G; each gets its own GPU from the ones Slurm gave the task (its
# CUDA_VISIBLE_DEVICES is the pool: docs/scaling_out.md). E.g. 4 nodes x 8 GPUs:
#   HARNESS_WORKERS_PER_TASK=8 sbatch --array=0-3 --gres=gpu:8 --cpus-per-task=64 examples/slurm_study.sh S.yaml
#SBATCH --job-name=harness-study
#SBATCH --array=0-3
#SBATCH --cpus-per-task=8
#SBATCH --gres=gpu:1
#SBATCH --time=12:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=harness-%A_%a.out
set -euo pipefail

STUDY=${1:?usage: sbatch examples/slurm_study.sh STUDY.yaml}
: "${HARNESS_STORAGE:?set HARNESS_STORAGE to the PostgreSQL URL of the Optuna storage}"
: "${MLFLOW_TRACKING_URI:?set MLFLOW_TRACKING_URI to the MLflow server}"
if [ -n "${HARNESS_VENV:-}" ]; then
  source "$HARNESS_VENV/bin/activate"
fi
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-${OMP_NUM_THREADS:-1}}
echo "worker ${SLURM_ARRAY_TASK_ID:-0} of study $STUDY on $(hostname)"
# The stores come from the environment (HARNESS_STORAGE, MLFLOW_TRACKING_URI), never the
# command line, which every user of the node can read. With a database as the tracking store
# instead of a server, also export HARNESS_ARTIFACT_URI (s3://bucket/prefix, a shared folder)
# so every worker's artifacts land in one place.
harness study run "$STUDY" --workers "${HARNESS_WORKERS_PER_TASK:-1}" &
worker=$!
trap 'kill -USR1 "$worker" 2>/dev/null || true' USR1   # the warning: checkpoint and stop
trap 'kill -TERM "$worker" 2>/dev/null || true' TERM   # scancel, or the limit itself
code=0
wait "$worker" || code=$?
while kill -0 "$worker" 2>/dev/null; do   # a trap ended `wait` early: wait for the worker
  code=0
  wait "$worker" || code=$?
done
if [ "$code" -eq 75 ]; then   # checkpointed on SIGUSR1: run this task again
  echo "worker checkpointed on SIGUSR1; requeueing job ${SLURM_JOB_ID:-?}"
  scontrol requeue "${SLURM_JOB_ID:?requeue needs SLURM_JOB_ID}"
fi
exit "$code"
