"""build_report: a pure function of hand-made slot snapshots and an explicit now."""

import json
from dataclasses import replace

import pytest

from watchdog import report as wire_report
from watchdog.agent import testing
from watchdog.agent.processes.table import GONE, ProcSample
from watchdog.agent.reporting.build import build_report, marks
from watchdog.agent.slotfiles import slot_states
from watchdog.agent.slotfiles.local_rank import LocalRank
from watchdog.contracts import slot as wire

S = 1_000_000_000
NOW = 1_000 * S
MS = 1_000_000


def view(
    rank=0,
    job="j",
    *,
    proc=None,
    state=slot_states.ALIVE,
    words=None,
    records=(),
    hb=NOW - S // 2,
    status=wire.Status.RUNNING,
    path=None,
):
    ident = testing.identity(job, rank, 4, pid=100 + rank, proc_start_us=7, local_rank=rank % 2)
    snap = testing.snapshot(
        ident,
        words,
        path=path or f"/run/{job}.{rank}.slot",
        wall_ns=1_700_000_000 * S,
        mono_ns=NOW - 100 * S,
        status=status,
    )
    proc = proc or ProcSample(True, "sleeping", cpu_seconds=12.5, rss_bytes=300 << 20, sampled_ns=NOW)
    return LocalRank(snap.path, snap.header, hb, False, proc, state, 87.5, tuple(records))


WORDS = {
    wire.H_STEP: 41,
    wire.H_STEP_START_NS: NOW - 250 * MS,
    wire.H_LAST_STEP_NS: 400 * MS,
    wire.H_LAST_DATA_NS: 50 * MS,
    wire.H_LAST_COLL_NS: 150 * MS,
    wire.H_PHASE: int(wire.Phase.CHECKPOINT),
    wire.H_PHASE_SINCE_NS: NOW - 3 * S,
    wire.H_PG_STATE: int(wire.PgState.JOINED),
    wire.H_PG_CHANGE_NS: NOW - 90 * S,
    wire.H_DATA_ENTER_NS: NOW - 2 * S,
    wire.H_DATA_EXIT_NS: NOW - 3 * S,  # waiting on data for 2 s
    wire.H_COLL_GROUP: 0,
    wire.H_COLL_SEQ: 1234,
    wire.H_COLL_DONE_SEQ: 1233,
    wire.H_COLL_OP: int(wire.CollOp.BARRIER),
    wire.H_COLL_BYTES: 4096,
    wire.H_COLL_ENTER_NS: NOW - 7 * S,
    wire.H_COLL_OUTSTANDING: 1,
    wire.H_HOOK_ERRORS: 2,
}


def test_rank_numbers():
    recs = [testing.step_record(i, i + 1, 400 * MS, 50 * MS, 150 * MS) for i in range(3)]
    rep = build_report("j", "host1", "agent1", 5, [view(words=WORDS, records=recs)], NOW, 1.8e9, 1.0)
    assert (rep.job, rep.host, rep.agent_id, rep.seq, rep.sent_wall, rep.interval_s) == (
        "j",
        "host1",
        "agent1",
        5,
        1.8e9,
        1.0,
    )
    (r,) = rep.ranks
    assert (r.rank, r.local_rank, r.world_size, r.pid, r.proc_start_us) == (0, 0, 4, 100, 7)
    assert r.alive and r.status == "running" and r.proc_status == "sleeping"
    assert r.step == 41
    assert r.step_age_s == pytest.approx(0.25)
    assert r.heartbeat_age_s == pytest.approx(0.5)
    assert (r.phase, r.phase_age_s) == ("checkpoint", pytest.approx(3.0))
    assert (r.pg_state, r.pg_age_s) == ("joined", pytest.approx(90.0))
    assert r.in_data_wait and r.data_wait_age_s == pytest.approx(2.0)
    assert r.coll.since_s == pytest.approx(7.0)
    assert replace(r.coll, since_s=7.0) == wire_report.CollectiveState(
        group=0, seq=1234, done_seq=1233, op="barrier", bytes=4096, outstanding=1, since_s=7.0
    )
    assert (r.last_step_s, r.last_data_s, r.last_coll_s) == (0.4, 0.05, 0.15)
    assert r.last_compute_s == pytest.approx(0.2)
    assert (r.hook_errors, r.cpu_percent, r.rss_bytes) == (2, 87.5, 300 << 20)
    assert r.created_wall == 1_700_000_000.0
    assert [s.step for s in r.recent_steps] == [1, 2, 3]
    assert r.recent_steps[0].compute_s == pytest.approx(0.2)


def test_round_trips_through_the_coordinators_parser():
    recs = [testing.step_record(0, 1, 400 * MS, 50 * MS, 150 * MS)]
    rep = build_report(
        "j",
        "h",
        "a",
        1,
        [view(words=WORDS, records=recs), view(rank=1)],
        NOW,
        1.8e9,
        1.0,
        accelerators=[{"index": 0, "name": "gpu"}],
    )
    again = wire_report.HostReport.from_dict(json.loads(json.dumps(rep.to_dict())))
    assert again == rep


def test_recent_steps_are_those_since_the_previous_report_and_capped():
    recs = [testing.step_record(i, i + 1, 100 * MS) for i in range(300)]
    v = view(records=recs[-wire_report.MAX_STEPS_PER_RANK :])
    first = build_report("j", "h", "a", 1, [v], NOW, 0.0, 1.0)
    assert len(first.ranks[0].recent_steps) == wire_report.MAX_STEPS_PER_RANK
    assert marks([v]) == {v.path: 300}
    again = build_report("j", "h", "a", 2, [v], NOW, 0.0, 1.0, since=marks([v]))
    assert again.ranks[0].recent_steps == ()
    partial = build_report("j", "h", "a", 2, [v], NOW, 0.0, 1.0, since={v.path: 297})
    assert [s.step for s in partial.ranks[0].recent_steps] == [298, 299, 300]


def test_one_job_per_report_and_dead_and_exited_ranks():
    views = [
        view(0, "a", proc=GONE, state=slot_states.DEAD),
        view(1, "a", proc=GONE, state=slot_states.EXITED, status=wire.Status.EXITED),
        view(0, "b"),
    ]
    rep = build_report("a", "h", "x", 1, views, NOW, 0.0, 1.0)
    assert [(r.rank, r.alive, r.status, r.proc_status) for r in rep.ranks] == [
        (0, False, "running", "gone"),
        (1, False, "exited", "gone"),
    ]


def test_zero_times_mean_never_not_epoch():
    (r,) = build_report("j", "h", "a", 1, [view()], NOW, 0.0, 1.0).ranks
    assert r.coll.since_s == 0.0 and r.data_wait_age_s == 0.0 and not r.in_data_wait and r.pg_state == "none"


def test_why_a_rank_died_travels_and_hostile_causes_are_refused():
    death = {
        "summary": "ZeroDivisionError: division by zero at train.py:120, exit 1",
        "exit_code": 1,
        "exception": {
            "type": "ZeroDivisionError",
            "message": "division by zero",
            "where": "train.py:120",
            "function": "f",
            "thread": "MainThread",
        },
        "traceback": "Traceback ...",
    }
    dead = replace(view(rank=1, proc=GONE, state=slot_states.DEAD), death=death)
    rep = build_report("j", "h", "a", 1, [dead], NOW, 1.8e9, 1.0)
    again = wire_report.HostReport.from_dict(json.loads(json.dumps(rep.to_dict())))
    assert again.ranks[0].death == death
    raw = json.loads(json.dumps(rep.to_dict()))
    bad: object
    for bad in ([], {"exit_code": "1"}, {"summary": 3}, {"exception": "x"}):
        raw["ranks"][0]["death"] = bad
        with pytest.raises(wire_report.ReportError, match="death"):
            wire_report.HostReport.from_dict(raw)
    raw["ranks"][0]["death"] = {"summary": "x" * 10_000, "newer_field": 1}
    assert wire_report.HostReport.from_dict(raw).ranks[0].death == {"summary": "x" * 2000}
    del raw["ranks"][0]["death"]  # an older agent
    assert wire_report.HostReport.from_dict(raw).ranks[0].death == {}


def test_bytes_split_and_batch_travel_and_survive_the_parser():
    recs = [
        testing.step_record(
            0, 1, 400 * MS, 50 * MS, 150 * MS, coll_bytes=8 << 20, split=(60 * MS, 120 * MS, 20 * MS, 0)
        )
    ]
    words = {**WORDS, wire.H_TOTAL_COLL_BYTES: 41 * (8 << 20), wire.H_BATCH_PER_RANK: 32}
    rep = build_report("j", "h", "a", 1, [view(words=words, records=recs)], NOW, 1.8e9, 1.0)
    (r,) = rep.ranks
    assert (r.coll_bytes_total, r.batch_per_rank) == (41 * (8 << 20), 32)
    (s,) = r.recent_steps
    assert s.coll_bytes == 8 << 20
    assert (s.forward_s, s.backward_s, s.optimizer_s, s.h2d_s) == (0.06, 0.12, 0.02, 0.0)
    assert wire_report.HostReport.from_dict(json.loads(json.dumps(rep.to_dict()))) == rep


def test_an_older_agents_report_without_the_new_fields_is_accepted():
    rep = build_report("j", "h", "a", 1, [view(words=WORDS, records=[testing.step_record(0, 1, 400 * MS)])], NOW, 0, 1)
    raw = json.loads(json.dumps(rep.to_dict()))
    for r in raw["ranks"]:
        del r["coll_bytes_total"], r["batch_per_rank"]
        for s in r["recent_steps"]:
            for k in ("coll_bytes", "forward_s", "backward_s", "optimizer_s", "h2d_s"):
                del s[k]
    assert wire_report.HostReport.from_dict(raw) == rep


def test_a_negative_split_drops_the_rank_not_the_host():
    rep = build_report("j", "h", "a", 1, [view(words=WORDS, records=[testing.step_record(0, 1, 400 * MS)])], NOW, 0, 1)
    raw = json.loads(json.dumps(rep.to_dict()))
    raw["ranks"][0]["recent_steps"][0]["backward_s"] = -1.0
    dropped: list[tuple[int, object, str]] = []
    assert wire_report.HostReport.from_dict(raw, dropped).ranks == ()
    assert "durations must be finite" in dropped[0][2]


def test_flight_recorder_signatures_are_reported_once_with_their_age_on_their_own_clock():
    from dataclasses import replace

    wall = 1_800_000_000 * S
    payload = (0, 9, int(wire.CollOp.ALL_REDUCE), 6, 1, 1, wire.pack_shape((2, 3)), wall - 2 * S, 0, 0, 2, 1)
    rec = wire.Record(index=5, kind=int(wire.RecordKind.COLL_SIG), t_ns=NOW, step=3, payload=payload)
    v = replace(view(), coll_records=(rec,))
    (c,) = build_report("j", "h", "a", 1, [v], NOW, wall / 1e9, 1.0).ranks[0].recent_colls
    assert (c.seq, c.op, c.elements, c.dtype, c.shape, c.state, c.clock) == (
        9,
        "all_reduce",
        6,
        "float32",
        (2, 3),
        "scheduled",
        "wall",
    )
    assert c.age_s == pytest.approx(2.0)
    assert marks([v]) == {v.path: 6}  # one mark for every kind of ring record
    again = build_report("j", "h", "a", 2, [v], NOW, wall / 1e9, 1.0, since=marks([v]))
    assert again.ranks[0].recent_colls == ()
    back = wire_report.HostReport.from_dict(json.loads(json.dumps(again.to_dict())))
    assert back.ranks[0].recent_colls == ()


def test_the_last_flight_recorder_read_travels_and_never_read_says_so():
    """When the hook last read its Flight Recorder decides whether the coordinator
    may name a rank from it: "never" must not read as "just now"."""
    words = {**WORDS, wire.H_FR_NEWEST_GROUP: 77, wire.H_FR_NEWEST_SEQ: 12, wire.H_FR_READ_NS: NOW - 3 * S}
    rep = build_report("j", "h", "a", 1, [view(words=words), view(1, words=WORDS)], NOW, 0, 1.0)
    read, never = rep.ranks
    assert (read.fr_read_age_s, read.fr_newest_group, read.fr_newest_seq) == (3.0, 77, 12)
    assert (never.fr_read_age_s, never.fr_newest_seq) == (-1.0, 0)
    assert wire_report.HostReport.from_dict(json.loads(json.dumps(rep.to_dict()))) == rep
    raw = json.loads(json.dumps(rep.to_dict()))
    for r in raw["ranks"]:  # an older agent
        del r["fr_read_age_s"], r["fr_newest_group"], r["fr_newest_seq"]
    assert [r.fr_read_age_s for r in wire_report.HostReport.from_dict(raw).ranks] == [-1.0, -1.0]


@pytest.mark.parametrize(
    "field,value", [("fr_read_age_s", -2.0), ("fr_read_age_s", float("inf")), ("fr_newest_seq", -1)]
)
def test_a_hostile_flight_recorder_read_drops_the_rank_not_the_host(field, value):
    rep = build_report("j", "h", "a", 1, [view(words=WORDS)], NOW, 0, 1.0)
    raw = json.loads(json.dumps(rep.to_dict()))
    raw["ranks"][0][field] = value
    dropped: list[tuple[int, object, str]] = []
    assert wire_report.HostReport.from_dict(raw, dropped).ranks == ()
    assert field in dropped[0][2]


def test_gpu_side_steps_are_reported_once_with_their_clock_and_survive_the_wire():
    from dataclasses import replace

    g = wire_report.GpuStep(step=41, step_s=0.141, data_s=0.002, coll_s=0.04, lag_s=0.131)
    v = replace(view(), gpu_steps=((12, g),), gpu_clock="gpu")
    rep = build_report("j", "h", "a", 1, [v], NOW, 0.0, 1.0)
    (r,) = rep.ranks
    assert r.recent_gpu == (g,) and r.gpu_clock == "gpu"
    raw = json.loads(json.dumps(rep.to_dict()))
    assert wire_report.HostReport.from_dict(raw).ranks[0].recent_gpu == (g,)
    assert marks([v]) == {v.path: (0, 13)}  # the event ring's own numbering
    again = build_report("j", "h", "a", 2, [v], NOW, 0.0, 1.0, since=marks([v]))
    assert again.ranks[0].recent_gpu == ()


@pytest.mark.parametrize("field, value", [("coll_s", -1.0), ("step_s", float("inf")), ("step", -3), ("lag_s", "x")])
def test_a_hostile_gpu_step_drops_only_its_rank(field, value):
    from dataclasses import replace

    g = wire_report.GpuStep(step=41, step_s=0.141, data_s=0.002, coll_s=0.04)
    raw = json.loads(
        json.dumps(build_report("j", "h", "a", 1, [replace(view(), gpu_steps=((1, g),))], NOW, 0.0, 1.0).to_dict())
    )
    raw["ranks"][0]["recent_gpu"][0][field] = value
    dropped: list[tuple[int, object, str]] = []
    assert wire_report.HostReport.from_dict(raw, dropped).ranks == ()
    assert "recent_gpu" in dropped[0][2]


@pytest.mark.parametrize(
    ("frame_step", "sent"),
    [
        (42, True),  # sampled in the step in progress (41 completed): where the rank is now
        (30, False),  # an old step's sample, still in the words: not sent on
        (None, False),  # never sampled (or an older hook)
    ],
)
def test_the_frame_travels_while_its_step_lasts(frame_step, sent):
    words = dict(WORDS)
    if frame_step is not None:
        words.update(zip(range(wire.P_FRAME_STEP, wire.P_FRAME_STEP + wire.FRAME_WORDS),
                         wire.encode_frame(frame_step, NOW - S, "upload_metrics (train.py:21)")))  # fmt: skip
    rep = build_report("j", "h", "a", 1, [view(words=words)], NOW, 1.8e9, 1.0)
    (r,) = wire_report.HostReport.from_dict(json.loads(json.dumps(rep.to_dict()))).ranks
    want = ("upload_metrics (train.py:21)", 42) if sent else ("", 0)
    assert (r.frame, r.frame_step) == want
