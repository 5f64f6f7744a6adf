"""The value sets that cross the coordinator's rooms: a room decides among its
own set, the journal writes the values, and ``metrics.py`` makes one labelled
child per value at start (a zero is a zero, not a missing series).

Kept here, below every room, so that the metrics can list them without
importing the rooms that use the metrics.
"""

from __future__ import annotations

import enum

# What a finding can earn (control/policy.py): the policy file's values, the
# journal's ``action``, the ``action`` label of watchdog_coordinator_actions_total.
ACTIONS = ("alert", "abort", "restart", "checkpoint_restart", "exclude_host_restart", "rollback_restart")


class JobState(str, enum.Enum):
    """The job's state machine (control/policy.py's ``TRANSITIONS``)."""

    RUNNING = "running"
    DEGRADED = "degraded"  # findings open, no action taken (alert only)
    CHECKPOINTING = "checkpointing"
    RESTARTING = "restarting"
    ABORTING = "aborting"
    FAILED = "failed"  # terminal: aborted, or gave up


# What became of a command to an agent (evidence/dispatch.py, evidence/command_log.py).
COMMAND_OUTCOMES = ("sent", "done", "failed", "refused", "expired")

# The job's bottleneck (performance/verdict.py). The causes measured as a share of
# step time (memory: of accelerator memory), each with its threshold, come first.
VERDICT_SHARES = ("data", "communication", "straggler", "memory")
VERDICTS = (*VERDICT_SHARES, "compute", "unknown")
SPLIT_CLOCKS = ("gpu", "cpu", "mixed")  # where a rank's step split came from (evidence "clock")

# Where the job's wall time went (performance/goodput.py).
GOODPUT_CATEGORIES = (
    "productive",
    "data_wait",
    "collective_wait",
    "straggler",
    "checkpoint_eval",
    "restart",
    "redone",
    "startup",
)
