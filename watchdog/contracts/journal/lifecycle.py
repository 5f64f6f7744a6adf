"""Records of the coordinator's life: start, config, stop, a gap in the journal, a
stall of the coordinator itself, and the decisions it recovered from the journal."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import names
from .record import Record, optional


@dataclass(frozen=True, kw_only=True)
class StartRecord(Record):
    """A coordinator started on this journal: it opens a segment (another job's or run's is skipped on replay)."""

    EVENT = names.START
    pid: int = 0
    address: str = ""
    job: str = ""
    run_id: str | None = optional()  # absent: a journal from before run ids
    world_size: int = 0
    event_loop: str = ""


@dataclass(frozen=True, kw_only=True)
class ConfigRecord(Record):
    EVENT = names.CONFIG
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class StopRecord(Record):
    EVENT = names.STOP
    reason: str | None = None
    active_findings: list[Any] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class JournalGapRecord(Record):
    """Records the journal could not write (disk full), written before the next one that fits."""

    EVENT = names.JOURNAL_GAP
    lost_records: int = 0
    since_wall: float = 0.0
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class CoordinatorStalledRecord(Record):
    EVENT = names.COORDINATOR_STALLED
    gap_s: float = 0.0
    hold_max_s: float = 0.0
    hosts: list[Any] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class RecoveredRecord(Record):
    """What a coordinator started on an existing journal carried on with (control/replay.py)."""

    EVENT = names.RECOVERED
    records: int | None = None
    job_state: str | None = None
    restarts_used: int | None = None
    restarts_last_hour: int | None = None
    last_action_s_ago: float | None = None
    next_action_id: str | None = None
    in_flight: dict[str, Any] | None = None
    interrupted: list[Any] = field(default_factory=list)
    open_findings: list[Any] = field(default_factory=list)


RECORDS: tuple[type[Record], ...] = (
    StartRecord,
    ConfigRecord,
    StopRecord,
    JournalGapRecord,
    CoordinatorStalledRecord,
    RecoveredRecord,
)
