"""A slot writer that speaks wire.py the way the hook does (a stand-in for the
hook in tests and benchmarks), plus helpers to build decoded snapshots in memory.

``python -m watchdog.agent.fakes.rank`` runs one as a process.
"""

from __future__ import annotations

import mmap
import os
import time

import psutil

from watchdog import wire


class SlotWriter:
    """Writes a slot the way the hook does: seqlocked header updates, index-checked
    ring records, heartbeat outside the seqlock. The file is formatted under a
    temporary name and renamed into place, so a reader never sees it half-made."""

    def __init__(self, run_dir: str, ident: wire.Identity, ring_capacity: int = wire.DEFAULT_RING_CAPACITY, *,
                 wall_ns: int | None = None, mono_ns: int | None = None, name: str | None = None) -> None:
        size = wire.slot_size(ring_capacity)
        self.path = os.path.join(run_dir, name or wire.slot_filename(ident.job, ident.rank, ident.pid))
        tmp = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        wire.init_slot(self._mm, ident, ring_capacity,
                       wall_ns=time.time_ns() if wall_ns is None else wall_ns,
                       mono_ns=time.monotonic_ns() if mono_ns is None else mono_ns)
        os.replace(tmp, self.path)
        self.w = memoryview(self._mm).cast("q")
        self.cap = ring_capacity

    def update(self, words: dict[int, int]) -> None:
        """Seqlocked store of dynamic header words."""
        w = self.w
        w[wire.H_SEQ] += 1
        for i, v in words.items():
            w[i] = v
        w[wire.H_SEQ] += 1

    def heartbeat(self, now_ns: int | None = None) -> None:
        self.w[wire.H_HEARTBEAT_NS] = time.monotonic_ns() if now_ns is None else now_ns
        self.w[wire.H_HEARTBEAT_COUNT] += 1

    def status(self, status: wire.Status) -> None:
        self.w[wire.H_STATUS] = int(status)

    def record(self, kind: wire.RecordKind, t_ns: int, step: int, *payload: int) -> None:
        w, index = self.w, self.w[wire.H_RING_HEAD]
        base = (wire.RING_OFFSET // wire.WORD) + (index % self.cap) * wire.RECORD_WORDS
        w[base + wire.R_INDEX] = -1  # invalidate first: a reader never pairs the old index with new words
        words = [index, int(kind), t_ns, step, *payload]
        words += [0] * (wire.RECORD_WORDS - len(words))
        for i in range(1, wire.RECORD_WORDS):
            w[base + i] = words[i]
        w[base + wire.R_INDEX] = index
        self.update({wire.H_RING_HEAD: index + 1})

    def step(self, step_ns: int, data_ns: int = 0, coll_ns: int = 0, now_ns: int | None = None,
             phase: wire.Phase = wire.Phase.TRAIN) -> int:
        now = time.monotonic_ns() if now_ns is None else now_ns
        w = self.w
        step = w[wire.H_STEP] + 1
        self.record(wire.RecordKind.STEP_END, now, step, step_ns, data_ns, coll_ns, 1, w[wire.H_COLL_SEQ],
                    int(phase), 1)
        self.update({
            wire.H_STEP: step, wire.H_STEP_START_NS: now, wire.H_LAST_STEP_NS: step_ns,
            wire.H_LAST_DATA_NS: data_ns, wire.H_LAST_COLL_NS: coll_ns,
            wire.H_TOTAL_STEP_NS: w[wire.H_TOTAL_STEP_NS] + step_ns,
            wire.H_TOTAL_DATA_NS: w[wire.H_TOTAL_DATA_NS] + data_ns,
            wire.H_TOTAL_COLL_NS: w[wire.H_TOTAL_COLL_NS] + coll_ns,
        })
        return step

    def enter_collective(self, seq: int, op: wire.CollOp = wire.CollOp.ALL_REDUCE, now_ns: int | None = None) -> None:
        now = time.monotonic_ns() if now_ns is None else now_ns
        self.update({wire.H_COLL_SEQ: seq, wire.H_COLL_OP: int(op), wire.H_COLL_ENTER_NS: now,
                     wire.H_COLL_OUTSTANDING: self.w[wire.H_COLL_OUTSTANDING] + 1})

    def exit_collective(self, now_ns: int | None = None) -> None:
        now = time.monotonic_ns() if now_ns is None else now_ns
        self.update({wire.H_COLL_EXIT_NS: now, wire.H_COLL_DONE_SEQ: self.w[wire.H_COLL_SEQ],
                     wire.H_COLL_OUTSTANDING: max(0, self.w[wire.H_COLL_OUTSTANDING] - 1)})

    def close(self) -> None:
        self.w.release()
        self._mm.close()


def identity(job: str = "job", rank: int = 0, world_size: int = 1, *, pid: int | None = None,
             proc_start_us: int | None = None, local_rank: int | None = None, host: str = "h") -> wire.Identity:
    """An Identity for this process by default (pid and its real start time)."""
    pid = os.getpid() if pid is None else pid
    if proc_start_us is None:
        proc_start_us = int(psutil.Process(pid).create_time() * 1e6)
    return wire.Identity(job=job, host=host, rank=rank, local_rank=rank if local_rank is None else local_rank,
                         world_size=world_size, pid=pid, proc_start_us=proc_start_us)


def snapshot(ident: wire.Identity, words: dict[int, int] | None = None, *, wall_ns: int = 1_000_000_000_000,
             mono_ns: int = 1_000_000_000, path: str = "/run/x.slot", records=(), torn: bool = False,
             status: wire.Status = wire.Status.RUNNING) -> wire.SlotSnapshot:
    """A real, decoded SlotSnapshot built in memory, for pure tests."""
    buf = bytearray(wire.slot_size(8))
    wire.init_slot(buf, ident, 8, wall_ns=wall_ns, mono_ns=mono_ns)
    w = memoryview(buf).cast("q")
    w[wire.H_STATUS] = int(status)
    for i, v in (words or {}).items():
        w[i] = v
    header = wire.decode_header(bytes(buf[: wire.RING_OFFSET]))
    return wire.SlotSnapshot(path=path, header=header, records=tuple(records), torn=torn)


def step_record(index: int, step: int, step_ns: int, data_ns: int = 0, coll_ns: int = 0, t_ns: int = 0,
                phase: wire.Phase = wire.Phase.TRAIN) -> wire.Record:
    return wire.Record(index=index, kind=int(wire.RecordKind.STEP_END), t_ns=t_ns, step=step,
                       payload=(step_ns, data_ns, coll_ns, 1, 0, int(phase), 1) + (0,) * 5)
