"""Folding reports into the cluster view: ages, progress, restarts, windows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.view.cluster import empty, fold

CFG = DetectorConfig()


def test_age_is_age_at_send_plus_time_since_receipt():
    v = t.view([t.rank(0, heartbeat_age_s=0.3, step_age_s=0.1)], now=100.0)
    rv = v.ranks[0]
    assert rv.heartbeat_age(100.0) == pytest.approx(0.3)
    assert rv.heartbeat_age(102.5) == pytest.approx(2.8)
    assert rv.step_start() == pytest.approx(99.9)
    assert rv.heartbeat_age(99.0) == pytest.approx(0.3)  # never younger than at send


def test_first_report_emits_host_seen_and_rank_joined():
    v, events = t.with_lines(fold(empty(), t.report("a", [t.rank(0), t.rank(1)]), 10.0, CFG))
    names = [e for e, _ in events]
    assert names == [je.HOST_SEEN, je.RANK_JOINED, je.RANK_JOINED]
    assert v.world_size == 8  # learned from the reports
    assert set(v.ranks) == {0, 1} and v.hosts["a"].ranks == (0, 1)


def test_configured_world_size_is_kept():
    v, _ = fold(empty(world_size=16), t.report("a", [t.rank(0)]), 10.0, CFG)
    assert v.world_size == 16 and v.world_size_fixed


def test_unchanged_rank_emits_no_events():
    v, _ = fold(empty(), t.report("a", [t.rank(0)], seq=1), 10.0, CFG)
    v, events = t.with_lines(fold(v, t.report("a", [t.rank(0)], seq=2), 11.0, CFG))
    assert events == []


def test_retried_report_is_folded_once():
    v, _ = fold(empty(), t.report("a", [t.rank(0, recent_steps=t.steps(1, 5))], seq=3), 10.0, CFG)
    v2, events = t.with_lines(fold(v, t.report("a", [t.rank(0, recent_steps=t.steps(1, 5))], seq=3), 10.5, CFG))
    assert v2 is v and events == []


def test_state_changes_are_events():
    v, _ = fold(empty(), t.report("a", [t.rank(0)], seq=1), 10.0, CFG)
    _, events = t.with_lines(fold(v, t.report("a", [t.rank(0, alive=False, status="running")], seq=2), 11.0, CFG))
    assert events == [
        (
            je.STATE,
            {"rank": 0, "host": "a", "pid": 1000, "local_rank": 0, "step": 100, "changed": {"alive": [True, False]}},
        )
    ]


def test_new_agent_id_is_an_agent_restart():
    v, _ = fold(empty(), t.report("a", [t.rank(0)], agent_id="x", seq=7), 10.0, CFG)
    v, events = t.with_lines(fold(v, t.report("a", [t.rank(0)], agent_id="y", seq=1), 11.0, CFG))
    assert events[0][0] == je.HOST_SEEN and events[0][1]["agent_restarted"] is True
    assert v.hosts["a"].agent_id == "y" and 0 in v.ranks  # seq restarted at 1 and was accepted


def test_new_pid_is_a_restart_that_resets_rank_state():
    v = t.view([t.rank(0, recent_steps=t.steps(1, 60))], now=10.0)
    assert v.ranks[0].windows and v.ranks[0].history
    new = t.rank(0, pid=4242, proc_start_us=1_700_000_100_000_000, step=0)
    v, events = t.with_lines(fold(v, t.report("host0", [new], seq=2), 20.0, CFG))
    assert (
        je.RANK_RESTARTED,
        {
            "rank": 0,
            "host": "host0",
            "pid": 4242,
            "local_rank": 0,
            "old_pid": 1000,
            "old_host": "host0",
            "old_step": 100,
        },
    ) in events
    rv = v.ranks[0]
    assert rv.history == () and rv.windows == () and rv.registered_at == 20.0 and rv.steps_seen == 0


def test_older_incarnation_is_ignored():
    v = t.view([t.rank(0, pid=2, proc_start_us=2_000)], now=10.0)
    v2, events = t.with_lines(fold(v, t.report("other", [t.rank(0, pid=1, proc_start_us=1_000)]), 11.0, CFG))
    assert v2.ranks[0].state.pid == 2 and not any(e == je.RANK_RESTARTED for e, _ in events)


def test_progress_tracks_step_start_and_collective_moves():
    v = t.view([t.rank(0, step=5, step_age_s=2.0)], now=100.0)
    assert v.ranks[0].progress_at == pytest.approx(98.0)
    # Same step, but a collective completed since: progress at least the previous report.
    moved = t.rank(0, step=5, step_age_s=3.0, collective=t.coll(seq=9, done_seq=9))
    v, _ = fold(v, t.report("host0", [moved], seq=2), 101.0, CFG)
    assert v.ranks[0].progress_at == pytest.approx(100.0)
    # Nothing moved: progress stays put however many reports arrive.
    v, _ = fold(v, t.report("host0", [replace(moved, step_age_s=9.0)], seq=3), 107.0, CFG)
    assert v.ranks[0].progress_at == pytest.approx(100.0)


def test_warmup_steps_are_not_history():
    v = t.view([t.rank(0, recent_steps=t.steps(1, 5, step_s=0.1))], now=10.0)
    assert [x.step for x in v.ranks[0].history] == [3, 4, 5]
    assert v.ranks[0].steps_seen == 5


def test_windows_close_when_the_next_window_starts():
    cfg = DetectorConfig(straggler_window_steps=10, warmup_steps=0)
    v = t.view([t.rank(0, recent_steps=t.steps(0, 25, step_s=0.2, coll_s=0.05))], now=10.0, cfg=cfg)
    ws = v.ranks[0].windows
    assert [w.index for w in ws] == [0, 1]  # window 2 (steps 20-29) still open
    assert ws[0].compute_s == pytest.approx(0.15) and ws[0].step_s == pytest.approx(0.2) and ws[0].n == 10


def test_heartbeat_moved_needs_a_beat():
    # A slot whose heartbeat never advanced since creation (no heartbeat thread).
    v = t.view([t.rank(0, step=0, step_age_s=20.0, heartbeat_age_s=20.0)], now=100.0)
    assert not v.ranks[0].heartbeat_moved
    v, _ = fold(v, t.report("host0", [t.rank(0, step=0, step_age_s=21.0, heartbeat_age_s=0.1)], seq=2), 101.0, CFG)
    assert v.ranks[0].heartbeat_moved


def test_death_time_from_agent_gone_age_or_last_sign_of_life():
    v = t.view([t.rank(0), t.rank(1)], now=100.0)
    dead = [t.rank(0, alive=False, gone_age_s=0.4), t.rank(1, alive=False, heartbeat_age_s=0.9)]
    v, _ = fold(v, t.report("host0", dead, seq=2), 101.0, CFG)
    assert v.ranks[0].died_at == pytest.approx(100.6) and v.ranks[0].died_precise
    assert v.ranks[1].died_at == pytest.approx(100.1) and not v.ranks[1].died_precise
    v2, _ = fold(v, t.report("host0", dead, seq=3), 105.0, CFG)
    assert v2.ranks[0].died_at == v.ranks[0].died_at  # estimated once


def test_a_death_is_journaled_with_its_cause_before_the_launchers_replacement():
    # The agent tells a replaced incarnation's death once, in place of its successor
    # (agent/reporting/sender.py); the next report brings the successor.
    v = t.view([t.rank(1)], now=10.0)
    death = {"summary": "ValueError: bad batch at train.py:12, exit 1 by sys.exit(1)", "exit_code": 1}
    dead = t.rank(1, alive=False, status="failed", death=death)
    v, events = t.with_lines(fold(v, t.report("host0", [dead], seq=2), 11.0, CFG))
    new = t.rank(1, pid=4242, proc_start_us=1_700_000_100_000_000, step=0)
    v, later = t.with_lines(fold(v, t.report("host0", [new], seq=3), 12.0, CFG))
    (state,) = [p for e, p in events if e == je.STATE]
    assert state["changed"]["alive"] == [True, False] and state["cause"] == death["summary"], state
    assert [e for e, _ in later] == [je.RANK_RESTARTED]
