"""The Flight Recorder source: what it reads from a real torch 2.13 gloo group,
and that it degrades cleanly when FR is absent or its dump changes shape."""

from __future__ import annotations

import json
import sys
import types

import pytest

from watchdog.contracts import slot as wire
from watchdog.contracts.slot import CollOp, CollState, Command, RecordKind
from watchdog.hook.completion import flight_recorder
from watchdog.hook.completion.flight_recorder import FlightRecorderSource, entry, op_of, parse
from watchdog.hook.slot import control_block as control
from watchdog.hook.testing import ENV_VARS, FakeClock, installed, read_monitor, records_of

# Two entries as torch 2.13 wrote them on a real 2-rank gloo job (DDP's parameter broadcast, then an all-reduce).
REAL = [
    {
        "collective_seq_id": 2,
        "input_dtypes": ["Float"],
        "input_sizes": [[10]],
        "is_p2p": False,
        "op_id": 2,
        "output_dtypes": ["Float"],
        "output_sizes": [[10]],
        "p2p_seq_id": 0,
        "pg_id": 0,
        "process_group": ["0", "default_pg"],
        "profiling_name": "gloo:broadcast",
        "record_id": 1,
        "retired": True,
        "state": "scheduled",
        "time_created_ns": 1796072125947553107,
        "time_discovered_completed_ns": 0,
        "time_discovered_started_ns": 0,
        "timeout_ms": 1800000,
    },
    {
        "collective_seq_id": 3,
        "input_dtypes": ["Long"],
        "input_sizes": [[2, 3]],
        "is_p2p": False,
        "process_group": ["0", "default_pg"],
        "profiling_name": "gloo:all_reduce",
        "state": "scheduled",
        "time_created_ns": 1796072125953266566,
        "time_discovered_completed_ns": None,
        "time_discovered_started_ns": None,
    },
]


def dump_of(entries) -> bytes:
    return json.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": entries}).encode()


def test_entries_as_torch_writes_them():
    got, skipped = parse(dump_of(REAL))
    assert skipped == 0
    b, a = got
    assert (b.group, b.seq, b.op, b.elements, wire.DTYPES[b.dtype], b.state) == (
        0,
        2,
        CollOp.BROADCAST,
        10,
        "float32",
        CollState.SCHEDULED,
    )
    assert (a.op, a.elements, wire.DTYPES[a.dtype], wire.unpack_shape(a.shape)) == (
        CollOp.ALL_REDUCE,
        6,
        "int64",
        (2, 3),
    )
    assert a.created_ns == 1796072125953266566 and a.started_ns == a.completed_ns == 0


@pytest.mark.parametrize(
    "name,op",
    [
        ("nccl:all_reduce", CollOp.ALL_REDUCE),
        ("nccl:_allgather_base", CollOp.ALL_GATHER),
        ("nccl:reduce_scatter_tensor_coalesced", CollOp.REDUCE_SCATTER),
        ("gloo:barrier", CollOp.BARRIER),
        ("nccl:send 0->1", CollOp.SEND),
        ("xccl:something_new", CollOp.OTHER),
    ],
)
def test_op_names(name, op):
    assert op_of(name) == op


def test_shapes_that_do_not_fit_a_word_are_not_invented():
    assert wire.unpack_shape(wire.pack_shape((2, 3, 4, 5))) is None
    assert wire.unpack_shape(wire.pack_shape((1 << 21,))) is None
    assert wire.unpack_shape(wire.pack_shape(())) == ()


@pytest.mark.parametrize(
    "bad",
    [
        {**REAL[0], "collective_seq_id": "2"},
        {**REAL[0], "process_group": "0"},
        {**REAL[0], "input_sizes": [[-1]]},
        {k: v for k, v in REAL[0].items() if k != "profiling_name"},
        ["not", "a", "dict"],
    ],
)
def test_an_entry_of_another_shape_is_skipped_and_counted(bad):
    assert entry(bad) is None
    got, skipped = parse(dump_of([bad, REAL[1]]))
    assert [e.seq for e in got] == [3] and skipped == 1


def test_p2p_entries_are_left_out_without_counting_them_as_bad():
    got, skipped = parse(dump_of([{**REAL[0], "is_p2p": True}, REAL[1]]))
    assert [e.seq for e in got] == [3] and skipped == 0


class Sink:
    def __init__(self):
        self.records = []

    def __call__(self, recs):
        self.records += recs


def source(dumps, **kw):
    it = iter(dumps)
    sink = Sink()
    src = FlightRecorderSource(lambda: lambda: next(it), sink, FakeClock(), lambda: 7, **kw)
    return src, sink


def test_only_new_collectives_or_moved_states_are_written():
    started = {**REAL[1], "state": "started", "time_discovered_started_ns": 5}
    src, sink = source([dump_of(REAL[:1]), dump_of(REAL), dump_of(REAL), dump_of([REAL[0], started])])
    assert [src.poll() for _ in range(4)] == [1, 1, 0, 1]
    seqs = [(r[3][1], r[3][5]) for r in sink.records]
    assert seqs == [(2, CollState.SCHEDULED), (3, CollState.SCHEDULED), (3, CollState.STARTED)]
    kind, _, step, payload = sink.records[-1]
    assert kind == RecordKind.COLL_SIG and step == 7
    assert payload[8] == 5 and payload[10] == wire.Clock.WALL


def test_a_burst_writes_only_the_newest():
    many = [{**REAL[1], "collective_seq_id": i} for i in range(1, 41)]
    src, sink = source([dump_of(many)], per_poll=16)
    assert src.poll() == 16
    assert [r[3][1] for r in sink.records] == list(range(25, 41))


@pytest.mark.parametrize("raw", [b"\x80\x04 pickle, not json", json.dumps([1, 2]).encode(), dump_of([{"x": 1}])])
def test_a_dump_of_another_shape_turns_the_source_off_without_raising(raw):
    src, sink = source([raw, dump_of(REAL)])
    assert src.poll() == 0 and src.broken
    assert src.poll() == 0 and not sink.records  # stays off: the interface moved


def test_a_dump_that_raises_now_and_then_is_retried_and_one_that_keeps_raising_is_given_up():
    results = [RuntimeError("group being torn down"), dump_of(REAL)] + [RuntimeError("c10d says no")] * 3

    def dump():
        r = results.pop(0)
        if isinstance(r, Exception):
            raise r
        return r

    sink = Sink()
    src = FlightRecorderSource(lambda: dump, sink, FakeClock(), lambda: 0)
    assert src.poll() == 0 and not src.broken
    assert src.poll() == 2 and len(sink.records) == 2  # the next read works
    assert [src.poll() for _ in range(3)] == [0, 0, 0]
    assert "c10d says no" in src.broken and not results


def test_absent_flight_recorder_is_looked_for_quietly(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch._C._distributed_c10d", types.ModuleType("old_c10d"))
    assert flight_recorder.json_dumper() is None
    src = FlightRecorderSource(flight_recorder.json_dumper, Sink(), FakeClock(), lambda: 0)
    assert src.poll() == 0 and not src.broken  # torch may still be imported later


# -- against real torch -----------------------------------------------------------

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def gloo_mon(tmp_path, monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "ERROR")
    with installed(tmp_path / "run", heartbeat_interval_s=3600) as mon:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
        try:
            yield mon
        finally:
            dist.destroy_process_group()


def test_real_gloo_collectives_reach_the_slot(gloo_mon):
    dist.all_reduce(torch.ones(2, 3))
    dist.broadcast(torch.zeros(5, dtype=torch.int64), 0)
    assert gloo_mon.flight.poll(force=True) >= 2 and not gloo_mon.flight.broken
    sigs = [r.payload for r in records_of(read_monitor(gloo_mon), RecordKind.COLL_SIG)]
    last = [(p[0], CollOp(p[2]), p[3], wire.DTYPES[p[4]], wire.unpack_shape(p[6])) for p in sigs[-2:]]
    assert last == [(0, CollOp.ALL_REDUCE, 6, "float32", (2, 3)), (0, CollOp.BROADCAST, 5, "int64", (5,))]
    assert sigs[-1][1] == sigs[-2][1] + 1  # FR's per-group sequence


def test_dump_on_request_is_written_next_to_the_slot_by_the_background_poll(gloo_mon):
    dist.all_reduce(torch.ones(4))
    path = gloo_mon.slot_path
    seq = wire.write_control(path, None, Command.DUMP_FLIGHT_RECORDER, 0)
    gloo_mon._poll_background()  # what the heartbeat thread runs
    assert read_monitor(gloo_mon).header[wire.H_CTRL_ACK_SEQ] == seq
    assert read_monitor(gloo_mon).header[wire.H_CTRL_ACK_RESULT] == control.ACK_OK
    with open(wire.fr_dump_filename(path), "rb") as f:
        dump = json.load(f)  # JSON, never a pickle: the agent reads it
    assert {"entries", "version", "pg_config"} <= set(dump)
    assert dump["entries"][-1]["profiling_name"] == "gloo:all_reduce"


def test_off_by_configuration_nothing_is_read(tmp_path, monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WATCHDOG_FLIGHT_RECORDER", "0")
    with installed(tmp_path / "run", heartbeat_interval_s=3600) as mon:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
        try:
            dist.all_reduce(torch.ones(4))
            mon._poll_background()
            assert not records_of(read_monitor(mon), RecordKind.COLL_SIG)
        finally:
            dist.destroy_process_group()


def test_reads_are_held_to_a_share_of_wall_time():
    """A read of a full ring costs tens of ms holding the GIL part of the time: the
    next waits cost / DUTY, except when forced (exit, crash, a dump request)."""
    clock = FakeClock(0)
    calls = []

    def dump():
        calls.append(clock())
        clock.advance(10_000_000)  # this read took 10 ms
        return dump_of(REAL)

    src = FlightRecorderSource(lambda: dump, Sink(), clock, lambda: 0)
    src.poll()
    clock.advance(int(0.010 / flight_recorder.DUTY * 1e9) - 1_000)
    assert src.poll() == 0 and len(calls) == 1  # still inside the budget
    src.poll(force=True)
    assert len(calls) == 2
    clock.advance(int(0.010 / flight_recorder.DUTY * 1e9))
    src.poll()
    assert len(calls) == 3


def test_a_rank_waiting_in_a_collective_reads_at_once_within_the_budget(tmp_path, monkeypatch):
    """Once per wait longer than STUCK_READ_NS, whatever the budget says: that
    is the hang the coordinator will want the Flight Recorder for."""
    from watchdog.hook.completion import flight_recorder_reads

    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    clock = FakeClock()
    calls = []

    def dump():
        calls.append(clock())
        clock.advance(10_000_000)  # 10 ms a read: the budget then holds the next for 5 s
        return dump_of(REAL)

    with installed(tmp_path, clock=clock, patch_collectives=False, heartbeat_interval_s=3600) as mon:
        mon.flight._find, mon.flight._dump = (lambda: dump), None
        mon._poll_background()
        n = len(calls)
        with mon.collective("all_reduce"):
            clock.advance(flight_recorder_reads.STUCK_READ_NS // 2)
            mon._poll_background()
            assert len(calls) == n  # a short wait: the budget rules
            clock.advance(flight_recorder_reads.STUCK_READ_NS)
            mon._poll_background()
            assert len(calls) == n + 1  # stuck: read now
            clock.advance(flight_recorder_reads.STUCK_READ_NS)
            mon._poll_background()
            assert len(calls) == n + 1  # once per wait


def test_each_read_leaves_its_time_and_the_newest_collective_in_the_slot(tmp_path, monkeypatch):
    """The coordinator trusts a rank's Flight Recorder picture only if it was read
    after the stall began: every read, new entries or not, says when it was made."""
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    clock = FakeClock()
    dumps = [dump_of(REAL[:1]), dump_of(REAL), dump_of(REAL)]
    with installed(tmp_path, clock=clock, patch_collectives=False, heartbeat_interval_s=3600) as mon:
        mon.flight._find, mon.flight._dump = (lambda: lambda: dumps.pop(0)), None
        mon.flight._since = 0  # REAL's entries predate this monitor
        got = []
        for _ in range(3):
            t0 = clock()
            mon.flight.poll(force=True)
            h = read_monitor(mon).header
            got.append((h[wire.H_FR_NEWEST_GROUP], h[wire.H_FR_NEWEST_SEQ], h[wire.H_FR_READ_NS] == t0))
            clock.advance(1_000_000_000)
        assert got == [(0, 2, True), (0, 3, True), (0, 3, True)]  # the last read found nothing new, and says so
        assert not read_monitor(mon).torn


def test_a_rank_stalled_outside_any_collective_it_sees_reads_once_per_stall(tmp_path, monkeypatch):
    """A rank waiting in a collective issued from C++ (DDP's _pre_forward), or the
    rank stuck in its data loader that they wait for, looks like "in training
    code" to the marks: after STALL_READ_BEATS beats without a step or a new
    entry it reads at once, whatever the budget says, and only once."""
    from watchdog.hook.completion import flight_recorder_reads

    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    clock = FakeClock()
    calls = []
    entries = list(REAL)

    def dump():
        calls.append(clock())
        clock.advance(10_000_000)  # 10 ms a read: the budget then holds the next for 5 s
        return dump_of(entries)

    with installed(tmp_path, clock=clock, patch_collectives=False, heartbeat_interval_s=3600) as mon:
        mon.flight._find, mon.flight._dump = (lambda: dump), None
        beat = 500_000_000  # the beats are driven here: the monitor is told they come every 0.5 s
        mon.flight_reads.still_ns = flight_recorder_reads.STALL_READ_BEATS * beat
        mon.flight._since = 0  # REAL's entries predate this monitor

        def beats(n):
            for _ in range(n):
                clock.advance(beat)
                mon._poll_background()

        mon._poll_background()  # reads (the budget allows it) and sees the newest entry: a stall starts
        n = len(calls)
        beats(flight_recorder_reads.STALL_READ_BEATS - 1)
        assert len(calls) == n  # not yet a stall: the budget rules
        beats(1)
        assert len(calls) == n + 1  # stalled: read now
        beats(8)
        assert len(calls) == n + 1  # once per stall
        mon.step()  # progress: a new stall may get its own read later
        beats(flight_recorder_reads.STALL_READ_BEATS + 2)
        assert len(calls) == n + 2
        assert read_monitor(mon).header[wire.H_FR_READ_NS] == calls[-1]
