#!/bin/bash
# Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/rank-watchdog-task-prolog.sh).
# Runs as the job's user before each task; every `export NAME=value` line it prints
# is set in the task's environment. It hands the tasks the directory prolog.sh made,
# so the hook in every rank (`watchdog run -- torchrun ...`) writes its slot there,
# and a job name the node's agent and the coordinator agree on.
# Knobs (for tests and other layouts): WATCHDOG_RUN_BASE.
dir="${WATCHDOG_RUN_BASE:-/run/rank-watchdog}/job-${SLURM_JOB_ID:-}"
if [ -d "$dir" ] && [ -O "$dir" ]; then
    echo "export WATCHDOG_RUN_DIR=$dir"
    # the batch script names the job (train.sbatch); a bare srun gets the id
    [ -n "${WATCHDOG_JOB_NAME:-}" ] || echo "export WATCHDOG_JOB_NAME=slurm-$SLURM_JOB_ID"
fi
exit 0
