"""Helpers for testing code that uses the hook (ours and users').

``FakeClock`` makes step/data/collective splits exact without sleeping;
``read_monitor`` reads a monitor's slot back the way the agent does;
``step_splits`` turns its STEP_END records into per-step time splits;
``RankSlot`` writes a slot file through the hook's own SlotWriter with values
a test picks (for testing what reads slots: the agent, users' tools).
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from watchdog.contracts import slot as wire
from watchdog.hook import config as _config
from watchdog.hook.lifecycle import launcher
from watchdog.hook.slot.slotwriter import SlotWriter

# Variables install() reads (deprecated names included); clear them to test in a known environment.
ENV_VARS = (
    *(var for var in _config.ENV.values() if var),
    *_config.OLD_ENV_VARS,
    *launcher.VARS,
    "TORCHELASTIC_USE_AGENT_STORE",
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


class FakeCompletionSource:
    """A completion source whose markers complete when told:
    ``install(completion_source=src)``, then ``src.complete(upto, at_ns)``."""

    clock = wire.Clock.GPU_EVENT

    def __init__(self) -> None:
        self.marked = 0
        self._done: dict[int, int] = {}

    def mark(self) -> int:
        self.marked += 1
        return self.marked

    def complete(self, upto: int, at_ns: int) -> None:
        """Markers 1..``upto`` not done yet are done at ``at_ns``."""
        for m in range(1, upto + 1):
            self._done.setdefault(m, at_ns)

    def done(self, marker: int) -> int | None:
        return self._done.get(marker)


class FakeStream:
    """A simulated accelerator stream on the host's monotonic clock, for real jobs
    on CPU: ``launch(ns)`` queues a kernel that the training thread does not wait
    for (as a CUDA launch), and a marker completes when the stream reaches it.
    ``install(completion_source=FakeStream())``; ``synchronize()`` waits for the
    stream (as ``torch.cuda.synchronize()`` at the end of training)."""

    clock = wire.Clock.GPU_EVENT

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock = clock
        self._end = 0  # when the work queued so far is done

    def launch(self, ns: int) -> None:
        self._end = max(self._end, self._clock()) + ns

    def mark(self) -> int:
        self._end = max(self._end, self._clock())
        return self._end

    def done(self, marker: int) -> int | None:
        return marker if self._clock() >= marker else None

    def synchronize(self) -> None:
        time.sleep(max(0, self._end - self._clock()) / 1e9)


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
    coll_bytes: int = 0
    forward_ns: int = 0
    backward_ns: int = 0
    optimizer_ns: int = 0
    h2d_ns: int = 0

    @property
    def compute_ns(self) -> int:
        """What is left: step time minus data wait minus collective time."""
        return self.step_ns - self.data_ns - self.coll_ns


def step_splits(snapshot: wire.SlotSnapshot) -> list[StepSplit]:
    out = []
    for rec in snapshot.records:
        if rec.kind == wire.RecordKind.STEP_END:
            out.append(StepSplit(rec.step, *rec.payload[:12]))
    return out


def records_of(snapshot: wire.SlotSnapshot, kind: wire.RecordKind) -> list[wire.Record]:
    return [r for r in snapshot.all_records if r.kind == kind]


class RankSlot:
    """A rank's slot file written through the hook's real SlotWriter, with values
    the test chooses instead of measured ones: any identity (job, rank, pid,
    start time), heartbeats, step durations, collective sequence numbers,
    phases, statuses. Same bracket, same ring, same bytes as the hook writes.
    The file is formatted under a temporary name and renamed into place, so a
    reader never sees it half-made. Times default to ``time.monotonic_ns()``."""

    def __init__(
        self,
        run_dir: str,
        ident: wire.Identity,
        ring_capacity: int = wire.DEFAULT_RING_CAPACITY,
        *,
        wall_ns: int | None = None,
        mono_ns: int | None = None,
        name: str | None = None,
    ) -> None:
        size = wire.slot_size(ring_capacity)
        self.path = os.path.join(run_dir, name or wire.slot_filename(ident.job, ident.rank, ident.pid))
        tmp = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.slot = SlotWriter.format(
            mm,
            ident,
            ring_capacity,
            wall_ns=time.time_ns() if wall_ns is None else wall_ns,
            mono_ns=time.monotonic_ns() if mono_ns is None else mono_ns,
        )
        os.replace(tmp, self.path)
        self._steps = 0
        self._totals = (0, 0, 0)  # step, data, collective ns
        self._bytes = 0
        self._split: tuple[int, ...] = (0, 0, 0, 0)
        self._coll_seq = 0
        self._outstanding = 0
        self._beats = 0

    @property
    def words(self) -> memoryview:
        """The slot as int64 words (read them; write through the methods)."""
        return self.slot.words

    def update(self, words: dict[int, int] | Iterable[tuple[int, int]]) -> None:
        """Store seqlocked header words, in one bracket."""
        self.slot.write(words.items() if isinstance(words, dict) else words)

    def heartbeat(self, now_ns: int | None = None) -> None:
        self._beats += 1
        self.slot.put(wire.H_HEARTBEAT_NS, time.monotonic_ns() if now_ns is None else now_ns)
        self.slot.put(wire.H_HEARTBEAT_COUNT, self._beats)

    def status(self, status: wire.Status) -> None:
        self.slot.put(wire.H_STATUS, int(status))

    def record(self, kind: wire.RecordKind, t_ns: int, step: int, *payload: int) -> None:
        self.slot.write((), (int(kind), t_ns, step, *payload))

    def event(self, kind: wire.RecordKind, t_ns: int, step: int, *payload: int) -> None:
        """One record on the event ring (where the hook writes COLL_SIG and COMPLETION)."""
        self.slot.write_events([(int(kind), t_ns, step, payload)])

    def step(
        self,
        step_ns: int,
        data_ns: int = 0,
        coll_ns: int = 0,
        now_ns: int | None = None,
        phase: wire.Phase = wire.Phase.TRAIN,
        *,
        coll_bytes: int = 0,
        split: tuple[int, int, int, int] | None = None,
    ) -> int:
        """A completed step of the given split (one collective, one data wait),
        ending at ``now_ns``: header words and its STEP_END record in one bracket.
        ``coll_bytes``: the step's collective bytes; ``split``: its forward,
        backward, optimizer and host-to-device ns (mon.watch_model's)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        n = self._steps + 1
        tot_step, tot_data, tot_coll = (t + d for t, d in zip(self._totals, (step_ns, data_ns, coll_ns)))
        self._bytes += coll_bytes
        parts = tuple(split) if split else (0, 0, 0, 0)
        self._split = tuple(t + d for t, d in zip(self._split, parts))
        self.slot.write(
            ((wire.H_STEP, n), (wire.H_STEP_START_NS, now), (wire.H_LAST_STEP_NS, step_ns),
             (wire.H_LAST_DATA_NS, data_ns), (wire.H_LAST_COLL_NS, coll_ns), (wire.H_TOTAL_STEP_NS, tot_step),
             (wire.H_TOTAL_DATA_NS, tot_data), (wire.H_TOTAL_COLL_NS, tot_coll),
             (wire.H_TOTAL_COLL_BYTES, self._bytes), *(zip(wire.SPLIT_WORDS, self._split) if split else ())),
            (int(wire.RecordKind.STEP_END), now, n, step_ns, data_ns, coll_ns, 1, self._coll_seq, int(phase), 1,
             coll_bytes, *parts),
        )  # fmt: skip
        self._steps, self._totals = n, (tot_step, tot_data, tot_coll)
        return n

    def batch(self, samples: int) -> None:
        """The per-rank batch size, as the wrapped loader or mon.set_batch_size leaves it."""
        self.update({wire.H_BATCH_PER_RANK: samples})

    def loss(self, value: float, step: int | None = None, bad_first: int = 0, bad_count: int = 0) -> None:
        """The loss words as ``mon.step(loss=value)`` leaves them (``step``: the step it ended)."""
        n = self._steps if step is None else step
        self.update(zip(wire.LOSS_WORDS, (wire.loss_bits(value), n, bad_first, bad_count)))

    def enter_collective(self, seq: int, op: wire.CollOp = wire.CollOp.ALL_REDUCE, now_ns: int | None = None) -> None:
        """Collective number ``seq`` (default group) entered at ``now_ns``."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        self._coll_seq = seq
        self._outstanding += 1
        self.update({wire.H_COLL_SEQ: seq, wire.H_COLL_OP: int(op), wire.H_COLL_ENTER_NS: now,
                     wire.H_COLL_OUTSTANDING: self._outstanding})  # fmt: skip

    def exit_collective(self, now_ns: int | None = None) -> None:
        """The last collective entered completed at ``now_ns``."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        self._outstanding = max(0, self._outstanding - 1)
        self.update({wire.H_COLL_EXIT_NS: now, wire.H_COLL_DONE_SEQ: self._coll_seq,
                     wire.H_COLL_OUTSTANDING: self._outstanding})  # fmt: skip

    def close(self) -> None:
        """Unmap (the file stays, as a dead rank's would)."""
        self.slot.detach()
