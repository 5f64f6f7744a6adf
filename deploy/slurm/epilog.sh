#!/bin/bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/rank-watchdog-epilog.sh). Runs as root
# on every node of the job once it ends: removes the job's run directory (its slot
# files, coordinator and token files). The node's agent then stops exporting the
# job's ranks. Knobs: WATCHDOG_RUN_BASE.
set -euo pipefail
[[ ${SLURM_JOB_ID:-} =~ ^[0-9]+$ ]] || exit 0
rm -rf -- "${WATCHDOG_RUN_BASE:-/run/rank-watchdog}/job-$SLURM_JOB_ID"
