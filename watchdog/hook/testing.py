"""Helpers for testing code that uses the hook (ours and users').

``FakeClock`` makes step/data/collective splits exact without sleeping;
``read_monitor`` reads a monitor's slot back the way the agent does;
``step_splits`` turns its STEP_END records into per-step time splits.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from watchdog import wire

# Variables install() reads; clear them to test in a known environment.
ENV_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "WATCHDOG_ENABLED",
    "WATCHDOG_RUN_DIR",
    "WATCHDOG_JOB",
    "WATCHDOG_HOST",
    "WATCHDOG_RING_CAPACITY",
    "WATCHDOG_HEARTBEAT_INTERVAL_S",
    "WATCHDOG_AUTO_STEP",
    "WATCHDOG_PATCH_COLLECTIVES",
)


@contextmanager
def installed(run_dir: str | os.PathLike, **overrides: Any) -> Iterator[Any]:
    """``install(run_dir=run_dir, **overrides)`` for the duration of a block, then
    close(). Accepts install()'s ``clock`` too."""
    from watchdog.hook import install

    mon = install(run_dir=str(run_dir), **overrides)
    try:
        yield mon
    finally:
        mon.close()


class FakeClock:
    """A monotonic nanosecond clock that moves only when told: ``install(clock=c)``."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now = start_ns

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> int:
        if ns < 0:
            raise ValueError("a monotonic clock does not go back")
        self.now += ns
        return self.now


def slot_bytes(mon: Any) -> bytes:
    """A copy of the monitor's whole slot, file or anonymous memory (while open)."""
    return mon.slot.copy()


def read_monitor(mon: Any, since: int = 0) -> wire.SlotSnapshot:
    """The monitor's slot as the agent would read it (``wire.read_slot``)."""
    if mon.slot_path is None:
        raise ValueError("this monitor has no slot file (disabled, or fell back to anonymous memory)")
    return wire.read_slot(mon.slot_path, since)


@dataclass(frozen=True)
class StepSplit:
    step: int
    step_ns: int
    data_ns: int
    coll_ns: int
    collectives: int
    last_coll_seq: int
    phase: int
    data_waits: int

    @property
    def compute_ns(self) -> int:
        """What is left: step time minus data wait minus collective time."""
        return self.step_ns - self.data_ns - self.coll_ns


def step_splits(snapshot: wire.SlotSnapshot) -> list[StepSplit]:
    out = []
    for rec in snapshot.records:
        if rec.kind == wire.RecordKind.STEP_END:
            a, b, c, d, e, f, g = rec.payload[:7]
            out.append(StepSplit(rec.step, a, b, c, d, e, f, g))
    return out


def records_of(snapshot: wire.SlotSnapshot, kind: wire.RecordKind) -> list[wire.Record]:
    return [r for r in snapshot.records if r.kind == kind]
