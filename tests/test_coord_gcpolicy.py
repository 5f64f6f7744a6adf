"""Freezing the heap after each tick never keeps a reference cycle for longer
than the periodic full collection; plain objects are freed as soon as dropped;
each accepted report's objects are frozen as it is accepted."""

from __future__ import annotations

import gc
import http.client
import json
import threading
import time
import weakref
from types import SimpleNamespace

import pytest
from waiting import wait_for

from watchdog.coordinator import gcpolicy, server
from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config
from watchdog.coordinator.daemon import Daemon
from watchdog.coordinator.gcpolicy import FULL_EVERY_S, YOUNG_THRESHOLD, GcPolicy
from watchdog.coordinator.journal import Journal
from watchdog.coordinator.service import Coordinator


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
        assert policy.after_tick(1.0) is None  # frozen while still in use; no full collection yet
        del a, b, plain
        assert acyc() is None  # reference counting does not care about freezing
        gc.collect()
        assert cyc() is not None  # frozen: the collector does not see it
        full = policy.after_tick(FULL_EVERY_S + 1.0)
        assert cyc() is None
        # What the daemon logs and times: the two nodes (and their attribute dicts) were found.
        assert full is not None and full.unreachable >= 2 and full.frozen >= full.unreachable
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


def test_after_each_report_what_it_left_is_frozen_and_no_collection_is_due():
    policy = GcPolicy(now=0.0)
    try:
        gc.collect()
        folded = [Node() for _ in range(1000)]  # one report's new rank states and samples
        before = gc.get_freeze_count()
        policy.after_report()
        assert gc.get_freeze_count() >= before + len(folded)
        assert gc.get_count()[0] < len(folded)
    finally:
        gc.unfreeze()
    off = gc.get_freeze_count()
    GcPolicy(now=0.0, enabled=False).after_report()
    assert gc.get_freeze_count() == off


def test_the_report_server_calls_after_report_for_accepted_reports_only(tmp_path):
    token = "a-token-of-32-characters-or-so!!"
    journal = Journal(str(tmp_path / "j.jsonl"), lambda: (time.time(), time.monotonic()))
    coord = Coordinator(Config(job="job", token=token, journal=str(tmp_path / "j.jsonl")), journal)
    calls = []
    srv = server.make_server("127.0.0.1", 0, coord, token, 1 << 20, after_report=lambda: calls.append(1))
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    try:
        body = json.dumps(t.report("a", t.healthy()).to_dict()).encode()
        statuses = []
        for auth in (token, "wrong"):
            conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
            conn.request("POST", server.REPORT_PATH, body, {"Authorization": f"Bearer {auth}"})
            resp = conn.getresponse()
            resp.read()
            conn.close()
            statuses.append(resp.status)
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(5)
        journal.close()
    assert statuses == [200, 401] and calls == [1]


def test_the_daemon_times_each_full_collection_and_says_so(tmp_path, monkeypatch):
    """It holds the interpreter (seconds at 16,384 ranks): outside the tick's
    histograms, so its own gauge and log line say when reports waited for it."""
    monkeypatch.setattr(gcpolicy, "FULL_EVERY_S", 0.0)  # every tick
    cfg = Config(listen=("127.0.0.1", 0), job="job", journal=str(tmp_path / "j.jsonl"), tick_s=0.05)
    d = Daemon(cfg, own_process=True).start()
    logged = []
    note = lambda event, **kw: logged.append((event, kw))  # noqa: E731
    monkeypatch.setattr(d, "log", SimpleNamespace(info=note, warning=note, error=note))
    try:
        wait_for(lambda: logged, timeout_s=30, what="a log line from the tick thread")
    finally:
        d.stop()
        gc.unfreeze()
    event, kw = logged[0]
    assert event == "gc_full_collection" and kw["frozen"] > 0 and kw["seconds"] >= 0
    assert d.coordinator.metrics.gc_full._value.get() > 0
