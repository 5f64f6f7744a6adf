"""PyTorch's Flight Recorder as a source of what every c10d collective really was.

The Flight Recorder (FR) keeps, per rank, a ring of the last collectives issued
through c10d, whoever issued them: the user's ``dist.all_reduce`` and also the
ones our Python patching cannot see (DDP's ``_pre_forward`` broadcasts and
bucket rebuilds, FSDP's internals). Each entry carries the process group, the
per-group ``collective_seq_id``, the op (``profiling_name``), input sizes and
dtypes, a state and timestamps. What torch 2.13 does, seen on real jobs here:

* It records by default (``TORCH_FR_BUFFER_SIZE`` sets the ring's length), on
  gloo too; ``torch._C._distributed_c10d._dump_fr_trace_json`` returns JSON
  bytes with ``version`` ("2.10"), ``pg_config``, ``pg_status`` and ``entries``.
* On gloo ``state`` stays "scheduled" and the started/completed times are 0;
  on NCCL they move to "started" / "completed" with the GPU.
* Times are epoch nanoseconds (``c10::getTime``): ``wire.Clock.WALL``.

It is a private interface, so it is feature-detected once at install and read
defensively: an entry that does not have the expected shape is skipped and
counted; a dump that is not the expected object turns the source off (logged
once) and training goes on. It is read only from the hook's background thread
(the heartbeat), never on the training thread. Importing it imports no CUDA:
``torch._C._distributed_c10d`` is part of every torch build.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from watchdog import sharedfile
from watchdog.contracts import slot as wire
from watchdog.contracts.slot import Clock, CollOp, CollState, RecordKind

log = logging.getLogger("watchdog.hook")

# The newest entries written per read: a burst (a DDP bucket rebuild) must not
# push a ring's worth of step records out of the slot.
MAX_PER_POLL = 16
# Share of wall time the reads may take. A read serialises the whole ring in C++
# and parses it here, holding the GIL for part of it: ~70 ms for torch's default
# 2,000 entries on this project's CPUs (benchmarks/flight_recorder_overhead.py),
# so after each read the next waits cost / DUTY (35 s there; 0.5 s, the heartbeat,
# for a ring of a few dozen). Reads at exit, on a crash and on request are not
# held back.
DUTY = 0.002
MAX_FAILURES = 3  # dumps raising in a row before the reads stop
MAX_SEEN = 8192  # (group, seq) remembered as written; more than FR's default ring of 2,000

# FR's profiling_name is "<backend>:<op>" ("gloo:all_reduce", "nccl:_allgather_base",
# "nccl:reduce_scatter_tensor_coalesced"): the op part, without underscores.
_OPS = {
    "allreduce": CollOp.ALL_REDUCE,
    "broadcast": CollOp.BROADCAST,
    "allgather": CollOp.ALL_GATHER,
    "allgatherintotensor": CollOp.ALL_GATHER,
    "allgatherbase": CollOp.ALL_GATHER,
    "reducescatter": CollOp.REDUCE_SCATTER,
    "reducescattertensor": CollOp.REDUCE_SCATTER,
    "reducescatterbase": CollOp.REDUCE_SCATTER,
    "barrier": CollOp.BARRIER,
    "alltoall": CollOp.ALL_TO_ALL,
    "alltoallbase": CollOp.ALL_TO_ALL,
    "reduce": CollOp.REDUCE,
    "gather": CollOp.GATHER,
    "scatter": CollOp.SCATTER,
    "send": CollOp.SEND,
    "recv": CollOp.RECV,
}
# c10 ScalarType names as FR writes them -> wire.DTYPES codes.
_DTYPES = {
    "Float": "float32",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Double": "float64",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
    "Float8_e4m3fn": "float8_e4m3fn",
    "Float8_e5m2": "float8_e5m2",
}
_STATES = {"scheduled": CollState.SCHEDULED, "started": CollState.STARTED, "completed": CollState.COMPLETED}


class FlightRecorderChanged(ValueError):
    """The dump is not the object this reader knows: the private interface moved."""


@dataclass(frozen=True, slots=True)
class CollEntry:
    """One collective as FR recorded it on this rank."""

    group: int  # wire.group_key of the process group's name (the default group is 0)
    seq: int  # FR's collective_seq_id on that group (1-based)
    op: CollOp
    elements: int  # over every input tensor
    dtype: int  # wire.DTYPES index; 0 unknown; "other" when inputs differ
    shape: int  # wire.pack_shape of the first input
    inputs: int  # input tensors
    state: CollState
    created_ns: int  # wire.Clock.WALL
    started_ns: int = 0
    completed_ns: int = 0

    def record(self, t_ns: int, step: int) -> tuple[int, int, int, tuple[int, ...]]:
        """The COLL_SIG ring record (SlotWriter.write_events)."""
        payload = (
            self.group,
            self.seq,
            int(self.op),
            self.elements,
            self.dtype,
            int(self.state),
            self.shape,
            self.created_ns,
            self.started_ns,
            self.completed_ns,
            int(Clock.WALL),
            self.inputs,
        )
        return (int(RecordKind.COLL_SIG), t_ns, step, payload)


def op_of(profiling_name: str) -> CollOp:
    name = profiling_name.rpartition(":")[2].split(" ", 1)[0].lower().replace("_", "")
    name = name.removesuffix("coalesced")
    return _OPS.get(name, CollOp.OTHER)


def dtype_code(names: Iterable[str]) -> int:
    found = {_DTYPES.get(n, "other") if isinstance(n, str) else "other" for n in names}
    if len(found) != 1:
        return wire.DTYPES.index("other") if found else 0
    return wire.DTYPES.index(found.pop())


def _count(sizes: list) -> tuple[int, int]:
    """(elements over all tensors, tensors). Raises ValueError on a bad shape."""
    total = 0
    for dims in sizes:
        if not isinstance(dims, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims
        ):
            raise ValueError(f"bad input size {dims!r}")
        n = 1
        for d in dims:
            n *= d
        total += n
    if total >= 1 << 62:
        raise ValueError("element count out of range")
    return total, len(sizes)


def _time(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 62 else 0


def entry(raw: Any) -> CollEntry | None:
    """One FR entry, or None when it is not a collective this reader understands
    (a p2p op, a field missing or of another type)."""
    if not isinstance(raw, dict) or raw.get("is_p2p"):
        return None
    seq, pg, name = raw.get("collective_seq_id"), raw.get("process_group"), raw.get("profiling_name")
    if not (isinstance(seq, int) and 0 < seq < 1 << 62 and isinstance(name, str)):
        return None
    if not (isinstance(pg, list) and pg and isinstance(pg[0], str)):
        return None
    sizes, dtypes = raw.get("input_sizes"), raw.get("input_dtypes")
    if not isinstance(sizes, list) or not isinstance(dtypes, list):
        return None
    try:
        elements, inputs = _count(sizes)
    except ValueError:
        return None
    return CollEntry(
        group=wire.group_key(pg[0]),
        seq=seq,
        op=op_of(name),
        elements=elements,
        dtype=dtype_code(dtypes),
        shape=wire.pack_shape(sizes[0]) if sizes else wire.pack_shape(()),
        inputs=inputs,
        state=_STATES.get(raw.get("state"), CollState.UNKNOWN),  # type: ignore[arg-type]
        created_ns=_time(raw.get("time_created_ns")),
        started_ns=_time(raw.get("time_discovered_started_ns")),
        completed_ns=_time(raw.get("time_discovered_completed_ns")),
    )


def parse(raw: bytes | str, seen: dict[tuple[int, int], CollState] | None = None) -> tuple[list[CollEntry], int]:
    """(the entries understood, oldest first; how many were skipped). Raises
    FlightRecorderChanged when the dump itself is not the object we know.

    ``seen``: (group, seq) -> state already written. The ring is scanned from its
    newest entry back and stops at the first one seen in the same state: older
    ones were written by an earlier read (collectives complete in order), so a
    read parses only what is new."""
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise FlightRecorderChanged(f"flight recorder dump is not JSON: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("entries", []), list):
        raise FlightRecorderChanged("flight recorder dump has no 'entries' list")
    out: list[CollEntry] = []
    skipped = 0
    for e in reversed(obj.get("entries", [])):
        got = entry(e)
        if got is None:
            skipped += 1 if not (isinstance(e, dict) and e.get("is_p2p")) else 0
            continue
        if seen is not None and seen.get((got.group, got.seq)) == got.state:
            break
        out.append(got)
    if skipped and not out and not seen:
        raise FlightRecorderChanged(f"none of {skipped} flight recorder entries has the expected fields")
    out.reverse()
    return out, skipped


def _c10d() -> Any:
    """torch's c10d extension if the process has imported it; never imports it
    (a script without torch.distributed pays nothing, and nothing imports CUDA)."""
    return sys.modules.get("torch._C._distributed_c10d")


def json_dumper() -> Callable[[], bytes] | None:
    """The FR JSON dump of this torch, or None when it has none (not imported yet,
    too old, no distributed build)."""
    fn = getattr(_c10d(), "_dump_fr_trace_json", None)
    if not callable(fn):
        return None
    return lambda: fn(includeCollectives=True, onlyActive=False)


class FlightRecorderSource:
    """Finds FR (``find``: ``json_dumper``) and reads it on each ``poll`` (background thread) and writes the collectives it
    has not written yet, or whose state moved, as COLL_SIG records through
    ``write`` (SlotWriter.write_events). After a dump it cannot read, it stops.

    After every read, ``mark`` (SlotWriter.write) gets the header words
    wire.FR_READ_WORDS: the newest (group, seq) FR held and when the read began.
    They are stored after the records, so a reader that sees the new time sees
    the records too; the coordinator trusts a rank's Flight Recorder picture
    only when that time is after the stall began."""

    def __init__(
        self,
        find: Callable[[], Callable[[], bytes] | None],
        write: Callable[[list[tuple[int, int, int, tuple[int, ...]]]], None],
        clock: Callable[[], int],
        step: Callable[[], int],
        *,
        per_poll: int = MAX_PER_POLL,
        since_wall_ns: int = 0,
        mark: Callable[[tuple[tuple[int, int], ...]], None] | None = None,
    ) -> None:
        self._find = find  # looked up on each poll until found: torch may be imported after install
        self._dump: Callable[[], bytes] | None = None
        self._write = write
        self._mark = mark
        self._clock = clock
        self._step = step
        self._per_poll = per_poll
        # FR's ring is per process and outlives process groups (and monitors): what
        # it recorded before this monitor was installed is not this slot's story.
        self._since = since_wall_ns
        self._seen: dict[tuple[int, int], CollState] = {}
        self.written = 0
        self.skipped = 0
        self.reads = 0
        self.last_read_ns = 0  # what the last read cost
        self.read_ns_total = 0
        self._next_ns = 0  # no read before this (clock ns): the duty-cycle budget
        self.broken = ""  # why the source stopped; "" while it works
        self.failures = 0  # dumps that raised in a row
        self.newest = (0, 0)  # (group, seq) of the newest collective FR held at the last read
        self.read_at_ns = 0  # when the last read that succeeded began (clock ns; 0 = none yet)

    def _give_up(self, exc: BaseException) -> None:
        self.broken = f"{type(exc).__name__}: {exc}"[:300]
        log.warning("watchdog.hook flight recorder unreadable, no longer read: %s", self.broken)

    def poll(self, force: bool = False) -> int:
        """Records written by this call. Never raises. Unless ``force``, skipped
        until the duty-cycle budget allows the next read (see DUTY)."""
        if self.broken:
            return 0
        try:
            t0 = self._clock()
            if not force and t0 < self._next_ns:
                return 0
            if self._dump is None:
                self._dump = self._find()
                if self._dump is None:
                    return 0
            raw = self._dump()
            entries, skipped = parse(raw, self._seen)
            t1 = self._clock()
            self.reads += 1
            self.last_read_ns = t1 - t0
            self.read_ns_total += t1 - t0
            self._next_ns = t1 + int(self.last_read_ns / DUTY)
        except FlightRecorderChanged as exc:  # the private interface moved: stop for good
            self._give_up(exc)
            return 0
        except Exception as exc:  # a dump that failed (a group being torn down): stop after a few in a row
            self.failures += 1
            if self.failures >= MAX_FAILURES:
                self._give_up(exc)
            return 0
        self.failures = 0
        self.skipped += skipped
        if self._since:
            entries = [e for e in entries if e.created_ns == 0 or e.created_ns >= self._since]
        seen = self._seen
        fresh = [e for e in entries if seen.get((e.group, e.seq)) != e.state][-self._per_poll :]
        for e in entries:
            seen.pop((e.group, e.seq), None)
            seen[(e.group, e.seq)] = e.state  # newest last: the oldest go first below
        if len(seen) > MAX_SEEN:  # forget the oldest: FR's ring has long dropped them
            for key in list(seen)[: len(seen) - MAX_SEEN // 2]:
                del seen[key]
        if entries:  # else the newest is the one an earlier read saw (the scan stopped at it)
            self.newest = (entries[-1].group, entries[-1].seq)
        self.read_at_ns = t0
        if fresh:
            now, step = self._clock(), self._step()
            self._write([e.record(now, step) for e in fresh])
            self.written += len(fresh)
        if self._mark is not None:
            group, seq = self.newest
            self._mark(((wire.H_FR_NEWEST_GROUP, group), (wire.H_FR_NEWEST_SEQ, seq), (wire.H_FR_READ_NS, t0)))
        return len(fresh)


def write_dump(path: str, data: bytes) -> None:
    """Whole or not at all: the agent may read the file at any moment. The run dir
    is shared: never through a link another user planted (``sharedfile.write``)."""
    sharedfile.write(os.path.dirname(path) or ".", os.path.basename(path), data)
