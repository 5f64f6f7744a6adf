"""A restart replaces the root cause's record first, the victims' later.

torchrun tears the group down when one rank dies (its peers get SIGTERM) and
starts the new workers one by one; the agent reports each rank's new incarnation
as it appears. Seen with a plain DDP script (rank 0 exiting with 3 at step 60,
torchrun --max-restarts=1): once ranks 0-1 had restarted, rank 2's SIGTERM death
was the earliest on record, and dead_rank opened "rank 2 died: exit -15
(SIGTERM) ...; rank 3 failed after it", a second root cause for one fault, naming
a victim. The replaced incarnation's death now stays in the ordering
(``FoldedRank.previous_died_at``), unnamed; a rank of the new attempt that dies
is never its follower (a crash that comes back is named again).
"""

from __future__ import annotations

from dataclasses import replace

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors.dead_rank import DeadRank
from watchdog.coordinator.view.cluster import ClusterView, empty, fold

CFG = DetectorConfig()
NEW = 1_800_000_000_000_000  # the new incarnations' start time


def old(r: int, now: float, died: float | None = None):
    """A rank of the first attempt at step 60; rank 0 in its own code, the others in #61."""
    coll = t.coll(seq=60, done_seq=60) if r == 0 else t.coll(seq=61, outstanding=1, since_s=now - 9.9)
    s = t.rank(r, world_size=4, step=60, step_age_s=now - 9.9, collective=coll)
    return s if died is None else replace(s, alive=False, gone_age_s=now - died, status="failed")


def new(r: int, now: float, started: float, died: float | None = None):
    s = t.rank(r, world_size=4, pid=2000 + r, proc_start_us=NEW, step=0, pg_state="initializing", phase="init")
    s = replace(s, step_age_s=now - started)
    return s if died is None else replace(s, alive=False, gone_age_s=now - died, status="failed")


DEATHS = {0: 10.00, 1: 10.11, 2: 10.12, 3: 10.13}  # rank 0 first; the others by the launcher's SIGTERM


def fold_at(v: ClusterView, now: float, states, seq: int) -> ClusterView:
    v, _ = fold(v, t.report("host0", states, seq=seq), now, CFG)
    return v


def torn_down() -> ClusterView:
    v = fold_at(empty("job"), 5.0, [old(r, 5.0) for r in range(4)], 1)
    return fold_at(v, 11.0, [old(r, 11.0, DEATHS[r]) for r in range(4)], 2)


def test_the_first_death_is_named_before_the_restart():
    v = t.as_folded(torn_down())
    assert [f.ranks for f in DeadRank(CFG).check(11.0, v)] == [(0,)]


def test_a_victim_left_in_the_view_by_the_restart_is_not_a_new_root_cause():
    v = fold_at(
        torn_down(), 12.0, [new(0, 12.0, 11.8), new(1, 12.0, 11.8), old(2, 12.0, 10.12), old(3, 12.0, 10.13)], 3
    )
    v = t.as_folded(v)
    assert v.ranks[0].previous_died_at == 10.0 and v.ranks[2].previous_died_at is None
    assert DeadRank(CFG).check(12.0, v) == []


def test_a_crash_that_comes_back_in_the_new_attempt_is_named():
    """Rank 2's new incarnation starts at 12.5 and dies at 15.0: within CASCADE_S of the
    first attempt's deaths, but not of its teardown."""
    states = [new(0, 15.5, 11.8), new(1, 15.5, 11.8), new(2, 15.5, 12.5, died=15.0), old(3, 15.5, 10.13)]
    v = fold_at(torn_down(), 12.6, [new(0, 12.6, 11.8), new(1, 12.6, 11.8), new(2, 12.6, 12.5), old(3, 12.6, 10.13)], 3)
    v = t.as_folded(fold_at(v, 15.5, states, 4))
    assert [f.ranks for f in DeadRank(CFG).check(15.5, v)] == [(2,)]


# -- a launcher's teardown: every rank of a host SIGTERMed at once ------------------------------


def sigtermed(r: int, now: float, died: float, **kw):
    s = t.rank(r, world_size=4, step=300, step_age_s=now - died, **kw)
    return replace(
        s,
        alive=False,
        gone_age_s=now - died,
        death={"summary": "exit -15 (SIGTERM)", "exit_code": -15, "signal": "SIGTERM"},
    )


def two_hosts(host0, host1, now: float) -> ClusterView:
    v = empty("job")
    v, _ = fold(v, t.report("node-a", [t.rank(r, world_size=4, step=290) for r in (0, 1)], seq=1), now - 10, CFG)
    v, _ = fold(v, t.report("node-b", [t.rank(r, world_size=4, step=290) for r in (2, 3)], seq=1), now - 10, CFG)
    v, _ = fold(v, t.report("node-a", host0, seq=2), now, CFG)
    v, _ = fold(v, t.report("node-b", host1, seq=2), now, CFG)
    return t.as_folded(v)


def test_ranks_their_launcher_terminated_together_are_nobody_s_fault():
    """torchrun stopping node-a's workers for a membership change (a node joined), or a
    scheduler's cancel: both SIGTERM deaths within a millisecond. The old code named rank 1
    ("died: exit -15 (SIGTERM) ...; rank 0 failed after it")."""
    now = 30.0
    v = two_hosts([sigtermed(0, now, 29.0005), sigtermed(1, now, 29.0)], [t.rank(r, world_size=4) for r in (2, 3)], now)
    assert DeadRank(CFG).check(now, v) == []


def test_a_rank_killed_alone_is_named_though_its_host_mates_were_terminated_after_it():
    """An operator's kill -TERM of rank 1; its launcher stops rank 0 once it notices, 0.8 s later."""
    now = 30.0
    v = two_hosts([sigtermed(0, now, 29.8), sigtermed(1, now, 29.0)], [t.rank(r, world_size=4) for r in (2, 3)], now)
    assert [f.ranks for f in DeadRank(CFG).check(now, v)] == [(1,)]


def test_a_crash_before_the_teardown_is_the_root_cause_and_the_terminated_follow_it():
    now = 30.0
    crashed = replace(
        t.rank(2, world_size=4, step=300),
        alive=False,
        gone_age_s=2.0,
        status="failed",
        death={"summary": "exit 1", "exit_code": 1},
    )
    v = two_hosts([sigtermed(0, now, 28.5), sigtermed(1, now, 28.5003)], [crashed, sigtermed(3, now, 28.2)], now)
    [f] = DeadRank(CFG).check(now, v)
    assert f.ranks == (2,) and "ranks 0-1,3 failed after it" in f.reason


def test_a_rank_alone_on_its_host_terminated_is_still_named():
    """One rank per host: its launcher's teardown and a kill of the rank look the same."""
    now = 30.0
    v = empty("job")
    v, _ = fold(v, t.report("node-a", [t.rank(0, world_size=2)], seq=1), now - 10, CFG)
    v, _ = fold(v, t.report("node-b", [t.rank(1, world_size=2)], seq=1), now - 10, CFG)
    v, _ = fold(v, t.report("node-a", [replace(sigtermed(0, now, 29.0), world_size=2)], seq=2), now, CFG)
    v, _ = fold(v, t.report("node-b", [t.rank(1, world_size=2)], seq=2), now, CFG)
    assert [f.ranks for f in DeadRank(CFG).check(now, t.as_folded(v))] == [(0,)]
