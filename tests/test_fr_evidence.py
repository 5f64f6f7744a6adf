"""Flight Recorder dumps as evidence: the agent's collection through the slot,
the validation of what it sends, and the per-rank files PyTorch's analyzer reads."""

from __future__ import annotations

import json
import logging

import pytest

from watchdog.agent.command_channel import flight_recorder_dump
from watchdog.contracts.evidence import MAX_FR_ENTRIES, FlightRecorderDump
from watchdog.contracts.journal import Record, parse
from watchdog.hook.slot.control_block import ACK_NO_HANDLER, ACK_OK
from watchdog.timeline import flight_recorder


def entry(seq: int, size: int = 4, **kw) -> dict:
    """An entry as torch 2.13 dumps it on gloo (JSON)."""
    return {
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": ["0", "default_pg"],
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": "gloo:all_reduce",
        "time_created_ns": 1796072125950477992 + seq,
        "input_sizes": [[size]],
        "input_dtypes": ["Float"],
        "output_sizes": [[size]],
        "output_dtypes": ["Float"],
        "state": "scheduled",
        "time_discovered_started_ns": 0,
        "time_discovered_completed_ns": 0,
        "retired": True,
        "timeout_ms": 1800000,
        "is_p2p": False,
        "thread_name": "python",
        "thread_id": "1",
        **kw,
    }


def dump_json(n: int, world: int = 2) -> bytes:
    pg = {"": {"name": "", "desc": "", "ranks": str(list(range(world)))}}  # what gloo writes
    return json.dumps(
        {"version": "2.10", "pg_config": pg, "pg_status": {}, "entries": [entry(s) for s in range(1, n + 1)]}
    ).encode()


# -- the agent's side -------------------------------------------------------------


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_collect_asks_everyone_then_reads_each_answer(tmp_path):
    acks = {"/s0": (0, 0), "/s1": (0, 0), "/s2": (0, 0)}
    files = {"/s0.fr": dump_json(5), "/s1.fr": dump_json(4)}
    clock = Clock()

    def answer_later(path, seq, result):
        def request():
            acks[path] = (seq, result)  # the hook acks at once here; a frozen one never does
            return seq

        return request

    asks = [
        (0, 100, "/s0", answer_later("/s0", 7, ACK_OK)),
        (1, 101, "/s1", answer_later("/s1", 3, ACK_OK)),
        (2, 102, "/s2", lambda: 9),  # never acknowledged
    ]
    got = flight_recorder_dump.collect(
        asks, "h", ack_of=acks.__getitem__, clock=clock, sleep=clock.sleep, read=files.__getitem__, wall=lambda: 5.0
    )
    assert [(d.rank, d.ok, len(d.entries)) for d in got] == [(0, True, 5), (1, True, 4), (2, False, 0)]
    assert "no answer from the hook within 3 s" in got[2].error
    assert clock.t == pytest.approx(
        flight_recorder_dump.DEADLINE_S, abs=flight_recorder_dump.POLL_S * 2
    )  # one shared deadline


def test_collect_reports_a_rank_without_flight_recorder_and_a_bad_file():
    acks = {"/a": (1, ACK_NO_HANDLER), "/b": (1, ACK_OK)}
    got = flight_recorder_dump.collect(
        [(0, 1, "/a", lambda: 1), (1, 2, "/b", lambda: 1)],
        "h",
        ack_of=acks.__getitem__,
        read=lambda p: b"\x80\x04not json",
    )
    assert not got[0].ok and "no Flight Recorder" in got[0].error
    assert not got[1].ok and "cannot read /b.fr" in got[1].error


def test_a_request_that_cannot_be_written_is_an_error_not_a_wait():
    def refuse():
        raise OSError("read-only")

    (d,) = flight_recorder_dump.collect([(0, 1, "/a", refuse)], "h", ack_of=lambda p: (0, 0))
    assert not d.ok and "read-only" in d.error


def test_the_dump_file_is_never_followed_through_a_symlink(tmp_path):
    target = tmp_path / "secret"
    target.write_text("x")
    (tmp_path / "s.slot.fr").symlink_to(target)
    with pytest.raises(OSError):
        flight_recorder_dump.read_dump_file(str(tmp_path / "s.slot.fr"))


def test_fit_halves_entries_keeping_the_newest():
    dumps = [FlightRecorderDump.from_json(dump_json(64), "h", r, r, 0.0) for r in range(4)]
    small = flight_recorder_dump.fit(dumps, 40_000)
    assert len(json.dumps([d.to_dict() for d in small])) <= 40_000
    assert small[0].entries[-1]["collective_seq_id"] == 64 and small[0].entries_dropped > 0


# -- what the coordinator accepts --------------------------------------------------


def test_hostile_entries_lose_their_bad_fields_or_are_dropped_and_counted():
    d = {
        "host": "h",
        "rank": 0,
        "pid": 1,
        "ok": True,
        "entries": [
            entry(1, frames=[{"huge": "x" * 10**6}], input_sizes=[[[[[1]]]]]),  # unknown field, too deep
            {"collective_seq_id": "2", "profiling_name": "x"},  # no usable sequence number
            entry(3, state="s" * 10_000),
        ],
    }
    got = FlightRecorderDump.from_dict(d)
    assert [e["collective_seq_id"] for e in got.entries] == [1, 3] and got.entries_dropped == 1
    assert "frames" not in got.entries[0] and "input_sizes" not in got.entries[0] and "state" not in got.entries[1]
    for bad in ({"rank": "0"}, {"entries": "x"}, {"ok": 1}):
        with pytest.raises((TypeError, ValueError)):
            FlightRecorderDump.from_dict({**d, **bad})


def test_only_the_newest_entries_are_kept():
    got = FlightRecorderDump.from_json(dump_json(MAX_FR_ENTRIES + 10), "h", 0, 1, 0.0)
    assert len(got.entries) == MAX_FR_ENTRIES and got.entries_dropped == 10
    assert got.entries[-1]["collective_seq_id"] == MAX_FR_ENTRIES + 10


# -- the timeline's files, read by PyTorch's own analyzer ------------------------------


def evidence(dumps: list[FlightRecorderDump]) -> Record:
    return parse(
        {
            "event": "evidence",
            "t_wall": 10.0,
            "trigger": {"kind": "collective_hang", "ranks": [1]},
            "host": "h",
            "flight_recorder": [d.to_dict() for d in dumps],
        }
    )


def test_gloos_unnamed_default_group_is_named_for_the_analyzer():
    d = FlightRecorderDump.from_json(dump_json(3), "h", 0, 1, 0.0)
    assert flight_recorder.analyzer_dump(d)["pg_config"] == {
        "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}
    }


def test_text_marks_the_rank_whose_last_collective_differs():
    sets = flight_recorder.collect(
        [evidence([FlightRecorderDump.from_json(dump_json(n, 3), "h", r, r, 0.0) for r, n in enumerate((5, 4, 5))])]
    )
    out = "\n".join(flight_recorder.lines(sets))
    assert "rank 1 (host h): last #4 gloo:all_reduce [[4]] Float scheduled (4 entries) <- differs" in out
    assert (
        "rank 0 (host h): last #5" in out
        and "rank 0 (host h): last #5 gloo:all_reduce [[4]] Float scheduled (5 entries)\n" in out + "\n"
    )


def test_pytorchs_analyzer_reads_what_we_write(tmp_path, caplog):
    fr_trace = pytest.importorskip("torch.distributed.flight_recorder.fr_trace")
    # rank 1 never issued collective #5: the analyzer must say so from our files
    dumps = [FlightRecorderDump.from_json(dump_json(n), "h", r, 100 + r, 0.0) for r, n in ((0, 5), (1, 4))]
    (d,) = flight_recorder.write_dirs(flight_recorder.collect([evidence(dumps)]), str(tmp_path))
    with caplog.at_level(logging.INFO, logger="Flight Recorder"):
        fr_trace.main([d, "-p", flight_recorder.PREFIX])
    out = caplog.text
    assert "Not all ranks joining collective, sequence number: 5" in out
    assert "missing ranks: {1}" in out
