"""collective_hang: adaptive deadline, allowances, and the right culprit."""

from __future__ import annotations

from dataclasses import replace

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.analysis import health
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors.collective_hang import CollectiveHang, hang_state
from watchdog.coordinator.detectors.dead_rank import DeadRank
from watchdog.coordinator.detectors.frozen_rank import FrozenRank
from watchdog.coordinator.detectors.host_unobserved import HostUnobserved
from watchdog.coordinator.testing import SimJob
from watchdog.coordinator.view import columns

CFG = DetectorConfig()
HISTORY = t.steps(1, 50, step_s=0.1)  # 0.1 s steps: the floor (5 s) is the deadline


def waiting(r, since=12.4, seq=812, **kw):
    kw.setdefault("recent_steps", HISTORY)
    return t.rank(r, step=811, step_age_s=since + 0.05, collective=t.coll(seq=seq, outstanding=1, since_s=since), **kw)


def stuck(r, age=12.9, **kw):
    kw.setdefault("recent_steps", HISTORY)
    return t.rank(r, step=811, step_age_s=age, collective=t.coll(seq=811, done_seq=811), **kw)


def job(culprit=3, waiter_kw=None, culprit_kw=None, world=8):
    return [stuck(r, **(culprit_kw or {})) if r == culprit else waiting(r, **(waiter_kw or {})) for r in range(world)]


def run(states, now=100.0):
    return CollectiveHang(CFG).check(now, t.view(states, now=now))


def test_realistic_hang_reason():
    (f,) = run(job(culprit_kw={"in_data_wait": True, "data_wait_age_s": 12.9}))
    assert f.kind == "collective_hang" and f.ranks == (3,) and f.hosts == ("host0",)
    assert f.reason == (
        "rank 3 (host host0, pid 1003) never entered all_reduce #812 on the default group; "
        "ranks 0-2,4-7 waiting 12.4 s; rank 3 last seen in the data loader (waiting 12.9 s) at step 811, "
        "heartbeat fresh (200 ms)"
    )
    assert f.wants_stacks == (3,)
    assert f.evidence["culprits"]["3"]["in_data_wait"] is True and f.evidence["waiters"] == [0, 1, 2, 4, 5, 6, 7]
    assert f.onset_mono == pytest.approx(100.0 - 12.45)  # the last progress: the waiters finished step 811


CASES = [
    ("under the floor", job(waiter_kw={"since": 4.0}, culprit_kw={"age": 4.5}), []),
    ("healthy", [t.rank(r, recent_steps=HISTORY) for r in range(8)], []),
    ("culprit in eval phase", job(culprit_kw={"phase": "eval"}), []),
    (
        "everyone in checkpoint, rank 0 saving while the rest sit in a barrier",
        [stuck(0, age=60.0, phase="checkpoint")] + [waiting(r, since=59.0, phase="checkpoint") for r in range(1, 8)],
        [],
    ),
    ("first steps: no history yet", job(waiter_kw={"recent_steps": ()}, culprit_kw={"recent_steps": ()}), []),
    ("init phase", job(culprit_kw={"phase": "init"}), []),
    ("culprit exited early (uneven inputs)", job(culprit_kw={"status": "exited", "alive": False}), [(3,)]),
    ("culprit frozen: named here too", job(culprit_kw={"heartbeat_age_s": 12.0}), [(3,)]),
    ("two culprits", [stuck(r) if r in (2, 6) else waiting(r) for r in range(8)], [(2, 6)]),
    (
        "a rank killed half-way through its buckets is behind",
        [waiting(r, seq=815) if r != 5 else waiting(5, seq=813, alive=False) for r in range(8)],
        [(5,)],
    ),
    ("everyone inside, nobody missing: the wedged verdict's", [waiting(r) for r in range(8)], []),
    # entered it and died or froze inside: dead_rank's (first death, then victims) and frozen_rank's
    ("one rank died inside it, the rest wait", [waiting(r, alive=(r != 3)) for r in range(8)], []),
    (
        "one rank froze inside it, the rest wait",
        [waiting(r, heartbeat_age_s=12.0 if r == 3 else 0.2) for r in range(8)],
        [],
    ),
    ("nobody in a collective, nobody progressing", [stuck(r) for r in range(8)], [tuple(range(8))]),
    ("all dead: dead_rank's business", [stuck(r, alive=False) for r in range(8)], []),
]


@pytest.mark.parametrize("name,states,want", CASES, ids=[c[0] for c in CASES])
def test_hang_table(name, states, want):
    assert [f.ranks for f in run(states)] == want


def test_a_rank_that_died_or_froze_inside_the_collective_is_still_named_by_its_own_detector():
    """Not a hang's culprit (the table above), but never unseen: the death is dead_rank's,
    the freeze frozen_rank's, naming that rank alone."""
    dead = t.view([waiting(r, alive=(r != 3)) for r in range(8)], now=100.0)
    assert [(f.kind, f.ranks) for f in DeadRank(CFG).check(100.0, dead)] == [("dead_rank", (3,))]
    frozen = t.view([waiting(r, heartbeat_age_s=12.0 if r == 3 else 0.2) for r in range(8)], now=100.0)
    assert [(f.kind, f.ranks) for f in FrozenRank(CFG).check(100.0, frozen)] == [("frozen_rank", (3,))]


def test_allowances_extend_not_cancel():
    states = job(waiter_kw={"since": 140.0}, culprit_kw={"age": 141.0, "phase": "eval"})
    assert [f.ranks for f in run(states)] == [(3,)]  # 5 + 120 s passed


def test_deadline_adapts_to_step_time():
    slow = t.steps(1, 50, step_s=4.0)  # p99 4 s x 5 = 20 s
    states = job(waiter_kw={"since": 15.0, "recent_steps": slow}, culprit_kw={"age": 16.0, "recent_steps": slow})
    assert run(states) == []
    st = hang_state(100.0, t.view(states, now=100.0), CFG)
    assert st is not None
    assert st.deadline_s == pytest.approx(20.0) and st.age_s == pytest.approx(15.05)


def _with(history, step, step_s, phase="train", coll_s=0.02):
    """``history`` with step ``step`` replaced."""
    return tuple(replace(x, step_s=step_s, coll_s=coll_s, phase=phase) if x.step == step else x for x in history)


def _paused(step_s, phase0, phase1="train", steps=(20, 40)):
    """Rank 0 evaluates alone (6 s) at ``steps`` while rank 1 waits for it in the all-reduce."""
    r0 = r1 = t.steps(1, 50, step_s=step_s)
    for s in steps:
        r0 = _with(r0, s, 6.0, phase0)
        r1 = _with(r1, s, 6.0, phase1, coll_s=5.9)
    return r0, r1


@pytest.mark.parametrize(
    ("name", "histories", "want"),
    [
        # an evaluation alone (the hook's automatic eval, or marked) at steps 20 and 40: rank 1's
        # wait in those steps was the phase's; without it 6 s x 5 = 30 s
        ("eval alone", _paused(0.1, "eval"), 5.0),
        ("checkpoint alone", _paused(0.1, "checkpoint"), 5.0),
        ("both in the pause", _paused(0.1, "eval", "eval"), 5.0),
        # slow steps: the deadline is still theirs once the pauses are left out
        ("slow steps, eval alone", _paused(2.0, "eval"), 10.0),
        # unmarked 6 s stalls (nothing says they were a pause): they are steps, the deadline stretches
        ("unmarked stalls", _paused(0.1, "train"), 30.0),
    ],
)
def test_the_deadline_leaves_out_steps_a_rank_spent_in_a_pause(name, histories, want):
    """After a rank-0-only evaluation the next hang is still named at the floor:
    the peers' long wait in that step is the phase's, not a step time."""
    states = [waiting(r, since=4.0, recent_steps=h) for r, h in enumerate(histories)]
    st = hang_state(100.0, t.view(states, now=100.0), CFG)
    assert st is not None, name
    assert st.deadline_s == pytest.approx(want, rel=0.02), name


def test_leaked_outstanding_while_stepping_is_not_a_wait():
    # outstanding stuck at 1 since long ago, but steps keep completing.
    states = [
        t.rank(r, step_age_s=0.05, collective=t.coll(seq=50, outstanding=1, since_s=30.0), recent_steps=HISTORY)
        for r in range(8)
    ]
    assert run(states) == []


def test_all_ranks_starved_of_data_is_a_stalled_pipeline():
    states = [stuck(r, in_data_wait=True, data_wait_age_s=12.0) for r in range(8)]
    (f,) = run(states)
    assert "input pipeline is stalled" in f.reason


@pytest.mark.parametrize("fault", ["hang", "stop", "kill", "exit_early"])
def test_sim_faults_name_the_faulty_rank(fault):
    sim = SimJob(jitter=0.1, seed=3)
    getattr(sim, fault)(6, at_step=30)
    culprits = set()
    for i in range(1, 81):
        now = i * 0.5
        culprits |= {f.ranks for f in CollectiveHang(CFG).check(now, sim.run_until(now))}
    assert culprits == {(6,)}


def test_sim_checkpoint_pause_is_not_a_hang():
    sim = SimJob(jitter=0.1, checkpoint_every=25, checkpoint_s=40.0)
    for i in range(1, 301):
        now = i * 0.5
        assert CollectiveHang(CFG).check(now, sim.run_until(now)) == [], now


def test_mismatched_collective_names_the_odd_rank():
    """Same seq on the same group, but rank 4 broadcasts while the rest all-reduce."""
    states = [waiting(r) for r in range(8)]
    states[4] = t.rank(
        4,
        step=811,
        step_age_s=12.5,
        recent_steps=HISTORY,
        collective=t.coll(seq=812, outstanding=1, since_s=12.4, op="broadcast"),
    )
    (f,) = run(states)
    assert f.ranks == (4,) and f.evidence["how"] == "mismatched"
    assert "called a different collective" in f.reason


def test_a_silent_hosts_last_waits_do_not_make_the_live_ranks_culprits():
    # Host b (ranks 2, 3) went silent at 100 while its ranks were inside collective #500.
    # Agents were advised to report every 2 s, so b is lost only after 10 s of silence.
    # Ranks 0 and 1 on host a keep stepping; rank 0 is inside collective #490 right now
    # (a job whose ranks number their collectives apart). b's last states are 6 s old:
    # they are not a wait going on now, and nobody on a may be named for it.
    hist = t.steps(1, 50)
    b = [
        t.rank(r, world_size=4, step=499, step_age_s=0.02, recent_steps=hist,
               collective=t.coll(seq=500, outstanding=1, since_s=0.01))
        for r in (2, 3)
    ]  # fmt: skip
    view = t.view(b, now=100.0, ranks_per_host=2)
    a = [
        t.rank(0, world_size=4, step=489, step_age_s=0.02, recent_steps=hist,
               collective=t.coll(seq=490, outstanding=1, since_s=0.01)),
        t.rank(1, world_size=4, step=495, step_age_s=0.05, recent_steps=hist),
    ]  # fmt: skip
    view = replace(t.view(a, now=106.0, ranks_per_host=2, base=view), advised_interval_s=2.0)
    assert health.lost_hosts(view, 106.0, CFG) == set()
    assert CollectiveHang(CFG).check(106.0, view) == []
    # Still silent at 111, while a completed collectives up to #545, past b's #500: b's ranks
    # took part, they are alive; the monitor is blind to b (analysis/silence.py), nobody is named.
    a = [t.rank(r, world_size=4, step=545, step_age_s=0.02, recent_steps=hist) for r in (0, 1)]
    view = replace(t.view(a, now=111.0, ranks_per_host=2, base=view, seq=2), advised_interval_s=2.0)
    assert health.lost_hosts(view, 111.0, CFG) == set() and set(health.unobserved_hosts(view, 111.0, CFG)) == {"host1"}
    assert CollectiveHang(CFG).check(111.0, view) == [] and DeadRank(CFG).check(111.0, view) == []
    assert [(f.kind, f.hosts) for f in HostUnobserved(CFG).check(111.0, view)] == [("host_unobserved", ("host1",))]


def test_a_quiet_hosts_ranks_are_not_culprits_on_what_they_said_before_the_wait():
    # Ranks 0-3 (host0) entered all_reduce #812 12.4 s ago. Host1 (ranks 4-7) last reported
    # 13 s ago, computing step 811, and has missed its reports since (advised 2 s: lost only
    # after 10 s of silence, plus this coordinator's own lag). Whether 4-7 entered since is
    # unknown: nobody is named until host1 reports again or is lost.
    quiet = [stuck(r, age=0.5) for r in range(4, 8)]
    view = t.view(quiet, now=87.0)
    view = t.view([waiting(r) for r in range(4)], now=100.0, base=view, seq=2)
    view = replace(view, advised_interval_s=2.0, behind_s=4.0)
    assert health.lost_hosts(view, 100.0, CFG) == set() and health.quiet_hosts(view, 100.0) == {"host1"}
    (f,) = CollectiveHang(CFG).check(100.0, view)
    assert f.ranks == () and f.hosts == () and f.evidence["unheard"] == [4, 5, 6, 7]
    assert "host host1 not heard from since; nobody named" in f.reason
    # Had host1 said after the wait began that its ranks were still computing, they are named.
    late = t.view([stuck(r, age=12.9) for r in range(4, 8)], now=95.0, base=view, seq=3)
    late = replace(late, advised_interval_s=2.0, behind_s=0.0)
    (f,) = CollectiveHang(CFG).check(100.0, late)
    assert f.ranks == (4, 5, 6, 7)


def behind_view(hosts: dict[str, tuple[list, float]], now: float, behind_s: float):
    """A coordinator ``behind_s`` behind, agents slowed to a 10 s interval: each host's
    ranks as folded at its own time (a report that sat in the socket buffers is folded
    late, next to fresher ones)."""
    v = t.empty("job", 12)
    for host, (states, at) in sorted(hosts.items()):
        v, _ = t.fold(v, t.report(host, states, interval_s=10.0), at, CFG)
    v = t.as_folded(v)
    return columns.attach(replace(v, behind_s=behind_s), columns.cached(v))


def test_waiters_another_rank_has_overtaken_are_stale_not_hung_and_nobody_is_named():
    """At 16,384 ranks on a starved core: host0's report, folded late, shows its ranks
    in all_reduce #53 for 12 s; host1's ranks, heard 13 s ago, had finished #55, and
    host2's, heard now, #105. #53 ended for everyone: nobody is hung, and host1's ranks,
    ahead of the "waiters", must not be named as never having entered it."""
    now = 100.0

    def between(ranks, done: int):
        return [t.rank(r, world_size=12, step=done, collective=t.coll(seq=done), recent_steps=HISTORY) for r in ranks]

    hosts = {
        "host0": ([waiting(r, seq=53, world_size=12) for r in range(4)], now),
        "host1": (between(range(4, 8), 55), now - 13),
        "host2": (between(range(8, 12), 105), now),
    }
    view = behind_view(hosts, now, behind_s=5.0)
    assert CollectiveHang(CFG).check(now, view) == []
    assert health.analyze(view, now, CFG) is None
    # The same views with host2 waiting in #53 too and host1 short of it (done with #52, no
    # step since): a hang. Host1 last heard 13 s ago, before the wait began: nobody named yet.
    hosts["host2"] = ([waiting(r, seq=53, world_size=12) for r in range(8, 12)], now)
    hosts["host1"] = (between(range(4, 8), 52), now - 13)
    (f,) = CollectiveHang(CFG).check(now, behind_view(hosts, now, behind_s=5.0))
    assert f.ranks == () and f.evidence["unheard"] == [4, 5, 6, 7], f.reason
    # Heard 5 s ago, after the wait began, still short of #53 since 13 s ago: named.
    hosts["host1"] = ([replace(s, step_age_s=8.0) for s in between(range(4, 8), 52)], now - 5)
    (f,) = CollectiveHang(CFG).check(now, behind_view(hosts, now, behind_s=5.0))
    assert f.ranks == (4, 5, 6, 7), f.reason


def test_unpaused_step_time_read_again_only_where_histories_changed_is_the_plain_one():
    """The cache of what was read (by identity) answers as reading every history would."""
    import random

    from watchdog.coordinator.detectors import collective_hang as ch
    from watchdog.stepstats import stats

    def plain(histories, step_s):
        tails = [h[-100:] for h in histories]
        paused = {x.step for tail in tails for x in tail if x.phase in ("eval", "checkpoint")}
        if not paused:
            return step_s
        p99s = [stats.quantile(k, 0.99) for tail in tails if (k := [x.step_s for x in tail if x.step not in paused])]
        return min(step_s, stats.median(p99s)) if p99s else step_s

    rng = random.Random(7)
    histories = [t.steps(1, 120, step_s=1.5) for _ in range(6)]
    for _ in range(200):
        i = rng.randrange(len(histories))
        h = histories[i]
        last = h[-1].step
        phase = rng.choice(("train", "train", "train", "eval", "checkpoint"))
        histories[i] = (*h[-119:], t.steps(last + 1, 1, step_s=rng.uniform(0.5, 8.0), phase=phase)[0])
        if rng.random() < 0.1:
            histories = histories[:-1] if len(histories) > 2 else [*histories, t.steps(1, 50, step_s=2.0)]
        assert ch.unpaused_step_s(histories, 9.0) == plain(histories, 9.0)
