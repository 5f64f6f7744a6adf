"""Evidence an agent collects for the post-mortem: Python stacks, slot snapshots
and the ranks' Flight Recorder buffers.

The agent produces these on the coordinator's request (a signed command in a
report reply) and returns them in its next report's ``acks``; the coordinator
journals them as one ``evidence`` event per host and request, so the history
survives the processes and a restart. ``watchdog timeline`` reads them back.

Journal line::

    {"event": "evidence", "t_wall": ..., "t_mono": ...,
     "trigger": {"kind": "collective_hang", "ranks": [2]}   # or {"action": ..., "id": ...}
     "host": "node-a",
     "stacks": [StackDump.to_dict(), ...],
     "slots":  [SlotEvidence.to_dict(), ...],
     "flight_recorder": [FlightRecorderDump.to_dict(), ...]}   # when asked for

Slot times are the rank host's CLOCK_MONOTONIC in ns; ``SlotEvidence.to_wall``
maps them to wall-clock seconds through the slot's own (created_wall_ns,
created_mono_ns) pair, which is how hosts are aligned in a timeline.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from watchdog.contracts import slot as wire


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


# -- Flight Recorder ------------------------------------------------------------

MAX_FR_ENTRIES = 64  # newest entries kept per rank: the hang is at the end of the ring
_FR_TEXT = 256
# FR entry fields kept, by the JSON type they must have; anything else a rank's
# file holds is dropped: it is journaled, and later pickled for PyTorch's analyzer.
_FR_FIELDS: dict[str, tuple[type, ...]] = {
    "record_id": (int,),
    "pg_id": (int,),
    "process_group": (list,),
    "collective_seq_id": (int,),
    "p2p_seq_id": (int,),
    "op_id": (int,),
    "profiling_name": (str,),
    "time_created_ns": (int,),
    "time_discovered_started_ns": (int, type(None)),
    "time_discovered_completed_ns": (int, type(None)),
    "input_sizes": (list,),
    "input_dtypes": (list,),
    "output_sizes": (list,),
    "output_dtypes": (list,),
    "state": (str,),
    "retired": (bool,),
    "timeout_ms": (int,),
    "is_p2p": (bool,),
    "thread_name": (str,),
    "thread_id": (str,),
}


def _fr_value(v: Any, depth: int = 0) -> bool:
    """JSON scalars and small nested lists only (sizes, dtypes, the group pair)."""
    if isinstance(v, bool) or v is None:
        return True
    if isinstance(v, int):
        return abs(v) < 1 << 63
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, str):
        return len(v) <= _FR_TEXT
    if isinstance(v, list):
        return depth < 2 and len(v) <= 64 and all(_fr_value(x, depth + 1) for x in v)
    return False


def fr_entry(raw: Any) -> dict[str, Any] | None:
    """One FR entry reduced to the known fields of the right types; None when it
    has no sequence number or profiling name (nothing to compare)."""
    if not isinstance(raw, dict):
        return None
    out = {}
    for key, types in _FR_FIELDS.items():
        v = raw.get(key)
        if key in raw and isinstance(v, types) and not (isinstance(v, bool) and bool not in types) and _fr_value(v):
            out[key] = v
    if "collective_seq_id" not in out or "profiling_name" not in out:
        return None
    return out


def _fr_pg_config(raw: Any) -> dict[str, dict[str, str]]:
    if not isinstance(raw, dict):
        return {}
    out = {}
    for k, v in list(raw.items())[:64]:
        if isinstance(k, str) and isinstance(v, dict):
            out[k[:_FR_TEXT]] = {f: str(v.get(f, ""))[:4096] for f in ("name", "desc", "ranks")}
    return out


@dataclass(frozen=True)
class FlightRecorderDump:
    """One rank's Flight Recorder buffer, as its hook dumped it on request
    (``wire.Command.DUMP_FLIGHT_RECORDER``), reduced to what can be journaled."""

    host: str
    rank: int
    pid: int
    ok: bool
    error: str = ""
    taken_wall: float = 0.0
    version: str = ""
    pg_config: dict[str, dict[str, str]] = field(default_factory=dict)
    entries: list[dict[str, Any]] = field(default_factory=list)  # oldest first, at most MAX_FR_ENTRIES
    entries_dropped: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FlightRecorderDump:
        """Validates what an agent sent: raises TypeError/ValueError on a bad field."""
        if not isinstance(d, dict):
            raise TypeError("flight recorder evidence must be an object")
        host, rank, pid, ok = d.get("host"), d.get("rank"), d.get("pid"), d.get("ok")
        if not (isinstance(host, str) and isinstance(rank, int) and isinstance(pid, int) and isinstance(ok, bool)):
            raise TypeError("flight recorder evidence needs host, rank, pid and ok")
        entries = d.get("entries", [])
        if not isinstance(entries, list):
            raise TypeError("flight recorder entries must be a list")
        kept = [e for e in (fr_entry(x) for x in entries[-MAX_FR_ENTRIES:]) if e is not None]
        dropped = d.get("entries_dropped", 0)
        taken = d.get("taken_wall", 0.0)
        return cls(
            host=host[:_FR_TEXT],
            rank=rank,
            pid=pid,
            ok=ok,
            error=str(d.get("error", ""))[:2000],
            taken_wall=float(taken) if isinstance(taken, (int, float)) and math.isfinite(taken) else 0.0,
            version=str(d.get("version", ""))[:32],
            pg_config=_fr_pg_config(d.get("pg_config")),
            entries=kept,
            entries_dropped=(dropped if isinstance(dropped, int) and dropped >= 0 else 0)
            + max(0, len(entries) - MAX_FR_ENTRIES)
            + (min(len(entries), MAX_FR_ENTRIES) - len(kept)),
        )

    @classmethod
    def from_json(cls, raw: bytes, host: str, rank: int, pid: int, taken_wall: float) -> FlightRecorderDump:
        """The hook's dump file (``_dump_fr_trace_json``'s bytes). Raises ValueError."""
        import json

        obj = json.loads(raw)
        if not isinstance(obj, dict) or not isinstance(obj.get("entries", []), list):
            raise ValueError("not a flight recorder dump (no entries list)")
        return cls.from_dict(
            {
                "host": host,
                "rank": rank,
                "pid": pid,
                "ok": True,
                "taken_wall": taken_wall,
                "version": obj.get("version", ""),
                "pg_config": obj.get("pg_config"),
                "entries": obj.get("entries", []),
            }
        )
