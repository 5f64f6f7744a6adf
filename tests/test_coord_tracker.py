"""Dedupe/resolution and isolated detector runs."""

from __future__ import annotations

from typing import Any

import pytest

from watchdog.contracts.finding import Finding, rank_ranges
from watchdog.coordinator import testing as t
from watchdog.coordinator.detectors.runner import Runner
from watchdog.coordinator.detectors.tracker import update
from watchdog.coordinator.metrics import HANG_SECONDS, STRAGGLER_SCORE


def finding(kind="frozen_rank", ranks=(3,), onset=10.0, now=12.0, reason="r"):
    return Finding(kind=kind, ranks=ranks, hosts=("a",), reason=reason, onset_mono=onset, detected_mono=now)


def test_open_once_while_it_lasts_then_resolve_with_duration():
    active, opened, resolved = update({}, [finding()], 12.0, ["frozen_rank"])
    assert [f.ranks for f in opened] == [(3,)] and resolved == []
    for now in (13.0, 14.0, 15.0):  # same kind + ranks: not new, even with a new reason
        active, opened, resolved = update(
            active, [finding(now=now, onset=now - 1, reason=f"r{now}")], now, ["frozen_rank"]
        )
        assert opened == [] and resolved == []
    (a,) = active.values()
    assert a.latest.reason == "r15.0" and a.latest.onset_mono == 10.0  # first onset kept
    active, opened, resolved = update(active, [], 20.0, ["frozen_rank"])
    assert active == {} and resolved[0].duration_s == pytest.approx(10.0)


def test_other_ranks_are_another_finding():
    active, _, _ = update({}, [finding(ranks=(3,))], 12.0, ["frozen_rank"])
    active, opened, resolved = update(active, [finding(ranks=(4,))], 13.0, ["frozen_rank"])
    assert [f.ranks for f in opened] == [(4,)] and [r.finding.ranks for r in resolved] == [(3,)]


def test_grace_keeps_a_flapping_condition_open():
    active, _, _ = update({}, [finding()], 12.0, ["frozen_rank"], grace_s=2.0)
    active, _, resolved = update(active, [], 13.0, ["frozen_rank"], grace_s=2.0)
    assert resolved == [] and active
    active, opened, resolved = update(active, [finding()], 13.5, ["frozen_rank"], grace_s=2.0)
    assert opened == [] and resolved == []
    active, _, resolved = update(active, [], 16.0, ["frozen_rank"], grace_s=2.0)
    assert len(resolved) == 1


def test_a_detector_that_did_not_run_resolves_nothing():
    active, _, _ = update({}, [finding()], 12.0, ["frozen_rank"])
    active, _, resolved = update(active, [], 20.0, ["dead_rank"])  # frozen_rank raised this tick
    assert resolved == [] and active


class Boom:
    name = "frozen_rank"

    def check(self, now, view):
        raise RuntimeError("bug")


class Fine:
    name = "dead_rank"

    def check(self, now, view):
        return [finding(kind="dead_rank")]


class WrongKind:
    name = "straggler"

    def check(self, now, view):
        return [finding(kind="dead_rank")]


def test_runner_isolates_each_detector():
    ticks = iter(range(100))
    outcomes = Runner([Boom(), Fine(), WrongKind()], timer=lambda: next(ticks)).run(1.0, t.view(t.healthy()))
    assert [(o.name, o.ok, len(o.findings)) for o in outcomes] == [
        ("frozen_rank", False, 0),
        ("dead_rank", True, 1),
        ("straggler", False, 0),
    ]
    assert outcomes[0].error == "RuntimeError: bug" and outcomes[1].duration_s == 1


class Gauged:
    name = "collective_hang"

    def check(self, now, view):
        return []

    def gauges(self, now, view):
        return {HANG_SECONDS: now}


class BadGauges(Gauged):
    def gauges(self, now, view):
        raise KeyError("internals")


class UnknownGauge(Gauged):
    def gauges(self, now, view):
        return {"watchdog_made_up": 1.0}


class UnlabelledScores(Gauged):
    def gauges(self, now, view):
        return {STRAGGLER_SCORE: 1.0}


def test_runner_hands_out_gauges_and_isolates_them_like_check():
    # some break the Detector protocol on purpose
    dets: list[Any] = [Gauged(), BadGauges(), UnknownGauge(), UnlabelledScores(), Fine()]
    outcomes = Runner(dets).run(7.0, t.view(t.healthy()))
    assert [(o.ok, dict(o.gauges)) for o in outcomes] == [
        (True, {HANG_SECONDS: 7.0}),
        (False, {}),
        (False, {}),
        (False, {}),
        (True, {}),
    ]
    assert outcomes[1].error == "KeyError: 'internals'" and "watchdog_made_up" in outcomes[2].error
    assert "needs {label: value}" in outcomes[3].error


def test_rank_ranges():
    assert rank_ranges([0, 1, 2, 4, 5, 6, 7]) == "0-2,4-7"
    assert rank_ranges([3]) == "3" and rank_ranges([]) == "" and rank_ranges([5, 1, 3, 2]) == "1-3,5"
