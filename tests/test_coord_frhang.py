"""Hang culprits from the Flight Recorder (coordinator/analysis/flight_recorder_blame.py through
health.analyze and collective_hang), on synthetic views built by the real fold.

Gap 1: a hang inside a collective issued from C++ (DDP's _pre_forward) that the
hook's marks cannot see: the ranks whose Flight Recorder holds #k wait, the
ranks behind it hold them up, but only a reading made after the wait began may
name anyone. Gap 2: on NCCL every rank holds #k; the ranks whose #k never
started on the GPU (or whose stream is stuck earlier) are the culprits; gloo's
"scheduled" forever never concludes anything.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.analysis.health import analyze
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors.collective_hang import CollectiveHang
from watchdog.coordinator.view.cluster import empty, fold

NOW = 100.0
# No warm-up allowance: these hangs happen in the first steps, which is the point.
CFG = DetectorConfig(hang_warmup_allowance_s=0.0)
DDP_INIT = (t.sig(1, age_s=22.0, op="broadcast"), t.sig(2, age_s=21.5, op="all_gather"), t.sig(3, age_s=21.0))
# DDP's _pre_forward broadcast (bucket rebuild), entered 10 s ago, invisible to the hook's marks.
PRE_FORWARD = t.sig(4, age_s=10.0, op="broadcast")


def _serve(raw: bytes) -> Callable[[], bytes]:
    """A dump call, as FlightRecorderSource's ``find`` hands one over, returning ``raw``."""
    return lambda: raw


def rank(r, colls=DDP_INIT, read_age=1.0, **kw):
    """A rank at step 0 that has made no progress for 20 s, in nothing the hook sees."""
    kw.setdefault("step", 0)
    kw.setdefault("step_age_s", 20.0)
    kw.setdefault("collective", t.coll())
    return t.rank(r, world_size=4, recent_colls=tuple(colls), fr_read_age_s=read_age, **kw)


def waiter(r, **kw):
    return rank(r, colls=(*DDP_INIT, PRE_FORWARD), **kw)


def loader(r, **kw):
    kw.setdefault("in_data_wait", True)
    kw.setdefault("data_wait_age_s", 19.0)
    return rank(r, **kw)


def findings(states, now=NOW):
    return CollectiveHang(CFG).check(now, t.view(states, now=now, cfg=CFG))


def blame(states, now=NOW):
    view = t.view(states, now=now, cfg=CFG)
    return analyze(view, now, CFG)


def test_the_rank_in_its_data_loader_is_named_not_the_ranks_in_ddps_broadcast():
    states = [waiter(0), loader(1), waiter(2), waiter(3)]
    b = blame(states)
    assert (b.source, b.how, b.group, b.seq, b.op) == ("flight_recorder", "missing", 0, 4, "broadcast")
    assert b.culprits == (1,) and b.waiters == (0, 2, 3)
    (f,) = findings(states)
    assert f.ranks == (1,) and f.wants_stacks == (1,)
    assert "never entered broadcast #4 on the default group (per the Flight Recorder)" in f.reason
    assert "ranks 0,2-3 waiting 10.0 s" in f.reason and "data loader" in f.reason
    assert f.evidence["source"] == "flight_recorder" and f.evidence["culprit_order"] == [1]


def test_without_the_flight_recorder_every_rank_was_named():
    """The behaviour this replaces, and the one kept when no rank has a reading."""
    states = [dataclasses.replace(s, recent_colls=(), fr_read_age_s=-1.0) for s in
              [waiter(0), loader(1), waiter(2), waiter(3)]]  # fmt: skip
    (f,) = findings(states)
    assert f.ranks == (0, 1, 2, 3) and "no rank is in a collective" in f.reason


@pytest.mark.parametrize(
    "read_age",
    [
        -1.0,  # never read
        15.0,  # read before the others entered #4 (10 s ago): it may have entered since
        10.2,  # read just after: inside the slack, not trusted to be after their entry
    ],
)
def test_a_picture_older_than_the_wait_names_nobody(read_age):
    states = [waiter(0), loader(1, read_age=read_age), waiter(2), waiter(3)]
    b = blame(states)
    assert b.how == "unproven" and b.culprits == () and b.unread == (1,)
    (f,) = findings(states)
    assert f.ranks == () and "nobody named" in f.reason and "rank 1 not in it" in f.reason


def test_only_what_fresh_pictures_prove_is_named():
    states = [waiter(0), loader(1), waiter(2), loader(3, read_age=30.0)]
    b = blame(states)
    assert b.culprits == (1,) and b.unread == (3,)
    assert findings(states)[0].ranks == (1,)


def test_the_rank_stuck_in_its_own_code_comes_before_a_failed_one():
    frozen = loader(0, heartbeat_age_s=12.0, in_data_wait=False, read_age=12.0)  # frozen: stale, named anyway
    states = [frozen, waiter(1), loader(2), waiter(3)]
    b = blame(states)
    assert b.culprits == (2, 0) and b.how == "missing"
    (f,) = [f for f in findings(states) if f.kind == "collective_hang"]
    assert f.ranks == (0, 2) and f.evidence["culprit_order"] == [2, 0]


def test_a_rank_that_keeps_stepping_is_not_what_they_wait_for():
    states = [waiter(0), loader(1, step=5, step_age_s=0.1), waiter(2), waiter(3)]
    b = blame(states)
    assert b is None or 1 not in b.culprits


def test_a_running_job_gets_no_flight_recorder_verdict():
    states = [rank(r, colls=(*DDP_INIT, PRE_FORWARD), step=40, step_age_s=0.05) for r in range(4)]
    assert blame(states) is None and findings(states) == []


def test_every_rank_in_the_same_collective_on_gloo_concludes_nothing():
    """All hold #4, gloo's states never move: no culprit from Flight Recorder
    states, the stalled-job finding as before (it names every live rank)."""
    states = [waiter(r) for r in range(4)]
    assert blame(states) is None
    (f,) = findings(states)
    assert "no rank is in a collective" in f.reason


def test_the_flight_recorder_clears_ranks_the_marks_call_missing():
    """Ranks 0 and 2 wait in a visible all-reduce (#7 for the Flight Recorder);
    rank 1 is in it too through a path the hook does not patch; rank 3 is in
    its data loader. The marks alone call 1 and 3 missing."""
    fr = (*DDP_INIT, t.sig(4, age_s=30.0), t.sig(5, age_s=20.0), t.sig(6, age_s=15.0))
    at7 = (*fr, t.sig(7, age_s=10.0))
    vis = {"collective": t.coll(seq=3, outstanding=1, since_s=10.0), "step": 3, "step_age_s": 14.0}
    states = [
        rank(0, colls=at7, **vis),
        rank(1, colls=at7, step=3, step_age_s=14.0, collective=t.coll(seq=2, done_seq=2)),
        rank(2, colls=at7, **vis),
        loader(3, colls=fr, step=3, step_age_s=14.0, collective=t.coll(seq=2, done_seq=2)),
    ]
    b = blame(states)
    assert b.culprits == (3,) and b.how == "missing"
    no_fr = [dataclasses.replace(s, recent_colls=(), fr_read_age_s=-1.0) for s in states]
    assert blame(no_fr).culprits == (1, 3)  # what the marks say without it


# -- gap 2: entered on CPU, not started on GPU (NCCL) ----------------------------


def nccl(r, k_state="started", earlier="completed", read_age=1.0, **kw):
    colls = (
        t.sig(5, age_s=12.0, state="completed"),
        t.sig(6, age_s=11.0, state=earlier),
        t.sig(7, age_s=10.0, state=k_state),
    )
    kw.setdefault("step", 30)
    kw.setdefault("step_age_s", 10.5)
    return rank(r, colls=colls, read_age=read_age, **kw)


def test_the_rank_whose_collective_never_started_on_the_gpu_is_named():
    states = [nccl(0), nccl(1, k_state="scheduled"), nccl(2), nccl(3)]
    b = blame(states)
    assert (b.how, b.culprits, b.waiters, b.seq) == ("not_started", (1,), (0, 2, 3), 7)
    (f,) = findings(states)
    assert f.ranks == (1,)
    assert "rank 1 entered on CPU, not started on GPU: all_reduce #7 on the default group" in f.reason
    assert "its #7 never started on the GPU while the others' did" in f.reason


def test_a_stream_stuck_on_an_earlier_kernel_is_named_with_where():
    states = [nccl(0), nccl(1), nccl(2, k_state="scheduled", earlier="started"), nccl(3)]
    b = blame(states)
    assert b.culprits == (2,) and b.how == "not_started"
    (f,) = findings(states)
    assert "stuck on an earlier collective that the others completed: all_reduce #6 on group 0, started" in f.reason


def test_gloo_states_never_conclude_not_started():
    """gloo leaves every entry 'scheduled': a rank is not blamed for it."""
    states = [nccl(r, k_state="scheduled", earlier="scheduled") for r in range(4)]
    states = [dataclasses.replace(s, recent_colls=tuple(dataclasses.replace(c, state="scheduled")
              for c in s.recent_colls)) for s in states]  # fmt: skip
    assert blame(states) is None
    (f,) = findings(states)
    assert "not started on GPU" not in f.reason


def test_a_stale_nccl_picture_names_nobody():
    states = [nccl(0), nccl(1, k_state="scheduled", read_age=10.4), nccl(2), nccl(3)]
    b = blame(states)
    assert b.how == "unproven" and b.culprits == () and b.unread == (1,)


def test_every_rank_started_and_none_completes_is_no_ones_fault():
    states = [nccl(r) for r in range(4)]
    assert blame(states) is None


def test_the_broadcast_root_waiting_for_the_loader_rank_is_not_named():
    """As seen on a real 3-rank job with a BatchNorm: DDP's _pre_forward broadcasts
    the buffers from rank 0 (#8, from C++). Rank 2 received them and went on to
    the gradient all-reduce (#9, which the hook sees); rank 0 still waits in #8
    for rank 1, which is in its data loader (#7). The marks alone name 0 and 1."""
    history = tuple(t.sig(s, age_s=20.0 - s) for s in range(1, 8))
    step = {"step": 3, "step_age_s": 12.0, "recent_steps": t.steps(1, 3, step_s=0.1)}
    states = [
        rank(0, colls=(*history, t.sig(8, age_s=11.0, op="broadcast")), collective=t.coll(seq=3, done_seq=3), **step),
        loader(1, colls=history, collective=t.coll(seq=3, done_seq=3), **step),
        rank(
            2,
            colls=(*history, t.sig(8, age_s=11.0, op="broadcast"), t.sig(9, age_s=10.5)),
            collective=t.coll(seq=4, outstanding=1, since_s=10.5, op="ddp_all_reduce"),
            **step,
        ),
    ]
    b = blame(states)
    assert b.culprits == (1,) and b.waiters == (2,) and b.how == "missing"
    (f,) = findings(states)
    assert f.ranks == (1,) and "data loader" in f.reason
    no_fr = [dataclasses.replace(s, recent_colls=(), fr_read_age_s=-1.0) for s in states]
    assert blame(no_fr).culprits == (0, 1)  # what the marks say without it


# -- the whole path: NCCL-shaped Flight Recorder dumps -> hook -> slot -> agent -> fold -> detector


def _nccl_entry(seq, state, created_s, op="nccl:all_reduce"):
    ns = int(created_s * 1e9)
    return {
        "collective_seq_id": seq,
        "process_group": ["0", "default_pg"],
        "profiling_name": op,
        "input_sizes": [[1024]],
        "input_dtypes": ["Float"],
        "state": state,
        "time_created_ns": ns,
        "time_discovered_started_ns": ns + 1000 if state != "scheduled" else None,
        "time_discovered_completed_ns": ns + 2000 if state == "completed" else None,
    }


def _host_report(dumps: dict[int, list[dict]], wall_s: float, mono_ns: int):
    """Each rank's hook reads its dump once (the real FlightRecorderSource into a
    real slot); the agent reads the slots into one host report."""
    import json

    from watchdog.agent import testing as at
    from watchdog.agent.processes.table import ProcSample
    from watchdog.agent.reporting.build import build_report
    from watchdog.agent.slotfiles import slot_states
    from watchdog.agent.slotfiles.local_rank import LocalRank
    from watchdog.contracts import slot as wire
    from watchdog.hook.completion.flight_recorder import FlightRecorderSource
    from watchdog.hook.slot.slotwriter import SlotWriter

    started = mono_ns - 20 * 10**9  # the slots were created (and the step began) 20 s ago
    ranks = []
    for r, entries in dumps.items():
        ident = at.identity("job", r, len(dumps), pid=1000 + r, proc_start_us=7, local_rank=r)
        slot = SlotWriter.format(bytearray(wire.slot_size(64)), ident, 64, wall_ns=0, mono_ns=started)
        slot.put(wire.H_STATUS, int(wire.Status.RUNNING))
        raw = json.dumps({"version": "2.10", "entries": entries}).encode()
        src = FlightRecorderSource(functools.partial(_serve, raw), slot.write_wide, lambda: mono_ns - 10**9,
                                   lambda: 30, mark=slot.write)  # fmt: skip
        assert src.poll(force=True) == len(entries)
        data = slot.copy()
        header = wire.decode_header(data[: wire.RING_OFFSET])
        recs = wire.decode_records(data[wire.RING_OFFSET :], 64, header[wire.H_RING_HEAD])
        proc = ProcSample(True, "running", cpu_seconds=1.0, rss_bytes=1 << 20, sampled_ns=mono_ns)
        ranks.append(
            LocalRank(
                f"/run/{r}.slot",
                header,
                mono_ns - 10**8,
                False,
                proc,
                slot_states.ALIVE,
                50.0,
                (),
                coll_records=tuple(recs),
            )
        )
    return build_report("job", "host0", "agent", 1, ranks, mono_ns, wall_s, 1.0)


def test_not_started_on_gpu_through_the_hook_the_agent_and_the_fold():
    wall, mono = 1_800_000_000.0, 5_000 * 10**9
    k = wall - 10.0  # every rank enqueued #7 ten seconds ago; rank 2's GPU never reached it
    dumps = {
        r: [_nccl_entry(6, "completed", k - 1.0), _nccl_entry(7, "scheduled" if r == 2 else "started", k)]
        for r in range(4)
    }
    view, _ = fold(empty("job"), _host_report(dumps, wall, mono), NOW, CFG)
    assert [c.state for c, _ in view.ranks[2].colls] == ["completed", "scheduled"]
    assert view.ranks[0].fr_read_at() == pytest.approx(NOW - 1.0)
    (f,) = CollectiveHang(CFG).check(NOW, view)
    assert f.ranks == (2,)
    assert "rank 2 entered on CPU, not started on GPU: all_reduce #7 on the default group" in f.reason

    gloo = {r: [{**e, "state": "scheduled"} for e in entries] for r, entries in dumps.items()}
    view, _ = fold(empty("job"), _host_report(gloo, wall, mono), NOW, CFG)
    (f,) = CollectiveHang(CFG).check(NOW, view)
    assert "not started on GPU" not in f.reason and f.ranks == (0, 1, 2, 3)  # the stalled-job finding, as before
