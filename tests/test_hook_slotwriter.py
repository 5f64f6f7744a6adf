"""The slot writer: the one implementation of the seqlock bracket and the ring,
read back with the agent's reader (wire.read_slot)."""

from __future__ import annotations

import mmap

import pytest

from watchdog.contracts import slot as wire
from watchdog.contracts.slot import CollOp, Phase, RecordKind
from watchdog.hook.marks.collective_marks import CollectiveMarks
from watchdog.hook.marks.loader import TimedIterator
from watchdog.hook.marks.recorder import Recorder
from watchdog.hook.slot.slotwriter import SlotWriter, inline_seqlock, seqlocked
from watchdog.hook.testing import ENV_VARS, FakeClock, RankSlot, installed, read_monitor, records_of
from watchdog.hook.zero_code import collectives

IDENT = wire.Identity(job="j", host="h", rank=1, local_rank=1, world_size=4, pid=4321, proc_start_us=77, run_id="r:0")
T0 = 1_000_000_000


def file_writer(tmp_path, capacity=8) -> tuple[SlotWriter, str]:
    path = str(tmp_path / "r1.slot")
    with open(path, "wb") as f:
        f.write(bytes(wire.slot_size(capacity)))
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), wire.slot_size(capacity))
    return SlotWriter.format(mm, IDENT, capacity, wall_ns=5, mono_ns=T0), path


def test_one_bracket_writes_what_the_reader_decodes(tmp_path):
    wr, path = file_writer(tmp_path)
    wr.write(((wire.H_STEP, 3), (wire.H_PHASE, int(Phase.EVAL))), (RecordKind.PHASE, T0 + 5, 3, int(Phase.EVAL), 0))
    snap = wire.read_slot(path)
    assert not snap.torn and snap.header.identity == IDENT
    assert (snap.header[wire.H_STEP], snap.header[wire.H_PHASE], snap.header[wire.H_SEQ]) == (3, Phase.EVAL, 2)
    (rec,) = snap.records
    assert (rec.index, rec.kind, rec.t_ns, rec.step, rec.payload[:2]) == (0, RecordKind.PHASE, T0 + 5, 3, (3, 0))
    wr.detach()


def test_a_writer_stopped_inside_a_bracket_reads_as_torn_and_then_whole(tmp_path):
    wr, path = file_writer(tmp_path)
    with wr.lock, seqlocked(wr) as w:
        w[wire.H_STEP] = 9
        assert wire.read_slot(path).torn  # H_SEQ odd: a reader never takes this header as consistent
    snap = wire.read_slot(path)
    assert not snap.torn and snap.header[wire.H_STEP] == 9
    wr.detach()


def test_a_failed_store_still_closes_its_bracket(tmp_path):
    wr, path = file_writer(tmp_path)
    with pytest.raises(TypeError):
        wr.write(((wire.H_STEP, "not a number"),))  # type: ignore[arg-type]  # the wrong type the test is about
    snap = wire.read_slot(path)
    assert not snap.torn and snap.header[wire.H_SEQ] == 2
    wr.write(((wire.H_STEP, 1),))  # and the lock was released
    assert wire.read_slot(path).header[wire.H_STEP] == 1
    wr.detach()


def test_the_ring_wraps_and_the_reader_keeps_the_newest(tmp_path):
    wr, path = file_writer(tmp_path, capacity=4)
    for i in range(10):
        wr.write((), (RecordKind.ERROR, T0 + i, i, i + 1))
    snap = wire.read_slot(path)
    assert snap.header[wire.H_RING_HEAD] == 10
    assert [(r.index, r.payload[0]) for r in snap.records] == [(6, 7), (7, 8), (8, 9), (9, 10)]
    assert [r.index for r in wire.read_slot(path, since=8).records] == [8, 9]
    wr.detach()


def test_seqlocked_words_cannot_be_put_outside_a_bracket(tmp_path):
    wr, path = file_writer(tmp_path)
    for index in (wire.H_SEQ, wire.H_STEP, wire.H_RING_HEAD):
        with pytest.raises(ValueError):
            wr.put(index, 1)
    wr.put(wire.H_HEARTBEAT_NS, T0 + 1)
    assert wire.read_slot(path).header.heartbeat_ns == T0 + 1
    wr.detach()


def test_late_writes_after_detach_land_in_scratch_memory(tmp_path):
    wr, path = file_writer(tmp_path)
    wr.write(((wire.H_STEP, 1),))
    wr.detach()
    wr.write(((wire.H_STEP, 2),), (RecordKind.ERROR, T0, 0, 1))  # a callback in flight: harmless
    assert wire.read_slot(path).header[wire.H_STEP] == 1


SPLICED = (
    (SlotWriter, "write"), (SlotWriter, "write_wide"), (SlotWriter, "write_events"), (Recorder, "step"),
    (Recorder, "scope_enter"), (Recorder, "set_step"), (CollectiveMarks, "enter"), (CollectiveMarks, "exit"),
    (TimedIterator, "__next__"), (collectives, "make_collective_wrapper"),
)  # fmt: skip


def names_in(code) -> set[str]:
    out = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            out |= names_in(const)
    return out


def test_the_hot_paths_hold_the_bracket_spliced_not_a_call():
    """inline_seqlock replaced each ``with seqlocked(slot) as w:`` by the generator's own
    statements: no call to it is left (a ``with`` on a generator costs more than the stores)."""
    for owner, name in SPLICED:
        fn = getattr(owner, name)
        assert fn.__seqlock_inlined__ and "seqlocked" not in names_in(fn.__code__), name
        assert "seqlocked" in names_in(fn.__wrapped__.__code__)  # the source's with, kept for the plain run
    assert "H_SEQ" not in names_in(Recorder.step.__code__)  # the bracket's word index: a constant


def test_a_bracket_inline_seqlock_cannot_splice_fails_at_import():
    with pytest.raises(ImportError, match="seqlocked"):

        @inline_seqlock
        def no_bracket(slot):
            return slot

    with pytest.raises(ImportError, match="as <name>"):

        @inline_seqlock
        def not_a_name(slot):
            with seqlocked(slot.inner) as w:
                w[0] = 1


@pytest.mark.parametrize("spliced", [True, False], ids=["spliced", "generator"])
def test_hot_paths_leave_the_same_bytes_as_the_generic_bracket(spliced, monkeypatch):
    """The recorder's step, the loader's data-wait marks and the collective marks' enter / exit
    open the writer's bracket inline for speed (the patched collectives' copy of enter / exit:
    tests/test_hook_inline.py). Replaying the same events through
    SlotWriter.write, one bracket each, must leave a byte-identical slot: the
    same seq counts, header words, ring records and head. Played once with the
    bracket spliced in, once through the ``seqlocked`` generator itself."""
    if not spliced:
        for owner, name in SPLICED:
            monkeypatch.setattr(owner, name, getattr(owner, name).__wrapped__)

    def fresh() -> SlotWriter:
        return SlotWriter.format(bytearray(wire.slot_size(4)), IDENT, 4, wall_ns=5, mono_ns=T0)

    clock = FakeClock(T0)
    errors = []
    hot = fresh()
    rec = Recorder(hot, clock, T0, on_error=lambda where, exc: errors.append(exc), on_control_due=lambda n: None)
    generic = fresh()
    group = wire.group_key("")
    last_exit = 0
    for n in range(1, 7):  # wraps the 4-record ring
        t_data = clock.now
        assert next(TimedIterator(iter(lambda: clock.advance(30), None), rec)) == t_data + 30  # passes through
        generic.write(((wire.H_DATA_ENTER_NS, t_data),))
        generic.write(((wire.H_DATA_EXIT_NS, t_data + 30),))
        t_in = clock.advance(100)
        token = rec.collectives.enter(int(CollOp.ALL_REDUCE), None, 64)
        generic.write(((wire.H_COLL_GROUP, group), (wire.H_COLL_SEQ, n), (wire.H_COLL_OP, int(CollOp.ALL_REDUCE)),
                       (wire.H_COLL_BYTES, 64), (wire.H_COLL_ENTER_NS, t_in), (wire.H_COLL_EXIT_NS, last_exit),
                       (wire.H_COLL_OUTSTANDING, 1), (wire.H_COLL_DONE_SEQ, n - 1)))  # fmt: skip
        last_exit = clock.advance(200)
        assert token is not None
        rec.collectives.exit(token)
        generic.write(((wire.H_COLL_EXIT_NS, last_exit), (wire.H_COLL_OUTSTANDING, 0), (wire.H_COLL_DONE_SEQ, n)))
        now = clock.advance(100)
        split = n > 3  # the finer split, opted into midway (mon.watch_model): 4 more words then
        if split:
            rec.split_on = True
            rec.split[:] = [n, 2 * n, 3 * n, 4 * n]  # forward, backward, optimizer, h2d ns of this step
        rec.step()
        sums = [k * sum(range(4, n + 1)) for k in (1, 2, 3, 4)]
        generic.write(
            ((wire.H_STEP, n), (wire.H_STEP_START_NS, now), (wire.H_LAST_STEP_NS, 430), (wire.H_LAST_DATA_NS, 30),
             (wire.H_LAST_COLL_NS, 200), (wire.H_TOTAL_STEP_NS, 430 * n), (wire.H_TOTAL_DATA_NS, 30 * n),
             (wire.H_TOTAL_COLL_NS, 200 * n), (wire.H_TOTAL_COLL_BYTES, 64 * n),
             *(zip(wire.SPLIT_WORDS, sums) if split else ())),
            (RecordKind.STEP_END, now, n, 430, 30, 200, 1, n, int(Phase.TRAIN), 1, 64,
             *((n, 2 * n, 3 * n, 4 * n) if split else ())),
        )  # fmt: skip
        assert rec.split == [0, 0, 0, 0]  # the step took them
    assert errors == []
    assert hot.copy() == generic.copy()


def test_a_forged_rank_slot_reads_like_the_hooks_own(tmp_path, monkeypatch):
    """The agent's tests read slots forged by RankSlot: a step forged with the
    split the hook measured must decode to the same header and STEP_END record."""
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    clock = FakeClock(T0)
    (tmp_path / "hook").mkdir()
    (tmp_path / "forged").mkdir()
    with installed(tmp_path / "hook", clock=clock, patch_collectives=False, heartbeat_interval_s=3600) as mon:
        for _ in mon.wrap_loader(iter(lambda: clock.advance(30), None)):
            break
        clock.advance(100)
        with mon.collective("all_reduce"):
            clock.advance(200)
        clock.advance(100)
        mon.step()
        hook = read_monitor(mon)
    forged_slot = RankSlot(str(tmp_path / "forged"), mon.identity, mono_ns=T0)
    forged_slot.enter_collective(1, now_ns=T0 + 130)
    forged_slot.exit_collective(now_ns=T0 + 330)
    forged_slot.step(430, 30, 200, now_ns=T0 + 430)
    forged = wire.read_slot(forged_slot.path)
    forged_slot.close()
    same = [
        *range(wire.H_STEP, wire.H_TOTAL_COLL_NS + 1),
        wire.H_COLL_SEQ,
        wire.H_COLL_OP,
        wire.H_COLL_ENTER_NS,
        wire.H_COLL_EXIT_NS,
        wire.H_COLL_OUTSTANDING,
        wire.H_COLL_DONE_SEQ,
        wire.H_RING_HEAD,
    ]
    assert [forged.header[i] for i in same] == [hook.header[i] for i in same]
    assert forged.header.identity == hook.header.identity and not forged.torn
    (h,), (f,) = records_of(hook, RecordKind.STEP_END), records_of(forged, RecordKind.STEP_END)
    assert (f.index, f.t_ns, f.step, f.payload[:7]) == (h.index, h.t_ns, h.step, h.payload[:7])
