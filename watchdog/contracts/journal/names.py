"""The journal's event names: the ``event`` field of every record, defined once.

The coordinator's modules write them (through ``watchdog.coordinator.journal.event_names``),
the timeline, the demo and the tests read them. The strings are the journal's format, read by tools we do not own:
changing one is a breaking change (tests/golden/journal_events.txt pins them).
"""

from __future__ import annotations

# The coordinator's life.
START = "start"
CONFIG = "config"
STOP = "stop"
# Records the journal could not write (disk full): how many, since when; written before the next one that fits.
JOURNAL_GAP = "journal_gap"
# The coordinator was not running for a while (SIGSTOP, paused VM): detection held until the hosts report again.
COORDINATOR_STALLED = "coordinator_stalled"

# Findings: opened, closed, and one an action in flight caused (its effect, not a fault).
FINDING = "finding"
RESOLVED = "resolved"
EXPECTED_FINDING = "expected_finding"

# Hosts and ranks as the reports show them.
HOST_SEEN = "host_seen"
HOST_LOST = "host_lost"
HOST_BACK = "host_back"
LAUNCHER_EXITED = "launcher_exited"  # a host's launcher, under `watchdog run`, said it exited (analysis/silence.py)
RANK_JOINED = "rank_joined"
RANK_RESTARTED = "rank_restarted"
# A rank's state change; with a ``job_state`` field, the policy's job state machine.
STATE = "state"

# The policy's actions.
ACTION = "action"  # decided
ACTION_PROGRESS = "action_progress"  # signals sent, checkpoint requested
CHECKPOINTED = "checkpointed"  # checkpoint_restart: every rank saved
CHECKPOINT_FAILED = "checkpoint_failed"
RESTART = "restart"  # the old workers are gone
LAUNCHER_RESTART = "launcher_restart"  # a restart action found its workers gone already: their launcher restarts them
RESUMED = "resumed"  # the new group is stepping
ACTION_OUTCOME = "action_outcome"
ACTION_HELD = "action_held"  # the policy waits (cooldown, budget, finding too young)
ACTION_ERROR = "action_error"  # the policy or an action raised
REPEAT_FAILURE = "repeat_failure"  # a failure came back after a restart: escalated (control/repeats.py)

# Commands to agents and what came back.
COMMAND = "command"
COMMAND_DONE = "command_done"
COMMAND_REFUSED = "command_refused"
COMMAND_EXPIRED = "command_expired"
COMMAND_UNKNOWN_ACK = "command_unknown_ack"
EVIDENCE = "evidence"
# Every rank's stack for one trigger, grouped (stack_gather), and the ranks a
# per-host cap left out of a stack request (stack_plan).
STACK_GROUPS = "stack_groups"
STACKS_CAPPED = "stacks_capped"
# What a coordinator started on an existing journal rebuilt from it (control/replay.py):
# restart budget, cooldown, open findings, the action in flight.
RECOVERED = "recovered"
# Performance, never a fault: the job's bottleneck when it changes (performance/verdict.py),
# and where its wall time went so far (performance/goodput.py), periodically and at stop.
VERDICT = "verdict"
GOODPUT = "goodput"

ALL = (
    START,
    CONFIG,
    STOP,
    JOURNAL_GAP,
    COORDINATOR_STALLED,
    FINDING,
    RESOLVED,
    EXPECTED_FINDING,
    HOST_SEEN,
    HOST_LOST,
    HOST_BACK,
    LAUNCHER_EXITED,
    RANK_JOINED,
    RANK_RESTARTED,
    STATE,
    ACTION,
    ACTION_PROGRESS,
    CHECKPOINTED,
    CHECKPOINT_FAILED,
    RESTART,
    LAUNCHER_RESTART,
    RESUMED,
    ACTION_OUTCOME,
    ACTION_HELD,
    ACTION_ERROR,
    REPEAT_FAILURE,
    COMMAND,
    COMMAND_DONE,
    COMMAND_REFUSED,
    COMMAND_EXPIRED,
    COMMAND_UNKNOWN_ACK,
    EVIDENCE,
    STACK_GROUPS,
    STACKS_CAPPED,
    RECOVERED,
    VERDICT,
    GOODPUT,
)

# Groups readers share. An action's story: decided, carried out, ended.
ACTION_STEPS = (ACTION, ACTION_PROGRESS, ACTION_OUTCOME, RESTART, LAUNCHER_RESTART, RESUMED, REPEAT_FAILURE)
# checkpoint_restart's save before the restart.
CHECKPOINT_STEPS = (CHECKPOINTED, CHECKPOINT_FAILED)
# The policy not acting: it holds back, or it failed.
POLICY_HELD = (ACTION_HELD, ACTION_ERROR)
COMMAND_EVENTS = (COMMAND, COMMAND_DONE, COMMAND_REFUSED, COMMAND_EXPIRED, COMMAND_UNKNOWN_ACK)
