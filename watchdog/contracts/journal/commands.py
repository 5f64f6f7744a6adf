"""Records of commands to agents and what came back: sent, done, refused, expired, an
unknown acknowledgement, evidence; every rank's stack grouped, and the ranks a
per-host cap left out of a stack request."""

# ruff: noqa: RUF009 - optional() is dataclasses.field with metadata, not a call evaluated once

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import names
from .record import Record, optional


@dataclass(frozen=True, kw_only=True)
class CommandRecord(Record):
    EVENT = names.COMMAND
    id: str | None = optional()
    type: str | None = optional()
    host: str | None = optional()
    ranks: list[Any] | None = optional()
    trigger: dict[str, Any] | None = optional()
    attempt: int | None = optional()
    signed: bool | None = optional()
    expires_wall: float | None = optional()
    target: Any = optional()  # a signal's target process
    args: dict[str, Any] | None = optional()


@dataclass(frozen=True, kw_only=True)
class _Answer(Record):
    command_id: str | None = optional()
    type: str | None = optional()
    host: str | None = optional()
    trigger: dict[str, Any] | None = optional()
    late: bool = optional(False)


@dataclass(frozen=True, kw_only=True)
class CommandDoneRecord(_Answer):
    EVENT = names.COMMAND_DONE
    ok: bool | None = optional()
    error: str | None = optional()


@dataclass(frozen=True, kw_only=True)
class CommandRefusedRecord(_Answer):
    EVENT = names.COMMAND_REFUSED
    reason: str | None = optional()
    error: str | None = optional()


@dataclass(frozen=True, kw_only=True)
class EvidenceRecord(_Answer):
    """An evidence command's answer: stacks, slot snapshots, Flight Recorder dumps."""

    EVENT = names.EVIDENCE
    ok: bool | None = optional()
    error: str | None = optional()
    stacks: list[Any] | None = optional()
    slots: list[Any] | None = optional()
    flight_recorder: list[Any] | None = optional()
    bound: dict[str, Any] | None = optional()


@dataclass(frozen=True, kw_only=True)
class CommandExpiredRecord(Record):
    EVENT = names.COMMAND_EXPIRED
    type: str | None = optional()
    host: str | None = optional()
    ids: list[Any] | None = optional()
    ranks: list[Any] | None = optional()
    trigger: dict[str, Any] | None = optional()
    acknowledged: bool | None = optional()
    waited_s: float | None = optional()


@dataclass(frozen=True, kw_only=True)
class CommandUnknownAckRecord(Record):
    EVENT = names.COMMAND_UNKNOWN_ACK
    host: str | None = optional()
    id: str | None = optional()
    type: str | None = optional()
    more: int | None = optional()  # how many more were left out of the journal


@dataclass(frozen=True, kw_only=True)
class StackGroupsRecord(Record):
    """Every rank's stack for one trigger, grouped (evidence/stack_gather.py, stackgroups.py)."""

    EVENT = names.STACK_GROUPS
    trigger: dict[str, Any] | None = optional()
    asked: Any = optional()
    hosts_asked: int | None = optional()
    hosts_answered: int | None = optional()
    hosts_missing: list[Any] | None = optional()
    late_ranks: int | None = optional()
    ranks: Any = optional()
    groups: list[Any] | None = optional()
    dropped_groups: int | None = optional()
    dropped_ranks: int | None = optional()
    summary: str | None = optional()
    odd_ones_out: list[Any] | None = optional()


@dataclass(frozen=True, kw_only=True)
class StacksCappedRecord(Record):
    """The ranks a per-host cap left out of a stack request (evidence/stack_plan.py)."""

    EVENT = names.STACKS_CAPPED
    trigger: dict[str, Any] | None = optional()
    max_per_host: int | None = optional()
    ranks_left_out: int | None = optional()
    hosts: dict[str, Any] | None = optional()
    hosts_capped: int | None = optional()


RECORDS: tuple[type[Record], ...] = (
    CommandRecord,
    CommandDoneRecord,
    CommandRefusedRecord,
    CommandExpiredRecord,
    CommandUnknownAckRecord,
    EvidenceRecord,
    StackGroupsRecord,
    StacksCappedRecord,
)
