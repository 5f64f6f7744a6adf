"""One restart budget for the job: the coordinator's restarts and the launcher's own
(control/budget.py), from journaled facts; time is a number."""

from __future__ import annotations

import pytest

from watchdog.contracts.journal import parse
from watchdog.coordinator import policy_file
from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config
from watchdog.coordinator.control import budget, policy, relaunch
from watchdog.coordinator.control import replay as recover
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal.jsonl import Journal, iter_records
from watchdog.coordinator.service import Coordinator
from watchdog.timeline import action_story as timeline_actions

WALL0 = 1.7e9
RESTART = (je.ACTION, {"action": "restart"})
DRY = (je.ACTION, {"action": "restart", "dry_run": True})
OUTCOME = (je.ACTION_OUTCOME, {"ok": True})
NEW = (je.RANK_RESTARTED, {"rank": 0})

# (name, [(t, (event, record))], the launcher restarts counted)
CASES = [
    (
        "one launcher restart: every rank comes back within seconds",
        [(100.0, NEW), (100.4, NEW), (103.0, NEW)],
        (100.0,),
    ),
    ("two launcher restarts a while apart", [(100.0, NEW), (100.2, NEW), (160.0, NEW)], (100.0, 160.0)),
    ("the coordinator's own restart is not the launcher's", [(100.0, RESTART), (104.0, NEW), (110.0, OUTCOME)], ()),
    (
        "ranks of the coordinator's restart registering just after its outcome",
        [(100.0, RESTART), (110.0, OUTCOME), (115.0, NEW), (200.0, NEW)],
        (200.0,),
    ),
    (
        "a dry run restarts nothing: the launcher's restart counts",
        [(100.0, DRY), (101.0, OUTCOME), (150.0, NEW)],
        (150.0,),
    ),
    ("other records are not restarts", [(100.0, (je.RANK_JOINED, {})), (101.0, (je.FINDING, {}))], ()),
]


@pytest.mark.parametrize("name,records,want", CASES, ids=[c[0] for c in CASES])
def test_launcher_restarts_from_journaled_facts(name, records, want):
    spent = budget.Spent()
    for at, (event, rec) in records:
        spent = budget.fold(spent, event, rec, at)
    assert spent.launcher == want


def test_the_launchers_restarts_spend_the_budget_nothing_bypasses():
    pol = policy_file.parse_policy(
        '[actions]\ndead_rank = "restart"\n[limits]\nmin_finding_age_seconds = 0\nmax_restarts = 2'
    )
    f = t.finding("dead_rank", [1])
    job = policy.JobControl().launcher_restarted(10.0)
    assert policy.plan([f], job, 100.0, pol).action == "restart"  # 1 of 2 used
    job = job.launcher_restarted(50.0)
    plan = policy.plan([f], job, 100.0, pol)
    assert plan.action == "abort" and "2 of 2 restarts used; 2 restart(s) so far by the launcher itself" in plan.reason


def test_a_coordinator_restarted_on_its_journal_still_counts_the_launchers_restarts():
    records = [
        {"event": je.START, "job": "job", "t_wall": WALL0},
        *({"event": je.RANK_RESTARTED, "rank": r, "t_wall": WALL0 + 50.0 + r / 10} for r in range(4)),
        {"event": je.ACTION, "action_id": "a-1", "action": "restart", "restart": 2, "t_wall": WALL0 + 80.0},
        {"event": je.RANK_RESTARTED, "rank": 0, "t_wall": WALL0 + 85.0},  # that action's: not the launcher's
        {"event": je.ACTION_OUTCOME, "action_id": "a-1", "ok": True, "t_wall": WALL0 + 90.0},
    ]
    rec = recover.replay(records, 100.0, WALL0 + 100.0, "job", policy_file.Policy())
    assert rec.job.by_launcher == 1 and rec.job.restarts == pytest.approx((50.0, 80.0))
    only_launcher = recover.replay(records[:5], 100.0, WALL0 + 100.0, "job", policy_file.Policy())
    assert not only_launcher.empty and only_launcher.job.restarts == pytest.approx((50.0,))


def test_the_coordinator_counts_a_launcher_restart_it_sees_in_the_reports(tmp_path):
    path = str(tmp_path / "journal.jsonl")
    c = Coordinator(Config(journal=path, job="job", world_size=2), Journal(path, lambda: (WALL0, 0.0)))
    c.accept(t.report("host0", [t.rank(r, world_size=2) for r in range(2)]), 10.0)
    c.tick(10.1, WALL0 + 10.1)
    assert c.control.job.restarts == ()
    # torchrun --max-restarts replaced both workers (new pids, start times), no action of ours in flight.
    again = [t.rank(r, world_size=2, pid=7000 + r, proc_start_us=1_800_000_000_000_000, step=0) for r in range(2)]
    c.accept(t.report("host0", again, seq=2), 20.0)
    c.tick(20.1, WALL0 + 20.1)
    assert c.control.job.restarts == (20.0,) and c.control.job.by_launcher == 1
    c.journal.close()
    # journaled as the launcher's restart, with no action of the monitor's, once
    recs = [r for r in iter_records(path) if r["event"] == je.LAUNCHER_RESTART]
    assert [(r["restart"], r["by"]) for r in recs] == [(1, "launcher")]
    assert "by the launcher on its own" in timeline_actions.label(parse(recs[0]))


def _old(r: int, step: int) -> tuple[str, dict]:
    return (je.RANK_RESTARTED, {"rank": r, "old_step": step})


# (name, [(t, (event, record))], the step each launcher restart's replaced ranks had reached)
REACHED = [
    ("the highest step of the ranks a restart replaced", [(100.0, _old(0, 56)), (100.3, _old(1, 57))], (57,)),
    ("a rank reported later raises it", [(100.0, _old(1, 55)), (101.0, _old(0, 57)), (102.0, _old(2, 56))], (57,)),
    ("one per restart", [(100.0, _old(0, 57)), (100.1, _old(1, 57)), (160.0, _old(0, 12))], (57, 12)),
    ("a record without the step says nothing of it", [(100.0, NEW)], (-1,)),
]


@pytest.mark.parametrize("name,records,want", REACHED, ids=[c[0] for c in REACHED])
def test_the_step_each_launcher_restart_stopped_the_job_at(name, records, want):
    spent = budget.Spent()
    for at, (event, rec) in records:
        spent = budget.fold(spent, event, rec, at)
    assert spent.reached == want


def test_a_launcher_restart_that_never_resumed_carries_its_step_to_the_next():
    spent = budget.Spent()
    for at, (event, rec) in [(100.0, _old(0, 57)), (160.0, _old(0, 0))]:  # the new group died at init
        spent = budget.fold(spent, event, rec, at)
    first = relaunch.follow(None, 1, 0, 100.0, spent)
    second = relaunch.follow(first, 2, 1, 160.0, spent)
    assert relaunch.reached(first, spent) == 57 and relaunch.reached(second, spent) == 57


def _launcher_job(tmp_path) -> tuple[Coordinator, str]:
    path = str(tmp_path / "journal.jsonl")
    c = Coordinator(Config(journal=path, job="job", world_size=2), Journal(path, lambda: (WALL0, 0.0)))
    c.accept(t.report("host0", [t.rank(r, world_size=2, step=57) for r in range(2)]), 10.0)
    c.tick(10.1, WALL0 + 10.1)
    return c, path


def _new_group(start_us: int, step: int, first: int = 0) -> list:
    """The launcher's new worker group: new pids and start times, ``step`` reached, steps
    ``first`` ... ``step`` seen (none: not stepping yet)."""
    seen = t.steps(first, step - first + 1) if first else ()
    return [
        t.rank(r, world_size=2, pid=start_us % 10_000 + r, proc_start_us=start_us, step=step, recent_steps=seen)
        for r in range(2)
    ]


def test_the_steps_a_launcher_restart_cost_are_journaled_counted_and_told(tmp_path):
    c, path = _launcher_job(tmp_path)
    # torchrun --max-restarts replaced both workers (stopped at step 57); they load their checkpoint.
    c.accept(t.report("host0", _new_group(1_800_000_000_000_000, 0), seq=2), 20.0)
    c.tick(20.1, WALL0 + 20.1)
    assert [r for r in iter_records(path) if r["event"] == je.RESUMED] == []  # not stepping yet
    # Resumed from the checkpoint at step 50: steps 51-53 done since, 51 the first.
    c.accept(t.report("host0", _new_group(1_800_000_000_000_000, 53, first=51), seq=3), 22.0)
    c.tick(22.1, WALL0 + 22.1)
    c.accept(t.report("host0", _new_group(1_800_000_000_000_000, 55, first=54), seq=4), 23.0)
    c.tick(23.1, WALL0 + 23.1)
    c.journal.close()
    recs = [r for r in iter_records(path) if r["event"] == je.RESUMED]
    assert len(recs) == 1, recs  # once
    (rec,) = recs
    assert (rec["by"], rec["restart"], rec["step"], rec["world_size"], rec["steps_lost"]) == ("launcher", 1, 50, 2, 7)
    assert "action_id" not in rec  # no action of the monitor's
    assert c.registry.get_sample_value("watchdog_coordinator_steps_lost_total") == 7.0
    assert (
        timeline_actions.label(parse(rec)) == "resumed from step 50 with 2 ranks, 7 steps lost, 2.1 s after its restart"
    )


def test_a_group_that_died_at_init_then_resumed_is_measured_from_where_the_fault_stopped_the_job(tmp_path):
    c, path = _launcher_job(tmp_path)
    c.accept(t.report("host0", _new_group(1_800_000_000_000_000, 0), seq=2), 20.0)
    c.tick(20.1, WALL0 + 20.1)
    # The launcher's second restart (its first group never stepped): resumed from step 50 all the same.
    c.accept(t.report("host0", _new_group(1_800_000_100_000_000, 0), seq=3), 40.0)
    c.tick(40.1, WALL0 + 40.1)
    c.accept(t.report("host0", _new_group(1_800_000_100_000_000, 52, first=51), seq=4), 45.0)
    c.tick(45.1, WALL0 + 45.1)
    c.journal.close()
    recs = [r for r in iter_records(path) if r["event"] in (je.LAUNCHER_RESTART, je.RESUMED)]
    assert [(r["event"], r["restart"], r.get("steps_lost")) for r in recs] == [
        (je.LAUNCHER_RESTART, 1, None),
        (je.LAUNCHER_RESTART, 2, None),
        (je.RESUMED, 2, 7),
    ]
    assert c.registry.get_sample_value("watchdog_coordinator_steps_lost_total") == 7.0
