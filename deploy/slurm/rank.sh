#!/usr/bin/env bash
# One rank of the job: what `srun` starts on every task of train.sbatch (and what test.sh starts
# twice, with the variables srun would set). The training binary reads its rank, local rank and
# job from Slurm's SLURM_PROCID, SLURM_LOCALID and SLURM_JOB_ID, and serves its metrics on
# GPUMEM_METRICS_LISTEN (every interface) at port GPUMEM_METRICS_PORT (9464) + its local rank.
# Its options follow ("$@"). Load modules or set the rank's environment here.
set -euo pipefail
: "${SLURM_PROCID:?not a Slurm task (run through srun, or set SLURM_PROCID, SLURM_LOCALID and SLURM_JOB_ID)}"
bin="${GPUMEM_TRAIN_BIN:?set GPUMEM_TRAIN_BIN to the training binary}"
exec "$bin" --metrics "${GPUMEM_METRICS_LISTEN:-0.0.0.0}:${GPUMEM_METRICS_PORT:-9464}" "$@"
