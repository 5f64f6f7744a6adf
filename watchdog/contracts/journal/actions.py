"""Records of the policy's actions: decided, carried out, ended; held back or failed.

An action's records after ``action`` start with its brief (``action_id``, ``action``,
``kind``, ``ranks``: actions/common.py ``brief``) and add their own fields. A
restart the launcher made on its own journals ``launcher_restart`` and ``resumed``
without an action's brief: those fields are optional.
"""

# ruff: noqa: RUF009 - optional() is dataclasses.field with metadata, not a call evaluated once

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import names
from .record import Absent, Record, absent, optional


@dataclass(frozen=True, kw_only=True)
class ActionRecord(Record):
    """The policy decided an action (a dry run does nothing)."""

    EVENT = names.ACTION
    action_id: str | None = optional()
    action: str | None = optional()
    reason: str | None = optional()
    kind: str | None = optional()
    ranks: list[Any] | None = optional()
    hosts: list[Any] | None = optional()
    dry_run: bool = False
    job_state: str | None = optional()
    escalated_from: str | None = optional()
    fingerprint: dict[str, Any] | None = optional()
    restart: int | None = optional()  # the restart's number, for a restarting action


@dataclass(frozen=True, kw_only=True)
class _Brief(Record):
    action_id: str | None = optional()
    action: str | None = optional()
    kind: str | None = optional()
    ranks: list[Any] | None = optional()


@dataclass(frozen=True, kw_only=True)
class ActionProgressRecord(_Brief):
    """Signals sent, a checkpoint requested, the launcher waited for."""

    EVENT = names.ACTION_PROGRESS
    phase: str | None = optional()
    signal: str | None = optional()
    waiting_s: float | None = optional()
    step: int | None = optional()
    before_step: int | None = optional()
    workers: list[Any] | None = optional()
    launchers: list[Any] | None = optional()
    hosts: list[Any] | None = optional()
    error: str | None = optional()
    idents: list[Any] | None = optional()  # [rank, pid, start time, host] of each process signalled
    reached_step: int | None = optional()


@dataclass(frozen=True, kw_only=True)
class CheckpointedRecord(_Brief):
    EVENT = names.CHECKPOINTED
    step: int | None = optional()
    seconds: float | None = optional()


@dataclass(frozen=True, kw_only=True)
class CheckpointFailedRecord(_Brief):
    EVENT = names.CHECKPOINT_FAILED
    step: int | None = optional()
    error: str | None = optional()


@dataclass(frozen=True, kw_only=True)
class RestartRecord(_Brief):
    """The old workers are gone."""

    EVENT = names.RESTART
    restart: int | None = optional()
    stopped: list[Any] | None = optional()
    seconds: float | None = optional()


@dataclass(frozen=True, kw_only=True)
class LauncherRestartRecord(_Brief):
    """The launcher restarted the group: for an action in flight (``gone``, ``idents``) or on its own (``by``)."""

    EVENT = names.LAUNCHER_RESTART
    restart: int | None = optional()
    gone: list[Any] | None = optional()
    idents: list[Any] | None = optional()
    by: str | None = optional()
    seen_s: float | None = optional()


@dataclass(frozen=True, kw_only=True)
class ResumedRecord(_Brief):
    """The new group is stepping."""

    EVENT = names.RESUMED
    restart: int | None = optional()
    by: str | None = optional()
    step: int | None = optional()
    world_size: int | None = optional()
    seconds: float | None = optional()
    steps_lost: int | None = optional()


@dataclass(frozen=True, kw_only=True)
class ActionOutcomeRecord(_Brief):
    EVENT = names.ACTION_OUTCOME
    ok: bool | None = optional()
    result: str | None = optional()
    restart: int | None = optional()  # a restart that failed: which one, and how long it waited to resume
    resume_timeout_s: float | None = optional()
    seconds: float | None = optional()
    kill_rounds: int | None = optional()  # an abort: its SIGKILL rounds, and the ranks no signal ended
    alive: list[Any] | None = optional()
    d_state: list[Any] | None = optional()  # of those, the ranks in uninterruptible sleep


@dataclass(frozen=True, kw_only=True)
class ActionHeldRecord(Record):
    """The policy waits (cooldown, budget, finding too young)."""

    EVENT = names.ACTION_HELD
    reason: str | None = optional()
    kind: str | None = optional()


@dataclass(frozen=True, kw_only=True)
class ActionErrorRecord(Record):
    EVENT = names.ACTION_ERROR
    error: str | None = optional()


@dataclass(frozen=True, kw_only=True)
class RepeatFailureRecord(Record):
    """A failure came back after a restart: escalated (control/repeats.py)."""

    EVENT = names.REPEAT_FAILURE
    action_id: str | None = optional()
    kind: str | None = optional()
    ranks: list[Any] | None = optional()
    hosts: list[Any] | None = optional()
    dry_run: bool = False
    fingerprint: dict[str, Any] | Absent | None = absent()  # null: the action had none
    action: str | None = optional()  # the escalation (control/repeats.py): the action it calls for, and why
    rule: str | None = optional()
    reason: str | None = optional()
    occurrences: int | None = optional()
    earlier: list[Any] | None = optional()


RECORDS: tuple[type[Record], ...] = (
    ActionRecord,
    ActionProgressRecord,
    CheckpointedRecord,
    CheckpointFailedRecord,
    RestartRecord,
    LauncherRestartRecord,
    ResumedRecord,
    ActionOutcomeRecord,
    ActionHeldRecord,
    ActionErrorRecord,
    RepeatFailureRecord,
)
