"""Records of findings: opened, one an action in flight caused, resolved."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import names
from .record import Record


@dataclass(frozen=True, kw_only=True)
class FindingRecord(Record):
    """A finding opened: the coordinator's ``Finding`` as its ``to_dict`` writes it."""

    EVENT = names.FINDING
    kind: str | None = None
    ranks: list[Any] = field(default_factory=list)
    hosts: list[Any] = field(default_factory=list)
    reason: str = ""
    onset_mono: float = 0.0
    detected_mono: float = 0.0
    evidence: dict[str, Any] = field(default_factory=dict)
    wants_stacks: list[Any] = field(default_factory=list)
    onset_wall: float = 0.0  # 0: not known (the record's t_wall stands in)
    detected_wall: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ExpectedFindingRecord(FindingRecord):
    """A finding an action in flight caused: its effect, not a fault."""

    EVENT = names.EXPECTED_FINDING
    caused_by_action: Any = None


@dataclass(frozen=True, kw_only=True)
class ResolvedRecord(Record):
    EVENT = names.RESOLVED
    kind: str | None = None
    ranks: list[Any] = field(default_factory=list)
    hosts: list[Any] = field(default_factory=list)
    duration_s: float = 0.0
    reason: str = ""
    opened_wall: float = 0.0


RECORDS: tuple[type[Record], ...] = (FindingRecord, ExpectedFindingRecord, ResolvedRecord)
