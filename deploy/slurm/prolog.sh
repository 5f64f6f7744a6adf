#!/bin/bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/rank-watchdog-prolog.sh, with
# PrologFlags=Alloc so it runs on every node of the allocation before any task).
# Runs as root. Makes the job's run directory, where its ranks write their slot
# files and the node's agent (rank-watchdog-agent.service, one per node) reads them:
#
#   /run/rank-watchdog/job-<id>   owner: the job's user, group: rank-watchdog, mode 2750
#
# Only the job's user writes there (no other user can plant or swap slot files, nor
# the job's coordinator file); the agent reads through its group; setgid gives the
# files that group. task-prolog.sh exports it to the tasks; epilog.sh removes it.
# Knobs (for tests and other layouts): WATCHDOG_RUN_BASE, WATCHDOG_GROUP.
set -euo pipefail
base=${WATCHDOG_RUN_BASE:-/run/rank-watchdog}
group=${WATCHDOG_GROUP:-rank-watchdog}
[[ ${SLURM_JOB_ID:-} =~ ^[0-9]+$ && ${SLURM_JOB_UID:-} =~ ^[0-9]+$ ]] || {
    echo "rank-watchdog prolog: SLURM_JOB_ID and SLURM_JOB_UID must be numbers" >&2
    exit 1
}
[ -d "$base" ] || exit 0  # no agent on this node: nothing to prepare, never fail the job
dir="$base/job-$SLURM_JOB_ID"
rm -rf -- "$dir"  # whatever had that name (a leftover, or planted): not this job's
install -d -o "$SLURM_JOB_UID" -g "$group" -m 2750 -- "$dir"
