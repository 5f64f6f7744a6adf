"""A rank that exits cleanly while the others wait for it in a collective.

On gloo the waiters fail within a second of it (the peer closed its connection),
so no hang is ever seen; every death is a victim's of the exit. Found with a plain
DDP script whose rank 2 called sys.exit(0) at step 60: torchrun failed with exit 1
and the journal had no finding at all. dead_rank now names the rank that left.
"""

from __future__ import annotations

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors.collective_hang import CollectiveHang
from watchdog.coordinator.detectors.dead_rank import DeadRank

CFG = DetectorConfig()
NOW = 100.0


def waiting(r: int, **kw):
    """In ddp_all_reduce #61 since 1.5 s."""
    kw.setdefault("collective", t.coll(seq=61, outstanding=1, since_s=1.5, op="ddp_all_reduce"))
    kw.setdefault("step_age_s", 1.6)
    return t.rank(r, world_size=4, step=60, **kw)


def gone(r: int, **kw):
    return waiting(r, alive=False, gone_age_s=0.4, status="failed", **kw)


def left(r: int, **kw):
    """Exited cleanly after step 60, before entering #61."""
    return t.rank(r, world_size=4, step=60, step_age_s=1.6, alive=False, status="exited", **kw)


def test_a_rank_that_exited_while_the_others_waited_is_named_when_they_die_of_it():
    v = t.view([gone(0), gone(1), left(2), gone(3)], now=NOW)
    [f] = DeadRank(CFG).check(NOW, v)
    assert f.ranks == (2,) and f.kind == "dead_rank"
    assert "rank 2 (host host0, pid 1002) exited at step 60" in f.reason
    assert "ranks 0-1,3 waited for it in ddp_all_reduce #61 on the default group" in f.reason
    assert "ranks 0-1,3 failed after it" in f.reason
    assert f.evidence["followers"] == [0, 1, 3] and f.evidence["seq"] == 61


def test_several_ranks_that_left_are_one_finding():
    v = t.view([gone(0), left(1), left(2), gone(3)], now=NOW)
    [f] = DeadRank(CFG).check(NOW, v)
    assert f.ranks == (1, 2) and "ranks 1-2 (host host0) exited at step 60 (clean exits)" in f.reason


def test_while_the_waiters_still_wait_it_is_the_hangs_to_name():
    """NCCL: the waiters block instead of failing. collective_hang names the exited rank."""
    long = {"collective": t.coll(seq=61, outstanding=1, since_s=90.0, op="ddp_all_reduce"), "step_age_s": 90.1}
    v = t.view([waiting(0, **long), waiting(1, **long), left(2), waiting(3, **long)], now=NOW)
    assert DeadRank(CFG).check(NOW, v) == []
    [hang] = CollectiveHang(CFG).check(NOW, v)
    assert hang.ranks == (2,) and "exited already" in hang.reason


def test_a_crash_first_is_the_root_cause_not_the_ranks_that_exited_after_it():
    """Rank 3 crashed in its own code; the launcher's SIGTERM then ended ranks 1-2 cleanly
    (a script that exits on SIGTERM) and rank 0 died waiting: rank 3 is named, not 1-2."""
    crashed = t.rank(3, world_size=4, step=60, step_age_s=1.6, alive=False, gone_age_s=1.0, status="failed")
    v = t.view([gone(0), left(1), left(2), crashed], now=NOW)
    found = DeadRank(CFG).check(NOW, v)
    assert [f.ranks for f in found] == [(3,)]
    assert "exited at" not in found[0].reason


def test_the_job_ending_cleanly_names_nobody():
    v = t.view([left(r) for r in range(4)], now=NOW)
    assert DeadRank(CFG).check(NOW, v) == []
