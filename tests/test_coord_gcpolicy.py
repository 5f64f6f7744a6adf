"""Freezing the heap after each tick never keeps a reference cycle for longer
than the periodic full collection; plain objects are freed as soon as dropped."""

from __future__ import annotations

import gc
import weakref

import pytest

from watchdog.coordinator.gcpolicy import FULL_EVERY_S, YOUNG_THRESHOLD, GcPolicy


@pytest.fixture(autouse=True)
def _thresholds():
    """A policy sets the process's collector thresholds: the test session's own are put back."""
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


class Node:
    pass


def test_frozen_cycles_are_collected_by_the_periodic_full_pass():
    policy = GcPolicy(now=0.0)
    try:
        a, b, plain = Node(), Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector can free it
        cyc, acyc = weakref.ref(a), weakref.ref(plain)
        policy.after_tick(1.0)  # frozen while still in use
        del a, b, plain
        assert acyc() is None  # reference counting does not care about freezing
        gc.collect()
        assert cyc() is not None  # frozen: the collector does not see it
        policy.after_tick(FULL_EVERY_S + 1.0)
        assert cyc() is None
    finally:
        gc.unfreeze()


def test_disabled_policy_does_nothing():
    before = gc.get_freeze_count()
    GcPolicy(now=0.0, enabled=False).after_tick(1e9)
    assert gc.get_freeze_count() == before


def test_before_the_tick_what_reports_left_is_out_of_the_ticks_collections():
    policy = GcPolicy(now=0.0)
    try:
        gc.collect()
        folded = [Node() for _ in range(1000)]  # what the reports folded since the last tick
        policy.before_tick()
        assert gc.get_freeze_count() >= len(folded)
        assert all(gc.is_tracked(n) for n in folded[:3])
        young = gc.get_count()[0]
        assert young < len(folded)  # a collection during the tick no longer walks them
    finally:
        gc.unfreeze()


def test_disabled_policy_freezes_nothing_before_the_tick():
    before = gc.get_freeze_count()
    GcPolicy(now=0.0, enabled=False).before_tick()
    assert gc.get_freeze_count() == before


def test_a_daemons_policy_collects_the_young_generation_less_often():
    gc.set_threshold(700, 10, 10)
    GcPolicy(now=0.0, enabled=False)
    assert gc.get_threshold() == (700, 10, 10)  # not its process: left alone
    GcPolicy(now=0.0)
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
