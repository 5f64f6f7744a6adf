"""One slot file as the tracker keeps it between polls (``TrackedSlot``), and how a
fresh read of it is folded in (``absorb``): its last good header, the step and
Flight Recorder records not seen before, and the split of its steps on the
accelerator's clock. A first torn read and records no hook writes are counted in
the tracker's ``read_errors`` (handed in) and logged once."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from watchdog.agent.processes import deathcause
from watchdog.agent.processes.table import ProcSample
from watchdog.agent.slotfiles import gpusteps, slot_states
from watchdog.contracts import slot as wire
from watchdog.report import MAX_COLLS_PER_RANK, MAX_STEPS_PER_RANK

_STEP_END = int(wire.RecordKind.STEP_END)
_COLL_SIG = int(wire.RecordKind.COLL_SIG)
_COMPLETION = int(wire.RecordKind.COMPLETION)


@dataclass(eq=False)
class TrackedSlot:
    """A slot file the tracker follows, mutable between polls; what others see of it
    is the ``LocalRank`` made from it."""

    path: str
    inode: int
    snap: wire.SlotSnapshot
    status: int
    heartbeat_ns: int
    proc: ProcSample
    state: str = slot_states.ALIVE
    torn: bool = False
    since: int = 0  # next ring index to ask for
    events_since: int = 0  # the same for the event ring (version-2 slots)
    steps: deque = field(default_factory=lambda: deque(maxlen=MAX_STEPS_PER_RANK))
    colls: deque = field(default_factory=lambda: deque(maxlen=MAX_COLLS_PER_RANK))
    ev_colls: deque = field(default_factory=lambda: deque(maxlen=MAX_COLLS_PER_RANK))
    gpu: deque = field(default_factory=lambda: deque(maxlen=MAX_STEPS_PER_RANK))
    gpu_fold: gpusteps.GpuFold | None = None  # made at the first COMPLETION record
    res_prev: ProcSample | None = None
    cpu_pct: float = 0.0
    runq: deque = field(default_factory=deque)  # resource samples over slot_states.RUNQ_WINDOW_S, oldest first
    oncpu_share: float = 0.0
    runq_share: float = 0.0
    final: bool = False  # read after its process was seen dead: never changes again
    superseded: bool = False
    died_here: bool = False  # seen alive, then dead, by this agent (not found dead at its start)
    error: str = ""  # reason of the read-error episode in progress
    launcher: tuple[int, int] = (0, 0)
    host_pid: int = 0
    uid: int = -1
    oom: deathcause.OomBaseline | None = None
    death: dict = field(default_factory=dict)
    first_seen: int = 0  # the poll that first saw it (ordering: never a time the writer chose)
    seen_alive: bool = False  # its process was alive at first sight

    @property
    def header(self) -> wire.SlotHeader:
        return self.snap.header


def absorb(slot: TrackedSlot, snap: wire.SlotSnapshot, read_errors: dict[str, int], log: Any) -> None:
    """Fold one read of the slot into its record. A torn read keeps the last good
    header: only the heartbeat, written outside the seqlock, is taken, and only the
    records that header counts (the rest are read again once a read is whole)."""
    h = snap.header
    slot.heartbeat_ns, slot.status = h.words[wire.H_HEARTBEAT_NS], h.status  # outside the seqlock: valid torn
    records = snap.records
    if snap.torn:  # the writer stopped, died or was preempted inside a header update
        if not slot.torn:
            read_errors["torn"] += 1
            ident = h.identity
            log.info("slot torn", job=ident.job, rank=ident.rank, pid=ident.pid, path=slot.path)
        slot.torn = True  # a first read that is torn is kept: it is all we have
        # A torn header's ring head can be past the kept header's step: a report whose steps ran
        # one past its step count made the coordinator's resumed step one short (a fresh-clone
        # run: a restarted rank preempted inside its step-end bracket on a loaded host).
        kept_head = slot.snap.header.words[wire.H_RING_HEAD]
        records = tuple(r for r in records if r.index < kept_head)
    else:
        slot.torn, slot.snap = False, snap
    since = slot.since
    if slot.gpu_fold is not None and records:
        _fold_gpu(slot, [r for r in records if r.index >= since and r.kind == _STEP_END], [], read_errors, log)
    if records:
        slot.steps.extend(r for r in records if r.index >= since and r.kind == _STEP_END)
        slot.colls.extend(r for r in records if r.index >= since and r.kind == _COLL_SIG)
        last = records[-1].index + 1
    else:
        last = since
    slot.since = max(since, last if snap.torn else h.words[wire.H_RING_HEAD])
    if snap.events:
        _absorb_events(slot, snap, read_errors, log)


def _absorb_events(slot: TrackedSlot, snap: wire.SlotSnapshot, read_errors: dict[str, int], log: Any) -> None:
    """The event ring: Flight Recorder signatures (and GPU completions)."""
    since = slot.events_since
    fresh = [r for r in snap.events if r.index >= since]
    slot.ev_colls.extend(r for r in fresh if r.kind == _COLL_SIG)
    if slot.gpu_fold is None and any(r.kind == _COMPLETION for r in fresh):
        # The first completions: the data waits of the steps read so far pair with them.
        slot.gpu_fold = gpusteps.GpuFold()
        _fold_gpu(slot, list(slot.steps), [], read_errors, log)
    if slot.gpu_fold is not None:
        _fold_gpu(slot, [], fresh, read_errors, log)
    slot.events_since = max(since, snap.events[-1].index + 1)


def _fold_gpu(
    slot: TrackedSlot, steps: list[wire.Record], events: list[wire.Record], read_errors: dict[str, int], log: Any
) -> None:
    fold = slot.gpu_fold
    assert fold is not None
    before = fold.rejected
    slot.gpu.extend(fold.feed(steps, events))
    if fold.rejected > before:
        if not read_errors["record"]:
            ident = slot.header.identity
            log.warning(
                "slot records rejected",
                path=slot.path,
                job=ident.job,
                rank=ident.rank,
                detail="completion records with values no hook writes: left out of the GPU-side split",
            )
        read_errors["record"] += fold.rejected - before
