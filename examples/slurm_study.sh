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
# A worker that is pre-empted or hits the time limit (SIGTERM) ends its trial KILLED; its
# slot is retried by another worker. Re-submit the same array to finish a study.
#SBATCH --job-name=harness-study
#SBATCH --array=0-3
#SBATCH --cpus-per-task=8
#SBATCH --gres=gpu:1
#SBATCH --time=12:00:00
#SBATCH --signal=TERM@120
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
# exec: Slurm's signals reach the harness itself. The stores come from the environment
# (HARNESS_STORAGE, MLFLOW_TRACKING_URI), never the command line, which every user of the
# node can read. With a database as the tracking store instead of a server, also export
# HARNESS_ARTIFACT_URI (s3://bucket/prefix, a shared folder) so every worker's artifacts land
# in one place.
exec harness study run "$STUDY"
