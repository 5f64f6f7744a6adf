"""Scan the run directory, read each slot with ``wire.read_slot`` (pread, never mmap),
and track every slot across polls.

Per poll and per watched slot: one process check, then one ``read_slot(path,
since)``. Checking the process *before* reading means the read that follows a
confirmed death shows the rank's final state; after it the slot is frozen and no
longer read (a dead process cannot write), but stays exported until a newer slot
for the same (job, rank) appears or the file is deleted. A torn read keeps the
last good header (only the heartbeat, written outside the seqlock, is taken).

Read errors are counted once per episode (a file entering a bad state for a
reason), not once per poll: a garbage file sitting in the run directory would
otherwise count ten errors a second forever.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from watchdog import logs, wire
from watchdog.agent import track
from watchdog.agent.procs import ProcessTable, ProcSample
from watchdog.report import MAX_STEPS_PER_RANK

READ_ERROR_REASONS = ("corrupt", "version", "torn", "io")


def list_slots(run_dir: str) -> dict[str, int]:
    """path -> inode of the slot files in ``run_dir`` (d_ino from getdents: no stat).
    Raises FileNotFoundError when the directory does not exist."""
    with os.scandir(run_dir) as it:
        return {e.path: e.inode() for e in it if e.name.endswith(wire.SLOT_SUFFIX)}


@dataclass(frozen=True)
class RankView:
    """What the exporter and the report builder see of one rank: immutable."""

    path: str
    header: wire.SlotHeader  # last good (consistent) header
    heartbeat_ns: int  # from the latest read, torn or not
    torn: bool
    proc: ProcSample
    state: str  # track.ALIVE / DEAD / EXITED
    cpu_percent: float
    step_records: tuple[wire.Record, ...]  # STEP_END records, oldest first, at most MAX_STEPS_PER_RANK

    @property
    def identity(self) -> wire.Identity:
        return self.header.identity


@dataclass(eq=False)
class _Slot:
    path: str
    inode: int
    snap: wire.SlotSnapshot
    status: int
    heartbeat_ns: int
    proc: ProcSample
    state: str = track.ALIVE
    torn: bool = False
    since: int = 0  # next ring index to ask for
    steps: deque = field(default_factory=lambda: deque(maxlen=MAX_STEPS_PER_RANK))
    res_prev: ProcSample | None = None
    cpu_pct: float = 0.0
    final: bool = False  # read after its process was seen dead: never changes again
    superseded: bool = False
    error: str = ""  # reason of the read-error episode in progress

    @property
    def header(self) -> wire.SlotHeader:
        return self.snap.header


class SlotTracker:
    def __init__(self, run_dir: str, *, job: str = "", stale_after_s: float = 30.0,
                 procs: ProcessTable | None = None, read: Callable = wire.read_slot,
                 lister: Callable[[str], dict[str, int]] = list_slots, resource_interval_s: float = 1.0,
                 log=None) -> None:
        self.run_dir, self.job, self.stale_after_s = run_dir, job, stale_after_s
        self.procs = procs or ProcessTable()
        self._read, self._list = read, lister
        self._resource_ns = int(resource_interval_s * 1e9)
        self._log = log or logs.get("watchdog.agent.slots")
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot] = {}
        self._skipped: dict[str, tuple[int, str]] = {}  # path -> (inode, STALE / OTHER_JOB / INVALID reason)
        self._dir_missing = False
        self.read_errors = dict.fromkeys(READ_ERROR_REASONS, 0)
        self.polls = 0

    # -- the poll ------------------------------------------------------------

    def poll(self, now_mono_ns: int, now_wall_ns: int) -> None:
        entries = self._entries()
        with self._lock:
            self.polls += 1
            for path in [p for p, s in self._slots.items() if entries.get(p) != s.inode]:
                self._forget(path)
            for path in [p for p, (ino, _) in self._skipped.items() if entries.get(p) != ino]:
                del self._skipped[path]
            for path, inode in entries.items():
                slot = self._slots.get(path)
                if slot is None:
                    if path not in self._skipped or self._skipped[path][1] not in (track.STALE, track.OTHER_JOB):
                        self._first_sight(path, inode, now_mono_ns, now_wall_ns)
                elif not (slot.final or slot.superseded):
                    self._update(slot, now_mono_ns)
            self._resolve()

    def _entries(self) -> dict[str, int]:
        try:
            entries = self._list(self.run_dir)
        except OSError as exc:
            if not self._dir_missing:
                self._log.warning("run dir unreadable", run_dir=self.run_dir, error=str(exc))
            self._dir_missing = True
            return {}
        if self._dir_missing:
            self._log.info("run dir readable", run_dir=self.run_dir)
        self._dir_missing = False
        return entries

    def _read_or_count(self, path: str, since: int, current_error: str) -> wire.SlotSnapshot | str | None:
        """The snapshot, or the error reason, or None when the file vanished."""
        try:
            return self._read(path, since)
        except FileNotFoundError:  # deleted between listdir and open: not an error
            return None
        except (wire.SlotError, OSError) as exc:
            reason = exc.reason if isinstance(exc, wire.SlotError) else "io"
            if reason != current_error:
                self.read_errors[reason] = self.read_errors.get(reason, 0) + 1
                self._log.warning("slot rejected", path=path, reason=reason, error=str(exc))
            return reason

    def _first_sight(self, path: str, inode: int, now_mono_ns: int, now_wall_ns: int) -> None:
        prev_error = self._skipped.get(path, (0, ""))[1]
        snap = self._read_or_count(path, 0, prev_error)
        if snap is None:
            self._skipped.pop(path, None)
            return
        if isinstance(snap, str):
            self._skipped[path] = (inode, snap)
            return
        self._skipped.pop(path, None)
        ident = snap.header.identity
        if self.job and ident.job != self.job:
            self._skipped[path] = (inode, track.OTHER_JOB)
            return
        proc = self.procs.check(ident.pid, ident.proc_start_us, now_mono_ns, resources=True)
        reason = track.stale_reason(snap.header, proc, now_mono_ns, now_wall_ns, self.stale_after_s)
        if reason:
            self._skipped[path] = (inode, track.STALE)
            self.procs.forget(ident.pid, ident.proc_start_us)
            self._log.info("slot stale", path=path, job=ident.job, rank=ident.rank, pid=ident.pid, reason=reason)
            return
        slot = _Slot(path=path, inode=inode, snap=snap, status=snap.header.status,
                     heartbeat_ns=snap.header.heartbeat_ns, proc=proc, res_prev=proc)
        self._absorb(slot, snap)
        slot.state = track.rank_state(slot.status, proc)
        self._slots[path] = slot
        self._log.info("rank appeared", job=ident.job, rank=ident.rank, pid=ident.pid, state=slot.state,
                       proc_status=proc.status, path=path)

    def _update(self, slot: _Slot, now_ns: int) -> None:
        ident = slot.header.identity
        resources = now_ns - slot.proc.sampled_ns >= self._resource_ns
        proc = self.procs.check(ident.pid, ident.proc_start_us, now_ns, resources=resources)
        snap = self._read_or_count(slot.path, slot.since, slot.error)
        if isinstance(snap, str):
            slot.error = snap  # keep the last good state
        elif snap is not None:
            slot.error = ""
            self._absorb(slot, snap)
        if resources and proc.alive:
            slot.cpu_pct, slot.res_prev = track.cpu_percent(slot.res_prev, proc), proc
        if proc.stopped != slot.proc.stopped:
            self._log.info("rank stopped" if proc.stopped else "rank resumed", job=ident.job, rank=ident.rank,
                           pid=ident.pid)
        slot.proc = proc
        state = track.rank_state(slot.status, proc)
        if state != slot.state:
            event = {track.DEAD: "rank died", track.EXITED: "rank exited"}.get(state, "rank alive")
            self._log.info(event, job=ident.job, rank=ident.rank, pid=ident.pid, proc_status=proc.status,
                           step=slot.header[wire.H_STEP], path=slot.path)
            slot.state = state
        # Read after the process was seen gone: that read was its final state.
        slot.final = not proc.alive and snap is not None and not isinstance(snap, str)

    def _absorb(self, slot: _Slot, snap: wire.SlotSnapshot) -> None:
        h = snap.header
        slot.heartbeat_ns, slot.status = h.heartbeat_ns, h.status  # both outside the seqlock: valid even torn
        if snap.torn:  # the writer stopped or died inside a header update
            if not slot.torn:
                self.read_errors["torn"] += 1
                ident = h.identity
                self._log.info("slot torn", job=ident.job, rank=ident.rank, pid=ident.pid, path=slot.path)
            slot.torn = True  # a first read that is torn is kept: it is all we have
        else:
            slot.torn, slot.snap = False, snap
        for rec in snap.records:
            if rec.index >= slot.since and rec.kind == wire.RecordKind.STEP_END:
                slot.steps.append(rec)
        last = snap.records[-1].index + 1 if snap.records else slot.since
        slot.since = max(slot.since, last if snap.torn else h[wire.H_RING_HEAD])

    def _resolve(self) -> None:
        winners = set(map(id, track.newest_per_rank(
            self._slots.values(), lambda s: s.header, lambda s: s.path).values()))
        for slot in self._slots.values():
            now_superseded = id(slot) not in winners
            if now_superseded and not slot.superseded:
                ident = slot.header.identity
                self._log.info("slot superseded", job=ident.job, rank=ident.rank, pid=ident.pid, path=slot.path)
            slot.superseded = now_superseded

    def _forget(self, path: str) -> None:
        slot = self._slots.pop(path)
        ident = slot.header.identity
        self.procs.forget(ident.pid, ident.proc_start_us)
        self._log.info("slot removed", job=ident.job, rank=ident.rank, pid=ident.pid, path=path)

    # -- what others see -----------------------------------------------------

    def views(self) -> tuple[RankView, ...]:
        """The ranks to export: one per (job, rank), sorted."""
        with self._lock:
            out = [RankView(s.path, s.header, s.heartbeat_ns, s.torn, s.proc, s.state, s.cpu_pct, tuple(s.steps))
                   for s in self._slots.values() if not s.superseded]
        return tuple(sorted(out, key=lambda v: (v.identity.job, v.identity.rank)))

    def state_counts(self) -> dict[str, int]:
        with self._lock:
            counts = dict.fromkeys(track.SLOT_STATES, 0)
            for s in self._slots.values():
                counts[track.SUPERSEDED if s.superseded else s.state] += 1
            for _, why in self._skipped.values():
                counts[why if why in (track.STALE, track.OTHER_JOB) else track.INVALID] += 1
            return counts
