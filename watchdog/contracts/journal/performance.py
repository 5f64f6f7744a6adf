"""Records of performance, never a fault: the job's bottleneck when it changes
(performance/verdict.py), and where its wall time went so far (performance/goodput.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import names
from .record import Record


@dataclass(frozen=True, kw_only=True)
class VerdictRecord(Record):
    EVENT = names.VERDICT
    verdict: str | None = None
    previous: str | None = None
    reason: str = ""
    shares: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class GoodputRecord(Record):
    """The goodput ledger so far (performance/goodput.py's ``summary``: its fields are ``extra``,
    in its own order), then the verdict."""

    EVENT = names.GOODPUT


RECORDS: tuple[type[Record], ...] = (VerdictRecord, GoodputRecord)
