"""Records of hosts and ranks as the reports show them, and a rank's (or the job's) state change."""

# ruff: noqa: RUF009 - optional() is dataclasses.field with metadata, not a call evaluated once

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import names
from .record import Record, optional


@dataclass(frozen=True, kw_only=True)
class HostSeenRecord(Record):
    EVENT = names.HOST_SEEN
    host: str | None = None
    agent_id: str | None = None
    agent_restarted: bool = False
    previous_agent_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class HostLostRecord(Record):
    EVENT = names.HOST_LOST
    host: str | None = None
    agent_id: str | None = None
    silent_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class HostBackRecord(Record):
    EVENT = names.HOST_BACK
    host: str | None = None
    agent_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class LauncherExitedRecord(Record):
    """A host's launcher, under ``watchdog run``, said it exited."""

    EVENT = names.LAUNCHER_EXITED
    host: str | None = None
    pid: int = 0
    status: int = 0


@dataclass(frozen=True, kw_only=True)
class RankJoinedRecord(Record):
    EVENT = names.RANK_JOINED
    rank: int | None = None
    host: str | None = None
    pid: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    status: str | None = None
    pg_state: str | None = None


@dataclass(frozen=True, kw_only=True)
class RankRestartedRecord(Record):
    EVENT = names.RANK_RESTARTED
    rank: int | None = None
    host: str | None = None
    pid: int | None = None
    local_rank: int | None = None
    old_pid: int | None = None
    old_host: str | None = None
    old_step: int | None = None


@dataclass(frozen=True, kw_only=True)
class StateRecord(Record):
    """Two shapes under one name: a rank's state change (``rank`` ... ``changed``, ``cause``)
    or, with ``job_state``, the policy's job state machine (``job_state``, ``from``, ``on``)."""

    EVENT = names.STATE
    rank: int | None = optional()
    host: str | None = optional()
    pid: int | None = optional()
    local_rank: int | None = optional()
    step: int | None = optional()
    changed: dict[str, Any] | None = optional()
    cause: str | None = optional()
    job_state: str | None = optional()
    from_state: str | None = optional(key="from")
    on: str | None = optional()

    @property
    def of_job(self) -> bool:
        """The job's state machine, not a rank's."""
        return self.job_state is not None and self.rank is None and "rank" not in self.extra


RECORDS: tuple[type[Record], ...] = (
    HostSeenRecord,
    HostLostRecord,
    HostBackRecord,
    LauncherExitedRecord,
    RankJoinedRecord,
    RankRestartedRecord,
    StateRecord,
)
