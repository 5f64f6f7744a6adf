"""Evidence an agent collects for the post-mortem: Python stacks and slot snapshots.

The agent produces these on the coordinator's request (a signed command in a
report reply) and returns them in its next report's ``acks``; the coordinator
journals them as one ``evidence`` event per host and request, so the history
survives the processes and a restart. ``watchdog timeline`` reads them back.

Journal line::

    {"event": "evidence", "t_wall": ..., "t_mono": ...,
     "trigger": {"kind": "collective_hang", "ranks": [2]}   # or {"action": ..., "id": ...}
     "host": "node-a",
     "stacks": [StackDump.to_dict(), ...],
     "slots":  [SlotEvidence.to_dict(), ...]}

Slot times are the rank host's CLOCK_MONOTONIC in ns; ``SlotEvidence.to_wall``
maps them to wall-clock seconds through the slot's own (created_wall_ns,
created_mono_ns) pair, which is how hosts are aligned in a timeline.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from watchdog import wire


@dataclass(frozen=True)
class StackDump:
    host: str
    rank: int
    pid: int
    ok: bool
    text: str  # py-spy's output (thread per block); "" when not ok
    error: str = ""  # why not ok, for a person
    method: str = "py-spy dump"  # "py-spy dump --nonblocking" for a stopped process
    taken_wall: float = 0.0
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StackDump:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class SlotEvidence:
    host: str
    rank: int
    pid: int
    proc_start_us: int
    taken_wall: float  # agent wall clock when read
    taken_mono_ns: int  # agent monotonic clock when read (same clock as the slot's)
    created_wall_ns: int
    created_mono_ns: int
    header: dict[str, int]  # named dynamic header words (see HEADER_FIELDS)
    records: list[list[int]] = field(default_factory=list)  # raw ring records, oldest first
    torn: bool = False
    records_dropped: int = 0  # older records left out to keep a report small (the newest are kept)

    def to_wall(self, mono_ns: int) -> float:
        return (self.created_wall_ns + (mono_ns - self.created_mono_ns)) / 1e9

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SlotEvidence:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    @classmethod
    def from_snapshot(cls, snap: wire.SlotSnapshot, host: str, taken_wall: float, taken_mono_ns: int) -> SlotEvidence:
        h = snap.header
        return cls(
            host=host,
            rank=h.identity.rank,
            pid=h.identity.pid,
            proc_start_us=h.identity.proc_start_us,
            taken_wall=taken_wall,
            taken_mono_ns=taken_mono_ns,
            created_wall_ns=h.created_wall_ns,
            created_mono_ns=h.created_mono_ns,
            header={name: h[index] for name, index in HEADER_FIELDS.items()},
            records=[r.to_words() for r in snap.records],
            torn=snap.torn,
        )


# Header words worth keeping in a snapshot, by a stable name (the wire indices may
# move in a later slot version; journals must stay readable).
HEADER_FIELDS: dict[str, int] = {
    name[2:].lower(): getattr(wire, name)
    for name in dir(wire)
    if name.startswith("H_")
    and name not in ("H_MAGIC", "H_LAST_DYNAMIC", "H_SPLIT_LAST", "H_RING_OFFSET", "H_RECORD_WORDS")
}
