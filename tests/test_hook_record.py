"""What the monitor records, read back the way the agent reads it.

A FakeClock makes every duration exact: the loader, the collective and the
"compute" advance it by known amounts, so the split is checked to the
nanosecond instead of with sleeps and tolerances.
"""

from __future__ import annotations

import os
import sys
import threading
import tracemalloc

import pytest

from watchdog.contracts import slot as wire
from watchdog.contracts.slot import CollOp, Phase, RecordKind
from watchdog.hook.marks import collective_marks as marks_mod
from watchdog.hook.marks import recorder as recorder_mod
from watchdog.hook.marks.groups import GroupCounters
from watchdog.hook.slot import slotwriter as slotwriter_mod
from watchdog.hook.testing import ENV_VARS, FakeClock, installed, read_monitor, records_of, step_splits
from watchdog.hook.zero_code import collectives


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def mon(tmp_path, clock):
    with installed(tmp_path, clock=clock, patch_collectives=False, heartbeat_interval_s=3600) as m:
        yield m


class SlowLoader:
    """An iterable whose every fetch takes ``wait_ns`` of fake time."""

    def __init__(self, clock, items, wait_ns):
        self.clock, self.items, self.wait_ns = clock, list(items), wait_ns
        self.sampler = "the sampler"

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        for item in self.items:
            self.clock.advance(self.wait_ns)
            yield item


class Group:
    def __init__(self, name):
        self.group_name = name


def test_step_split_is_exact(mon, clock):
    loader = mon.wrap_loader(SlowLoader(clock, range(3), wait_ns=300))
    for _ in loader:
        clock.advance(1000)  # forward
        with mon.collective(CollOp.ALL_REDUCE, nbytes=4096):
            clock.advance(200)
        clock.advance(500)  # optimizer
        mon.step()
    snap = read_monitor(mon)
    splits = step_splits(snap)
    assert [s.step for s in splits] == [1, 2, 3]
    for s in splits:
        assert (s.step_ns, s.data_ns, s.coll_ns, s.compute_ns) == (2000, 300, 200, 1500)
        assert (s.collectives, s.data_waits, s.phase) == (1, 1, Phase.TRAIN)
    assert [s.last_coll_seq for s in splits] == [1, 2, 3]
    h = snap.header
    assert h[wire.H_STEP] == 3
    assert (h[wire.H_LAST_STEP_NS], h[wire.H_LAST_DATA_NS], h[wire.H_LAST_COLL_NS]) == (2000, 300, 200)
    assert (h[wire.H_TOTAL_STEP_NS], h[wire.H_TOTAL_DATA_NS], h[wire.H_TOTAL_COLL_NS]) == (6000, 900, 600)
    assert h[wire.H_STEP_START_NS] == clock.now
    # the loop's last fetch (StopIteration) waited too; it belongs to the step in progress
    assert h[wire.H_DATA_EXIT_NS] == clock.now and not h.in_data_wait
    assert not snap.torn


def test_first_step_runs_from_install(tmp_path, clock):
    start = clock.now
    with installed(tmp_path, clock=clock, patch_collectives=False, heartbeat_interval_s=3600) as mon:
        assert read_monitor(mon).header[wire.H_STEP_START_NS] == start
        clock.advance(777)
        mon.step()
        assert step_splits(read_monitor(mon))[0].step_ns == 777


def test_live_reader_sees_waiting_on_data_since_t(mon, clock):
    seen = []

    def fetch():
        clock.advance(50)
        h = read_monitor(mon).header
        seen.append((h.in_data_wait, h[wire.H_DATA_ENTER_NS]))
        yield "batch"

    entered = clock.now
    assert list(mon.wrap_loader(fetch())) == ["batch"]
    assert seen == [(True, entered)]
    assert not read_monitor(mon).header.in_data_wait


def test_live_reader_sees_in_collective_k_since_t(mon, clock):
    g = Group("7")
    with mon.collective("all_reduce", group=g, nbytes=64):
        pass
    t_enter = clock.advance(10)
    with mon.collective("broadcast", group=g, nbytes=128):
        h = read_monitor(mon).header
        assert h.in_collective
        assert (h[wire.H_COLL_GROUP], h[wire.H_COLL_SEQ]) == (wire.group_key("7"), 2)
        assert h[wire.H_COLL_OP] == CollOp.BROADCAST
        assert (h[wire.H_COLL_BYTES], h[wire.H_COLL_ENTER_NS], h[wire.H_COLL_DONE_SEQ]) == (128, t_enter, 1)
        clock.advance(5)
    h = read_monitor(mon).header
    assert not h.in_collective
    assert (h[wire.H_COLL_DONE_SEQ], h[wire.H_COLL_EXIT_NS]) == (2, t_enter + 5)


def test_sequence_numbers_are_per_group_and_shared_by_handles_of_one_group(mon):
    a1, a2, b = Group("5"), Group("5"), Group("6")
    for g in (a1, b, a2, None, None):
        with mon.collective("all_reduce", group=g):
            pass
    h = read_monitor(mon).header
    assert (h[wire.H_COLL_GROUP], h[wire.H_COLL_SEQ]) == (0, 2)  # default group: its 2nd
    with mon.collective("all_reduce", group=a1):
        assert read_monitor(mon).header[wire.H_COLL_SEQ] == 3  # a1 and a2 are one group
    with mon.collective("all_reduce", group=b):
        assert read_monitor(mon).header[wire.H_COLL_SEQ] == 2


def test_overlapping_collectives_count_their_union(mon, clock):
    """A enters at 0, B at 10, A exits at 30, B at 50: 50 ns of collective time, not 70."""
    a = mon.recorder.collectives.enter(int(CollOp.ALL_REDUCE), None, 0)
    clock.advance(10)
    b = mon.recorder.collectives.enter(int(CollOp.ALL_REDUCE), None, 0)
    assert read_monitor(mon).header[wire.H_COLL_OUTSTANDING] == 2
    clock.advance(20)
    mon.recorder.collectives.exit(a)
    h = read_monitor(mon).header
    assert h[wire.H_COLL_OUTSTANDING] == 1 and h[wire.H_COLL_DONE_SEQ] == 1
    clock.advance(20)
    mon.recorder.collectives.exit(b)
    clock.advance(50)
    mon.step()
    s = step_splits(read_monitor(mon))[0]
    assert (s.step_ns, s.coll_ns, s.collectives) == (100, 50, 2)


def test_a_collective_spanning_the_step_boundary_is_split(mon, clock):
    token = mon.recorder.collectives.enter(int(CollOp.ALL_REDUCE), None, 0)
    clock.advance(10)
    mon.step()
    clock.advance(5)
    mon.recorder.collectives.exit(token)
    clock.advance(5)
    mon.step()
    first, second = step_splits(read_monitor(mon))
    assert (first.coll_ns, second.coll_ns) == (10, 5)
    assert read_monitor(mon).header[wire.H_TOTAL_COLL_NS] == 15


def test_exit_without_enter_does_not_go_negative(mon, clock):
    mon.recorder.collectives.exit((GroupCounters(0), 1))
    mon.step()
    assert read_monitor(mon).header[wire.H_COLL_OUTSTANDING] == 0
    assert step_splits(read_monitor(mon))[0].coll_ns == 0
    assert mon.errors == 0


def test_phases_nest_and_restore(mon, clock):
    with mon.phase("checkpoint"):
        clock.advance(1)
        assert read_monitor(mon).header[wire.H_PHASE] == Phase.CHECKPOINT
        with mon.phase(Phase.EVAL):
            assert read_monitor(mon).header[wire.H_PHASE] == Phase.EVAL
            with mon.phase("no-such-phase"):
                assert read_monitor(mon).header[wire.H_PHASE] == Phase.OTHER
        h = read_monitor(mon).header
        assert h[wire.H_PHASE] == Phase.CHECKPOINT and h[wire.H_PHASE_SINCE_NS] == clock.now
    assert read_monitor(mon).header[wire.H_PHASE] == Phase.TRAIN
    moves = [(r.payload[0], r.payload[1]) for r in records_of(read_monitor(mon), RecordKind.PHASE)]
    assert moves == [
        (Phase.CHECKPOINT, Phase.TRAIN),
        (Phase.EVAL, Phase.CHECKPOINT),
        (Phase.OTHER, Phase.EVAL),
        (Phase.EVAL, Phase.OTHER),
        (Phase.CHECKPOINT, Phase.EVAL),
        (Phase.TRAIN, Phase.CHECKPOINT),
    ]


def test_phase_at_step_end_is_in_the_step_record(mon):
    with mon.phase("eval"):
        mon.step()
    assert step_splits(read_monitor(mon))[0].phase == Phase.EVAL


def test_a_step_that_had_a_pause_open_is_recorded_in_it(mon):
    """A rank-0-only evaluation or save marked inside a step that then trains on: the
    step's record says the pause (the others' wait in that step was for it); the next
    step, and a step that only passed through another phase, say where they ended."""
    with mon.phase("eval"), mon.phase("checkpoint"):
        pass
    mon.step()
    mon.step()
    with mon.phase("checkpoint"):
        pass
    with mon.phase("other"):
        pass
    mon.step()
    with mon.phase("other"):
        pass
    mon.step()
    assert [s.phase for s in step_splits(read_monitor(mon))] == [Phase.EVAL, Phase.TRAIN, Phase.CHECKPOINT, Phase.TRAIN]


def test_phase_restored_when_the_block_raises(mon):
    with pytest.raises(KeyError), mon.phase("checkpoint"):
        raise KeyError("user error")
    assert read_monitor(mon).header[wire.H_PHASE] == Phase.TRAIN


def test_step_scope(mon, clock):
    clock.advance(1000)  # time outside any step (setup)
    with mon.step_scope():
        clock.advance(70)
    assert step_splits(read_monitor(mon))[-1].step_ns == 70
    # a fetch before the block belongs to the step: the step started before it
    for _ in mon.wrap_loader(SlowLoader(clock, [1], wait_ns=30)):
        with mon.step_scope():
            clock.advance(70)
        break
    s = step_splits(read_monitor(mon))[-1]
    assert (s.step_ns, s.data_ns) == (100, 30)
    with pytest.raises(RuntimeError), mon.step_scope():
        raise RuntimeError("a failed step is not a completed step")
    assert read_monitor(mon).header[wire.H_STEP] == 2


def test_loader_passes_user_errors_and_stop_iteration_through(mon, clock):
    boom = ValueError("bad record")

    class Flaky:
        def __init__(self):
            self.n = 0

        def __iter__(self):
            return self

        def __next__(self):
            self.n += 1
            if self.n == 2:
                raise boom
            if self.n > 3:
                raise StopIteration
            return self.n

    it = iter(mon.wrap_loader(Flaky()))
    assert next(it) == 1
    with pytest.raises(ValueError) as info:
        next(it)
    assert info.value is boom  # the very same exception object
    assert next(it) == 3  # and the iterator is still usable, as the user's was
    with pytest.raises(StopIteration):
        next(it)
    assert mon.errors == 0
    mon.step()
    assert step_splits(read_monitor(mon))[0].data_waits == 4


def test_wrapped_loader_keeps_len_and_attributes(mon, clock):
    inner = SlowLoader(clock, range(5), 1)
    wrapped = mon.wrap_loader(inner)
    assert len(wrapped) == 5 and wrapped.sampler == "the sampler"
    assert list(wrapped) == list(range(5)) == list(wrapped)  # re-iterable like the inner one


def test_full_ring_wraps(tmp_path, clock):
    with installed(tmp_path, clock=clock, patch_collectives=False, ring_capacity=4, heartbeat_interval_s=3600) as mon:
        for _ in range(10):
            clock.advance(10)
            mon.step()
        snap = read_monitor(mon)
        assert snap.header[wire.H_RING_HEAD] == 10
        assert [r.index for r in snap.records] == [6, 7, 8, 9]
        assert [r.step for r in snap.records] == [7, 8, 9, 10]
        assert mon.errors == 0


def test_set_step_keeps_the_jobs_numbering(mon):
    mon.set_step(500)
    mon.step()
    assert read_monitor(mon).header[wire.H_STEP] == 501
    assert step_splits(read_monitor(mon))[0].step == 501
    with pytest.raises(ValueError):
        mon.set_step(-1)


class RecordingWords:
    """Stands in for the monitor's int64 view and logs every store."""

    def __init__(self, real, log):
        self.real, self.log = real, log

    def __setitem__(self, index, value):
        self.real[index] = value
        if isinstance(index, slice):
            self.log.append(("store", range(index.start, index.stop)))
        else:
            self.log.append(("store", range(index, index + 1), value))

    def __getitem__(self, index):
        return self.real[index]

    def __len__(self):
        return len(self.real)


def test_every_dynamic_store_is_inside_a_seqlock_bracket(mon, clock, monkeypatch):
    # The heartbeat's first beat may read the Flight Recorder and mark the read (a bracket):
    # let it finish, and count from where it left the seqlock.
    mon.heartbeat.stop()
    start = mon.slot._seq
    log: list = []
    words = RecordingWords(mon.slot._words, log)
    monkeypatch.setattr(mon.slot, "_words", words)
    packs = [(recorder_mod, "_pack_step", 8), (marks_mod, "_pack_coll", 8), (marks_mod, "_pack_exit", 3),
             (collectives, "_pack_coll", 8), (collectives, "_pack_exit", 3),  # the wrapper's inlined marks
             (recorder_mod, "pack_record", 11), (slotwriter_mod, "pack_record", 11)]  # fmt: skip
    for module, name, n in packs:
        real = getattr(module, name)

        def recording(buf, offset, *values, _real=real, _n=n):
            log.append(("store", range(offset // 8, offset // 8 + _n)))
            _real(words.real, offset, *values)

        monkeypatch.setattr(module, name, recording)
    # every writing path once
    for _ in mon.wrap_loader(SlowLoader(clock, [1], 5)):
        with mon.step_scope(), mon.phase("eval"), mon.collective("all_reduce", nbytes=8):
            clock.advance(1)
    sink = type("Sink", (), {"marks": mon.recorder.collectives})
    patched = collectives.make_collective_wrapper(lambda *a: None, CollOp.ALL_REDUCE, 2, 0, "t", False, None, sink)
    patched(b"12345678")  # the patched-torch path
    mon.set_step(10)
    mon.recorder.set_pg(wire.PgState.JOINED)
    mon.report_error("test", RuntimeError("counted"))
    from watchdog.hook.slot import control_block as control

    mon.control.ack(control.ControlRequest(1, wire.Command.NONE, 0), control.ACK_OK)
    assert mon.errors == 1  # the one reported above: every path wrote

    seq = start or None
    brackets = 0
    dynamic = {i for i in range(wire.HEADER_WORDS) if wire.seqlocked(i) and i != wire.H_SEQ}
    dynamic |= set(range(wire.RING_OFFSET // 8, 10**6))
    for entry in log:
        touched = entry[1]
        if touched == range(wire.H_SEQ, wire.H_SEQ + 1):
            new = entry[2]
            assert new == (seq or 0) + 1, "seq must advance by one per store"
            brackets += new % 2
            seq = new
        elif dynamic.intersection(touched):
            assert seq is not None and seq % 2 == 1, f"store to words {touched} outside a bracket"
    assert seq is not None and seq % 2 == 0 and brackets >= 11
    assert read_monitor(mon).header[wire.H_SEQ] == seq


def test_writer_threads_never_show_a_reader_a_torn_header(tmp_path, clock):
    """Two writer threads (steps; collectives as if from a backend thread) race a
    reader that preads the file. Every header it accepts must satisfy invariants
    that hold only between brackets."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with installed(tmp_path, clock=clock, patch_collectives=False, heartbeat_interval_s=3600) as mon:
            stop = threading.Event()

            def steps():
                while not stop.is_set():
                    clock.advance(1000)
                    mon.step()

            def collectives():
                while not stop.is_set():
                    with mon.collective("all_reduce", nbytes=8):
                        pass

            threads = [threading.Thread(target=steps), threading.Thread(target=collectives)]
            for t in threads:
                t.start()
            accepted = 0
            fd = os.open(mon.slot_path, os.O_RDONLY)
            try:
                for _ in range(3000):
                    h, torn = wire.read_header_consistent(fd)
                    if torn:
                        continue
                    accepted += 1
                    n = h[wire.H_STEP]
                    assert h[wire.H_RING_HEAD] == n  # one record per step, written with it
                    assert h[wire.H_TOTAL_STEP_NS] == sum_of_steps(h)
                    assert h[wire.H_COLL_OUTSTANDING] in (0, 1)
                    assert h[wire.H_COLL_DONE_SEQ] in (h[wire.H_COLL_SEQ], h[wire.H_COLL_SEQ] - 1)
            finally:
                os.close(fd)
                stop.set()
                for t in threads:
                    t.join(10)
            assert accepted > 100
            assert mon.errors == 0
    finally:
        sys.setswitchinterval(old)


def sum_of_steps(h) -> int:
    """Total step time implied by the start of the step in progress."""
    return h[wire.H_STEP_START_NS] - h.created_mono_ns


def test_ten_thousand_steps_do_not_grow_memory(mon, clock):
    def loop(n):
        for _ in mon.wrap_loader(range(n)):
            with mon.collective(CollOp.ALL_REDUCE, nbytes=8):
                pass
            clock.advance(100)
            mon.step()

    loop(2000)  # warm caches, intern ints, fill the ring
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        loop(10000)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    growth = sum(s.size_diff for s in after.compare_to(before, "filename") if s.size_diff > 0)
    assert growth < 16 * 1024, growth
    assert read_monitor(mon).header[wire.H_STEP] == 12000
