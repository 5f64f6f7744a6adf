"""Gathering every rank's stack into one ``stack_groups`` record (pure: time is a number)."""

from __future__ import annotations

from watchdog.coordinator.evidence.dispatch import _bound
from watchdog.coordinator.evidence.stack_gather import StackGather
from watchdog.coordinator.journal import event_names as je

TRIGGER = {"kind": "collective_hang", "ranks": [2]}


def stack(rank, line, ok=True):
    return {
        "rank": rank,
        "ok": ok,
        "text": f'Thread 1 (idle): "MainThread"\n    main (train.py:{line})\n' if ok else "",
        "error": "" if ok else "process gone: no stack to take",
    }


def evidence(host, stacks, **kw):
    return {"type": "dump_stacks", "host": host, "trigger": dict(TRIGGER), "stacks": stacks, **kw}


def test_the_record_waits_for_every_host_then_groups_across_hosts():
    g = StackGather(wait_s=90.0)
    g.expect(TRIGGER, {"a": [0, 1], "b": [2, 3]}, now=0.0)
    g.note(je.EVIDENCE, evidence("a", [stack(0, 212), stack(1, 212)], bound={"late": [1]}))
    assert g.due(5.0) == []  # host b has not answered
    g.note(je.EVIDENCE, evidence("b", [stack(2, 220), stack(3, 212), {"rank": "x"}, "junk"]))
    [rec] = g.due(6.0)
    assert rec.hosts_answered == 2 and rec.hosts_missing == [] and rec.late_ranks == 1
    assert [(x["ranks"], x["culprit"]) for x in rec.groups or ()] == [([[2, 2]], True), ([[0, 1], [3, 3]], False)]
    assert g.due(7.0) == []  # once


def test_a_refused_or_silent_host_ends_the_wait_and_is_named():
    g = StackGather(wait_s=90.0)
    g.expect(TRIGGER, {"a": [0], "b": [1]}, now=0.0)
    g.note(je.EVIDENCE, evidence("a", [stack(0, 212)]))
    g.note(je.COMMAND_REFUSED, {"type": "dump_stacks", "host": "b", "trigger": dict(TRIGGER)})
    [rec] = g.due(1.0)
    assert rec.hosts_missing == ["b"] and rec.ranks == 1
    g.expect(TRIGGER, {"a": [0], "b": [1]}, now=10.0)
    g.note(je.EVIDENCE, evidence("a", [stack(0, 212)]))
    assert g.due(99.0) == [] and g.due(100.0)[0].hosts_missing == ["b"]


def test_other_triggers_types_and_hosts_are_ignored_and_a_later_failure_never_hides_a_stack():
    g = StackGather()
    g.expect(TRIGGER, {"a": [0]}, now=0.0)
    g.note(je.EVIDENCE, {**evidence("a", [stack(0, 1)]), "type": "snapshot_slots"})
    g.note(je.EVIDENCE, {**evidence("a", [stack(0, 1)]), "trigger": {"kind": "x"}})
    g.note(je.EVIDENCE, evidence("zz", [stack(0, 1)]))
    g.note(je.EVIDENCE, evidence("a", [stack(0, 212), stack(0, 0, ok=False)]))
    [rec] = g.due(0.0)
    assert [x["brief"] for x in rec.groups or ()] == ["main (train.py:212)"]


def test_the_agents_bound_is_journaled_as_numbers_only():
    assert _bound({"parallel": 8, "deadline_s": 10.0, "duration_s": 0.4, "late": [3, "x", True], "evil": "<x>"}) == {
        "parallel": 8,
        "deadline_s": 10.0,
        "duration_s": 0.4,
        "late": [3],
    }
    assert _bound("nope") is None and _bound({"parallel": float("nan")}) is None
