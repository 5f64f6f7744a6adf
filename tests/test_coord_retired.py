"""Ranks of an earlier world: a restart with another world size (torchrun elastic
after a lost node, exclude_host_restart) leaves the old world's last ranks in the
view, gone. They are "retired": no detector names them or counts them as waiters,
so the job reads as the new world alone.

Seen end to end (tests/test_e2e_actions.py, exclude_host_restart): the new ranks
0-1 resumed from the checkpoint reached ddp_all_reduce #36 again, where the old
world's ranks 2-3 had died when the restart stopped them, and collective_hang
opened "ranks 2-3 failed inside ddp_all_reduce #36; ranks 0-1 waiting 25.8 s"
on a job that was training.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.analysis import health
from watchdog.coordinator.config import Config, DetectorConfig
from watchdog.coordinator.detectors import build
from watchdog.coordinator.intake import status
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.view.cluster import ClusterView, empty, fold
from watchdog.report import HostReport

CFG = DetectorConfig()
NEW_START_US = 1_800_000_000_000_000  # the new incarnations' start time


def old_rank(r: int, world: int = 4, **kw):
    """A rank of the first world, in ddp_all_reduce #36 (rank 1 hung before it)."""
    coll = t.coll(seq=35, done_seq=35) if r == 1 else t.coll(seq=36, outstanding=1, since_s=5.0)
    return t.rank(r, world_size=world, step=30, local_rank=r % 2, collective=coll, **kw)


def new_rank(r: int, world: int = 2, *, since_s: float, seq: int = 36, outstanding: int = 1, **kw):
    return t.rank(
        r,
        world_size=world,
        pid=2000 + r,
        proc_start_us=NEW_START_US,
        step=30,
        step_age_s=since_s,
        collective=t.coll(seq=seq, outstanding=outstanding, since_s=since_s),
        **kw,
    )


def gone(s):
    return replace(s, alive=False, gone_age_s=0.5, proc_status="gone")


def restart_reports(new_states, now: float, *, old_world: int = 4) -> list[tuple[float, HostReport]]:
    """Node a (ranks 0-1) and node b (ranks 2-3) ran the first world; the restart
    stopped every worker; node b alone runs the new ranks. (time, report) in order."""
    return [
        (5.0, t.report("node-a", [old_rank(0, old_world), old_rank(1, old_world)], seq=1)),
        (5.0, t.report("node-b", [old_rank(r, old_world) for r in range(2, old_world)], seq=1)),
        (6.0, t.report("node-a", [gone(old_rank(0, old_world)), gone(old_rank(1, old_world))], seq=2)),
        (6.0, t.report("node-b", [gone(old_rank(r, old_world)) for r in range(2, old_world)], seq=2)),
        # node-a's agent carries on reporting: with no ranks of its own now (its launcher was stopped)
        (now, t.report("node-a", [], seq=3)),
        (now, t.report("node-b", new_states, seq=3)),
    ]


def restarted(new_states, now: float, *, old_world: int = 4) -> ClusterView:
    v = empty("job")
    for at, rep in restart_reports(new_states, now, old_world=old_world):
        v, _ = fold(v, rep, at, CFG)
    return t.as_folded(v)


def alone(new_states, now: float) -> ClusterView:
    """The new world as if it had been the only one."""
    v = empty("job")
    v, _ = fold(v, t.report("node-b", new_states, seq=1), now - 20.0, CFG)
    v, _ = fold(v, t.report("node-b", new_states, seq=2), now, CFG)
    return t.as_folded(v)


def findings(view: ClusterView, now: float) -> list[tuple[str, tuple[int, ...], str]]:
    out = []
    for d in build(CFG):
        if d.name == "batch_changed":
            continue  # the one detector that is about the change of world itself
        out += [(f.kind, f.ranks, f.reason) for f in d.check(now, view)]
    return sorted(out)


@pytest.mark.parametrize("since_s", [0.5, 3.0, 8.0, 30.0])
def test_after_a_restart_with_fewer_ranks_the_old_ranks_are_retired_and_named_by_nobody(since_s):
    now = 25.0 + since_s
    new = [new_rank(r, since_s=since_s) for r in range(2)]
    v = restarted(new, now)
    h = health.classify_all(v, now, CFG)
    assert h == {0: health.OK, 1: health.OK, 2: health.RETIRED, 3: health.RETIRED}
    assert health.present_world(v, now, CFG) == 2
    got = findings(v, now)
    assert not any({2, 3} & set(ranks) for _, ranks, _ in got), got
    assert not any("ranks 2-3" in reason or "rank 2" in reason for _, _, reason in got), got
    assert got == findings(alone(new, now), now)  # the new world reads as if it were alone


def test_a_hang_of_the_new_world_names_its_own_culprit():
    """New rank 1 never enters #40 while rank 0 waits 100 s (past the deadline's allowance
    for a new incarnation's first steps): rank 1 is named, not the old world's ranks
    that died inside #36."""
    now = 150.0
    new = [new_rank(0, since_s=100.0, seq=40), new_rank(1, since_s=100.0, seq=39, outstanding=0)]
    [hang] = [f for f in findings(restarted(new, now), now) if f[0] == "collective_hang"]
    assert hang[1] == (1,)
    assert findings(restarted(new, now), now) == findings(alone(new, now), now)


def test_nobody_is_retired_while_the_restart_is_under_way():
    """No live rank yet: the old world's deaths are the news (dead_rank names them as before)."""
    v = restarted([], 8.0)
    assert health.present_world(v, 8.0, CFG) is None
    assert set(health.classify_all(v, 8.0, CFG).values()) == {health.DEAD}


def test_nobody_is_retired_while_live_ranks_disagree_on_the_world():
    """A new rank of world 2 live beside an old one of world 4 still running: mid-restart."""
    now = 30.0
    v = restarted([new_rank(0, since_s=0.5)], now)
    v, _ = fold(v, t.report("node-c", [old_rank(3)], seq=1), now, CFG)  # still alive, old world
    v = t.as_folded(v)
    assert health.present_world(v, now, CFG) is None
    assert health.RETIRED not in health.classify_all(v, now, CFG).values()


def test_a_dead_rank_of_the_present_world_stays_dead():
    now = 30.0
    v = restarted([new_rank(0, since_s=0.5), gone(new_rank(1, since_s=0.5))], now)
    h = health.classify_all(v, now, CFG)
    assert (h[0], h[1], h[2], h[3]) == (health.OK, health.DEAD, health.RETIRED, health.RETIRED)
    dead = [f for f in findings(v, now) if f[0] == "dead_rank"]
    assert [f[1] for f in dead] == [(1,)]


def test_a_restart_with_more_ranks_retires_the_old_ranks_not_yet_replaced():
    """2 -> 4 ranks: old rank 1 (world 2) is gone and its new incarnation has not reported yet."""
    now = 30.0
    v = empty("job")
    v, _ = fold(v, t.report("node-a", [old_rank(0, 2), old_rank(1, 2)], seq=1), 5.0, CFG)
    v, _ = fold(v, t.report("node-a", [gone(old_rank(0, 2)), gone(old_rank(1, 2))], seq=2), 6.0, CFG)
    v, _ = fold(v, t.report("node-a", [new_rank(0, 4, since_s=0.5)], seq=3), now, CFG)
    v, _ = fold(v, t.report("node-b", [new_rank(r, 4, since_s=0.5) for r in (2, 3)], seq=1), now, CFG)
    v = t.as_folded(v)
    h = health.classify_all(v, now, CFG)
    assert h == {0: health.OK, 1: health.RETIRED, 2: health.OK, 3: health.OK}
    assert [f for f in findings(v, now) if f[0] == "dead_rank"] == []


def test_classify_agrees_with_classify_all_on_retired_ranks():
    now = 30.0
    v = restarted([new_rank(0, since_s=0.5), gone(new_rank(1, since_s=0.5))], now)
    lost = health.lost_hosts(v, now, CFG)
    assert {r: health.classify(rv, v, now, CFG, lost) for r, rv in v.ranks.items()} == health.classify_all(v, now, CFG)


def test_after_a_shrink_the_job_expects_the_new_world_and_counts_only_its_ranks(tmp_path):
    """What the person looking at the job sees: "2 of 2 ranks", not "2 alive of 4" after
    a legitimate scale-down; the old world's ranks are listed as retired."""
    now = 30.0
    new = [new_rank(r, since_s=3.0) for r in range(2)]
    journal = str(tmp_path / "j.jsonl")
    coord = Coordinator(Config(job="job", journal=journal), Journal(journal, lambda: (0.0, 0.0)))
    for at, rep in restart_reports(new, now):
        coord.accept(rep, at)
        if at < now:
            coord.tick(at + 0.25, 1e9)  # the old world's deaths judged (view/unjudged.py), as ticks do meanwhile
    coord.tick(now, 1e9)
    gauge = coord.registry.get_sample_value
    assert (gauge("watchdog_coordinator_ranks_expected"), gauge("watchdog_coordinator_ranks_registered")) == (2, 2)
    assert gauge("watchdog_coordinator_ranks_alive") == 2
    doc = status.build(coord.view_at(now), {}, now, 1e9, coord.cfg)
    assert (doc["world_size"], doc["registered"]) == (2, 2)
    assert [row["health"] for row in doc["ranks"]] == ["ok", "ok", "retired", "retired"]
    coord.journal.close()


def test_while_the_restart_is_under_way_or_a_size_is_configured_that_is_expected():
    now = 30.0
    under_way = restarted([gone(new_rank(r, since_s=3.0)) for r in range(2)], now)  # nothing live: no new world yet
    assert health.expected_world(under_way, now, CFG) == 4
    v = restarted([new_rank(r, since_s=3.0) for r in range(2)], now)
    assert health.expected_world(v, now, CFG) == 2
    assert health.expected_world(replace(v, world_size=4, world_size_fixed=True), now, CFG) == 4  # --job.world-size
