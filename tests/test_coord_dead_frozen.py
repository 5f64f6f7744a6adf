"""dead_rank and frozen_rank: fire on the root cause, never on its victims."""

from __future__ import annotations

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors.collective_hang import CollectiveHang
from watchdog.coordinator.detectors.dead_rank import DeadRank
from watchdog.coordinator.detectors.frozen_rank import FrozenRank
from watchdog.coordinator.detectors.wedged import Wedged
from watchdog.coordinator.testing import SimJob
from watchdog.coordinator.view.cluster import fold
from watchdog.report import RankState

CFG = DetectorConfig()
WAIT = t.coll(seq=101, outstanding=1, since_s=2.0)  # inside all_reduce #101 for 2 s
IDLE = t.coll(seq=100, done_seq=100)


def dead(r: int, **kw):
    return t.rank(r, alive=False, proc_status="gone", **kw)


def keys(findings):
    return sorted((f.kind, f.ranks) for f in findings)


DEAD_CASES = [
    ("sigkill", t.with_rank(t.healthy(), 3, alive=False), [("dead_rank", (3,))]),
    ("clean exit is not a death", t.with_rank(t.healthy(), 3, alive=False, status="exited"), []),
    ("healthy", t.healthy(), []),
    ("disabled hook, process alive", t.with_rank(t.healthy(), 3, status="disabled", heartbeat_age_s=60.0), []),
    (
        "victims died waiting in the collective the dead rank never entered",
        [
            dead(r, collective=WAIT, step_age_s=2.5) if r != 3 else dead(3, collective=IDLE, step_age_s=2.5)
            for r in range(8)
        ],
        [("dead_rank", (3,))],
    ),
    (
        "died inside the collective: no one to blame but itself",
        [dead(3, collective=WAIT, step_age_s=2.5)]
        + [t.rank(r, collective=WAIT, step_age_s=2.5) for r in range(8) if r != 3],
        [("dead_rank", (3,))],
    ),
]


@pytest.mark.parametrize("name,states,want", DEAD_CASES, ids=[c[0] for c in DEAD_CASES])
def test_dead_rank_table(name, states, want):
    v = t.view(states, now=100.0)
    assert keys(DeadRank(CFG).check(100.5, v)) == want


def test_dead_rank_reason_names_rank_host_pid_and_place():
    v = t.view(t.with_rank(t.healthy(), 3, alive=False, in_data_wait=True, data_wait_age_s=1.0, step=811), now=100.0)
    (f,) = DeadRank(CFG).check(100.5, v)
    assert f.hosts == ("host0",) and f.evidence["pids"] == {"3": 1003}
    assert f.reason.startswith("rank 3 (host host0, pid 1003) died: process gone")
    assert "in the data loader" in f.reason and "step 811" in f.reason


def test_ordered_deaths_blame_only_the_first():
    """torchrun SIGTERMs the others ~0.1 s after the first death, mid-compute
    (not in a collective): the agent's death times still order them."""
    v = t.view(t.healthy(), now=100.0)
    states = [dead(r, gone_age_s=0.5 if r == 3 else 0.38) for r in range(8)]
    v = t.view(states, now=101.0, base=v, seq=2)
    (f,) = DeadRank(CFG).check(101.2, v)
    assert f.ranks == (3,) and f.evidence["followers"] == [0, 1, 2, 4, 5, 6, 7]


def test_deaths_that_cannot_be_ordered_are_named_together():
    v = t.view(t.healthy(), now=100.0)
    v = t.view([dead(r) if r in (1, 2) else t.rank(r) for r in range(8)], now=101.0, base=v, seq=2)
    (f,) = DeadRank(CFG).check(101.2, v)
    assert f.ranks == (1, 2) and "order unknown" in f.reason


def test_a_death_waits_for_the_other_hosts_to_be_heard():
    """host1 reports rank 5 dead before host0 (holding an earlier death) reports."""
    v = t.view(t.healthy(), now=100.0)
    v, _ = fold(
        v, t.report("host1", [dead(r, gone_age_s=0.1) if r == 5 else t.rank(r) for r in range(4, 8)], seq=2), 100.6, CFG
    )
    assert DeadRank(CFG).check(100.7, v) == []  # host0 not heard from since rank 5 died
    v, _ = fold(
        v, t.report("host0", [dead(r, gone_age_s=0.8) if r == 3 else t.rank(r) for r in range(4)], seq=2), 101.0, CFG
    )
    (f,) = DeadRank(CFG).check(101.1, v)
    assert f.ranks == (3,) and f.evidence["followers"] == [5]


def test_patience_has_a_limit():
    v = t.view(t.healthy(), now=100.0)
    v, _ = fold(
        v, t.report("host1", [dead(r, gone_age_s=0.1) if r == 5 else t.rank(r) for r in range(4, 8)], seq=2), 100.6, CFG
    )
    # host0 went quiet before rank 5 died: its silence is judged first (lost: its ranks would be
    # the earlier death), so patience runs to the silence limit; unobserved, rank 5 is named.
    assert DeadRank(CFG).check(102.2, v) == []
    assert [f.ranks for f in DeadRank(CFG).check(105.1, v)] == [(5,)]


def test_peers_failing_at_once_when_a_host_is_killed_are_not_blamed_before_its_silence_is_judged():
    """A host killed for real (agent and ranks together): gloo fails its peers within a
    second, inside the all-reduce they shared, and their host reports those deaths first.
    The peers are victims; the silent host is the root cause once its silence is judged."""
    inside = t.coll(seq=101, outstanding=1, since_s=0.01)
    v = t.view([t.rank(r, collective=inside) for r in range(8)], now=100.0)
    peers = [dead(r, gone_age_s=0.1, collective=inside) if r == 1 else t.rank(r, collective=inside) for r in range(4)]
    for at in (100.5, 101.0, 101.5, 102.0, 102.5, 103.0, 103.5, 104.0, 104.5, 105.0):
        v, _ = fold(v, t.report("host0", peers, seq=int(at * 2)), at, CFG)
        named = DeadRank(CFG).check(at + 0.05, v)
        assert all(f.ranks != (1,) for f in named), (at, [(f.ranks, f.reason) for f in named])
    (f,) = DeadRank(CFG).check(105.2, v)
    assert f.ranks == (4, 5, 6, 7) and f.hosts == ("host1",) and "host host1 lost" in f.reason, f.reason


def test_host_lost_names_host_and_all_its_ranks():
    """Silent, and the peers wait without progress in a collective its ranks were
    not seen entering (analysis/silence.py): its ranks are taken for dead."""
    states = [t.rank(r, step=100) for r in range(4, 8)] + [
        t.rank(r, collective=t.coll(seq=101, outstanding=1, since_s=6.0), step_age_s=7.0) for r in range(4)
    ]
    v = t.view(states, now=93.0, received={"host1": 95.0, "host0": 100.0})
    (f,) = DeadRank(CFG).check(100.5, v)
    assert f.ranks == (4, 5, 6, 7) and f.hosts == ("host1",)
    assert f.reason.startswith("host host1 lost: no report from its agent for 5.5 s")
    assert "peers waiting in all_reduce #101" in f.reason and f.evidence["lost_on"] == "peers_waiting"
    assert DeadRank(CFG).check(99.0, v) == []  # silent 4 s < 5 intervals


def test_silent_host_whose_ranks_all_exited_is_the_job_ending():
    states = [t.rank(r, status="exited", alive=False) if r >= 4 else t.rank(r) for r in range(8)]
    v = t.view(states, now=100.0, received={"host1": 80.0})
    assert DeadRank(CFG).check(100.0, v) == []


def test_restarted_rank_is_not_dead():
    v = t.view(t.with_rank(t.healthy(), 3, alive=False), now=100.0)
    assert DeadRank(CFG).check(100.0, v)
    v = t.view([t.rank(3, pid=9999, proc_start_us=1_800_000_000_000_000, step=0)], now=101.0, base=v, seq=2)
    assert DeadRank(CFG).check(101.0, v) == []


def test_sim_kill_with_torchrun_teardown_blames_the_killed_rank():
    sim = SimJob(jitter=0.1)
    sim.kill(3, at_step=50, victims_die_after=0.1)
    found: dict[tuple[int, ...], float] = {}
    for i in range(1, 41):
        now = i * 0.5
        for f in DeadRank(CFG).check(now, sim.run_until(now)):
            found.setdefault(f.ranks, now)
    assert list(found) == [(3,)]


FROZEN_CASES = [
    (
        "sigstop: stale heartbeat",
        t.with_rank(t.healthy(), 2, heartbeat_age_s=4.0, cpu_percent=0.0),
        [("frozen_rank", (2,))],
    ),
    (
        "os says stopped: a third of the threshold",
        t.with_rank(t.healthy(), 2, heartbeat_age_s=1.5, proc_status="stopped"),
        [("frozen_rank", (2,))],
    ),
    ("fresh heartbeat", t.with_rank(t.healthy(), 2, heartbeat_age_s=2.0), []),
    ("hook disabled itself", t.with_rank(t.healthy(), 2, heartbeat_age_s=60.0, status="disabled"), []),
    ("dead is not frozen", t.with_rank(t.healthy(), 2, heartbeat_age_s=60.0, alive=False), []),
    ("clean exit", t.with_rank(t.healthy(), 2, heartbeat_age_s=60.0, status="exited"), []),
    (
        "waiters froze (GIL-holding wait) after the culprit froze outside it",
        [
            t.rank(r, heartbeat_age_s=4.0, collective=WAIT, step_age_s=5.0)
            if r != 2
            else t.rank(2, heartbeat_age_s=5.0, collective=IDLE, step_age_s=5.0)
            for r in range(8)
        ],
        [("frozen_rank", (2,))],
    ),
]


@pytest.mark.parametrize("name,states,want", FROZEN_CASES, ids=[c[0] for c in FROZEN_CASES])
def test_frozen_rank_table(name, states, want):
    assert keys(FrozenRank(CFG).check(100.0, t.view(states, now=100.0))) == want


def test_frozen_judged_on_the_agents_reading_not_on_a_late_report():
    v = t.view(t.healthy(), now=100.0)
    assert FrozenRank(CFG).check(104.0, v) == []  # report 4 s old: the host's problem, not a frozen rank


def test_frozen_reason_tells_spinning_from_stopped():
    v = t.view(t.with_rank(t.healthy(), 2, heartbeat_age_s=4.0, cpu_percent=100.0), now=100.0)
    (f,) = FrozenRank(CFG).check(100.0, v)
    assert "holding the GIL" in f.reason and f.wants_stacks == (2,)


def test_sim_sigstop_names_the_stopped_rank_only():
    sim = SimJob(jitter=0.1)
    sim.stop(5, at_step=40)
    found: dict[tuple[int, ...], float] = {}
    for i in range(1, 61):
        now = i * 0.5
        for f in FrozenRank(CFG).check(now, sim.run_until(now)):
            found.setdefault(f.ranks, now)
    assert list(found) == [(5,)]
    stop_t = sim.steps[40].start
    assert found[(5,)] - stop_t < CFG.frozen_heartbeat_s + 1.5


def test_dead_rank_reason_says_why_it_died():
    oom = {
        "summary": "exit -9 (SIGKILL), OOM-killed by the kernel (cgroup memory.events oom_kill 0 -> 1)",
        "exit_code": -9,
        "signal": "SIGKILL",
        "oom": "cgroup memory.events oom_kill 0 -> 1",
    }
    v = t.view(t.with_rank(t.healthy(), 1, alive=False, death=oom), now=100.0)
    (f,) = DeadRank(CFG).check(100.5, v)
    assert f.reason.startswith(
        "rank 1 (host host0, pid 1001) died: exit -9 (SIGKILL), OOM-killed by the kernel "
        "(cgroup memory.events oom_kill 0 -> 1), last seen"
    ), f.reason
    assert f.evidence["death"] == {"1": oom}


def test_deaths_named_together_say_each_cause_once():
    exc = {"summary": "RuntimeError: Connection closed by peer at train.py:88, exit 1"}
    v = t.view(t.healthy(), now=100.0)
    v = t.view(
        [
            dead(r, death=exc if r == 2 else {"summary": "exit -9 (SIGKILL)"}) if r in (1, 2, 3) else t.rank(r)
            for r in range(8)
        ],
        now=101.0,
        base=v,
        seq=2,
    )
    (f,) = DeadRank(CFG).check(101.2, v)
    assert f.ranks == (1, 2, 3), f
    assert f.reason.endswith(
        "; ranks 1,3: exit -9 (SIGKILL); rank 2: RuntimeError: Connection closed by peer at train.py:88, exit 1"
    ), f.reason


def test_a_crashing_rank_still_shutting_down_says_why_its_heartbeat_stopped():
    exc = {"summary": "ZeroDivisionError: float division by zero at train_ddp.py:104"}
    v = t.view(t.with_rank(t.healthy(), 1, status="failed", heartbeat_age_s=4.0, death=exc), now=100.0)
    (f,) = FrozenRank(CFG).check(100.5, v)
    assert f.ranks == (1,)
    assert (
        "exiting after an uncaught exception (ZeroDivisionError: float division by zero at train_ddp.py:104)"
        in f.reason
    ), f.reason


def stopped(r: int, age: float, **kw) -> RankState:
    return t.rank(r, heartbeat_age_s=age, proc_status="stopped", cpu_percent=0.0, **kw)


def test_ranks_stopped_together_are_one_finding_that_says_so():
    """A scheduler's suspend stops every rank of two hosts in one instant: one
    finding names them all, with one line's worth of reason and evidence."""
    states = [stopped(r, 4.0 + 0.05 * (r % 3), world_size=12) for r in range(8)]
    states += [t.rank(r, world_size=12) for r in range(8, 12)]  # host2 runs on (the whole job: wedged)
    (f,) = FrozenRank(CFG).check(100.0, t.view(states, now=100.0))
    assert f.ranks == tuple(range(8)) and f.hosts == ("host0", "host1")
    assert f.reason.startswith(
        "ranks 0-7 (8 ranks on 2 hosts) froze together: processes alive, heartbeats stopped within 100 ms"
    )
    assert "ranks 0-7: stopped by a signal" in f.reason
    assert f.onset_mono == pytest.approx(95.9) and f.evidence["ranks_total"] == 8
    assert f.evidence["proc_status"] == "stopped" and f.evidence["stopped_within_s"] == pytest.approx(0.1)
    assert f.wants_stacks == (2, 5, 1, 4, 7, 0, 3, 6)  # the earliest stopped first


def test_ranks_that_froze_apart_are_named_apart():
    states = t.with_rank(t.with_rank(t.healthy(), 1, heartbeat_age_s=8.0), 6, heartbeat_age_s=4.0)
    assert keys(FrozenRank(CFG).check(100.0, t.view(states, now=100.0))) == [
        ("frozen_rank", (1,)),
        ("frozen_rank", (6,)),
    ]


def test_a_group_waits_for_a_rank_that_may_have_stopped_with_it():
    """Rank 5 stopped with rank 1, but host1 last reported before it could look
    frozen: naming rank 1 alone now would open a second finding for rank 5 next."""
    states = [stopped(1, 2.0) if r == 1 else t.rank(r) for r in range(4)]
    before = t.view(
        states + [stopped(5, 1.0) if r == 5 else t.rank(r) for r in range(4, 8)],
        received={"host0": 98.0, "host1": 97.0},
    )
    assert FrozenRank(CFG).check(98.0, before) == []
    after = t.view([stopped(5, 2.2) if r == 5 else t.rank(r) for r in range(4, 8)], now=98.2, base=before, seq=2)
    (f,) = FrozenRank(CFG).check(98.2, after)
    assert f.ranks == (1, 5) and "froze together" in f.reason
    # A host that stays silent is waited for 1.5 report intervals, no longer: rank 1 is named alone.
    assert keys(FrozenRank(CFG).check(99.2, before)) == [("frozen_rank", (1,))]


def test_a_rank_is_not_waited_for_once_its_heartbeat_beat_after_the_stop():
    """host1 reported before rank 1 could look frozen, but each of its ranks beat
    after rank 1 stopped: none stopped with it, so rank 1 is named at once."""
    states = [stopped(1, 2.0) if r == 1 else t.rank(r) for r in range(4)]
    late = [t.rank(r, heartbeat_age_s=0.2) for r in range(4, 8)]  # last beat 96.8: after 96.0 + 0.6
    v = t.view(states + late, received={"host0": 98.0, "host1": 97.0})
    assert keys(FrozenRank(CFG).check(98.0, v)) == [("frozen_rank", (1,))]


def test_sim_whole_job_stopped_at_once_is_one_wedge_and_no_rank():
    sim = SimJob(jitter=0.1)
    for r in range(8):
        sim.stop(r, at_step=40)
    found: dict[tuple[str, tuple[int, ...]], float] = {}  # (kind, ranks): when first found
    for i in range(1, 61):
        now = i * 0.5
        view = sim.run_until(now)
        for det in (FrozenRank(CFG), CollectiveHang(CFG), Wedged(CFG)):
            for f in det.check(now, view):
                found.setdefault(f.key, now)
    assert list(found) == [("wedged", ())]
    assert found["wedged", ()] - sim.steps[40].start < CFG.frozen_heartbeat_s + 1.5


@pytest.mark.parametrize(
    "proc,want",
    [
        # rank 0 holds the GIL in its own code; rank 1, waiting in the all-reduce rank 0 never
        # entered, froze 0.5 s later (a DDP waiter of an unmodified script does): rank 0's
        ("sleeping", [("frozen_rank", (0,))]),
        # both stopped (a scheduler's suspend), wherever they were: nobody's
        ("stopped", [("wedged", ())]),
    ],
)
def test_a_rank_frozen_running_outside_the_collective_its_peer_froze_in_is_no_wedge(proc, want):
    states = [  # heartbeats stopped 0.4 s apart: together, by the heartbeat's 0.5 s
        t.rank(0, world_size=2, heartbeat_age_s=3.6, collective=IDLE, cpu_percent=0.0, proc_status=proc),
        t.rank(
            1, world_size=2, heartbeat_age_s=3.2, collective=WAIT, step_age_s=2.5, cpu_percent=0.0, proc_status=proc
        ),
    ]
    v = t.view(states, now=100.0, ranks_per_host=2)
    found = [f for det in (FrozenRank(CFG), Wedged(CFG)) for f in det.check(100.0, v)]
    assert keys(found) == want
