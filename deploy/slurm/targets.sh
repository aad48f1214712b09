#!/usr/bin/env bash
# Prints the Prometheus file_sd targets of a Slurm job's ranks, as JSON: one target per task,
# HOST:PORT with PORT = GPUMEM_METRICS_PORT (9464) + the task's local rank, which is where each
# rank of train.sbatch serves its metrics. Reads what Slurm sets in a batch script:
#   SLURM_JOB_NODELIST     the job's nodes: plain names separated by commas, or a range such as
#                          gn[01-04] (expanded with `scontrol show hostnames`)
#   SLURM_TASKS_PER_NODE   tasks on each node, in Slurm's form: `2(x3),1` is 2, 2, 2 then 1
# No labels are added: the series carry slurm_job_id, rank and host themselves (a target label of
# the same name would rename theirs to exported_*).
set -euo pipefail
: "${SLURM_JOB_NODELIST:?not in a Slurm job (SLURM_JOB_NODELIST is not set)}"
: "${SLURM_TASKS_PER_NODE:?not in a Slurm job (SLURM_TASKS_PER_NODE is not set)}"
base="${GPUMEM_METRICS_PORT:-9464}"

if [[ "$SLURM_JOB_NODELIST" != *"["* ]]; then
    IFS=, read -r -a nodes <<< "$SLURM_JOB_NODELIST"
elif ! mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST") || [ "${#nodes[@]}" = 0 ]; then
    echo "targets.sh: cannot expand SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST (scontrol show hostnames)" >&2
    exit 1
fi
counts=()
IFS=, read -r -a groups <<< "$SLURM_TASKS_PER_NODE"
for g in "${groups[@]}"; do
    if [[ "$g" =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then
        for ((i = 0; i < BASH_REMATCH[2]; i++)); do counts+=("${BASH_REMATCH[1]}"); done
    elif [[ "$g" =~ ^[0-9]+$ ]]; then
        counts+=("$g")
    else
        echo "targets.sh: cannot read SLURM_TASKS_PER_NODE=$SLURM_TASKS_PER_NODE" >&2
        exit 1
    fi
done
if [ "${#counts[@]}" -ne "${#nodes[@]}" ]; then
    echo "targets.sh: ${#nodes[@]} nodes but ${#counts[@]} task counts ($SLURM_JOB_NODELIST, $SLURM_TASKS_PER_NODE)" >&2
    exit 1
fi

targets=()
for n in "${!nodes[@]}"; do
    for ((local = 0; local < counts[n]; local++)); do
        targets+=("\"${nodes[n]}:$((base + local))\"")
    done
done
(IFS=,; printf '[{"targets": [%s]}]\n' "${targets[*]}")
