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

from watchdog.contracts.report import typed as typedbody
from watchdog.coordinator import gcpolicy
from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config
from watchdog.coordinator.daemon import Daemon
from watchdog.coordinator.gcpolicy import FULL_EVERY_S, YOUNG_THRESHOLD, GcPolicy
from watchdog.coordinator.intake import server
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.service import Coordinator
from watchdog.report import HostReport, as_rows


@pytest.fixture(autouse=True)
def _thresholds():
    """A policy sets the process's collector thresholds: the test session's own are put back."""
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


class Node:
    other: Node  # set to make a cycle


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


def test_after_full_collections_that_found_nothing_the_next_waits_twice_as_long():
    """A real coordinator leaves no cycles: its full collection (seconds at
    16,384 ranks) grows rarer, up to FULL_MAX_S; one that finds a cycle brings
    the interval back to FULL_EVERY_S."""
    policy = GcPolicy(now=0.0, rss=lambda: 1000)
    try:
        assert policy.after_tick(FULL_EVERY_S - 1.0) is None
        at = 0.0
        waits: list[float] = []
        for _ in range(7):
            gc.collect()  # the test session's own garbage, not the policy's to find
            at += waits[-1] if waits else FULL_EVERY_S
            assert policy.after_tick(at - 1.0) is None
            full = policy.after_tick(at)
            assert full is not None and full.unreachable == 0
            waits.append(full.next_in_s)
        assert waits == [min(FULL_EVERY_S * 2**k, gcpolicy.FULL_MAX_S) for k in range(1, 8)]
        a, b = Node(), Node()
        a.other, b.other = b, a
        del a, b
        full = policy.after_tick(at + waits[-1])
        assert full is not None and full.unreachable >= 2 and full.next_in_s == FULL_EVERY_S
    finally:
        gc.unfreeze()


def test_a_grown_process_is_collected_before_its_interval_is_up():
    """What the doubling could let pile up is bounded: peak RSS grown by GROWTH
    since the last full collection makes one due once FULL_EVERY_S has passed."""
    rss = [1000]
    policy = GcPolicy(now=0.0, rss=lambda: rss[0])
    try:
        gc.collect()
        full = policy.after_tick(FULL_EVERY_S)
        assert full is not None and full.next_in_s == 2 * FULL_EVERY_S
        rss[0] = int(1000 * gcpolicy.GROWTH) + 1
        assert policy.after_tick(2 * FULL_EVERY_S - 1.0) is None  # not before FULL_EVERY_S
        assert policy.after_tick(2 * FULL_EVERY_S) is not None  # not waiting for 3 x FULL_EVERY_S
        assert policy.after_tick(3 * FULL_EVERY_S) is None  # measured from the new peak
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
            host, port = srv.server_address[:2]
            conn = http.client.HTTPConnection(str(host), port, timeout=30)
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
    assert event == "gc_full_collection" and kw["frozen"] > 0 and kw["seconds"] >= 0 and "next_in_s" in kw
    assert d.coordinator.metrics.gc_full._value.get() > 0


def test_a_coordinator_reading_folding_and_ticking_leaves_no_cyclic_garbage(tmp_path):
    """What lets the full collection wait longer after one that found nothing:
    reports read as an agent sends them, folded and ticked over, a rank dying and
    its finding (evidence asked, journaled, resolved), make no reference cycle;
    reference counting frees all of it. Warmed first: caches and first-use
    imports are made once."""
    path = str(tmp_path / "j.jsonl")
    journal = Journal(path, lambda: (time.time(), time.monotonic()))
    coord = Coordinator(Config(job="job", world_size=8, journal=path), journal)

    def second(s: int) -> None:
        for h in range(2):
            ranks = [
                t.rank(r, step=10 * s, recent_steps=t.steps(10 * s - 9, 10), alive=not (r == 5 and s >= 25))
                for r in range(4 * h, 4 * h + 4)
            ]
            body = json.dumps(as_rows(t.report(f"h{h}", ranks, seq=s).to_dict())).encode()
            coord.accept(typedbody.read(body) or HostReport.from_dict(json.loads(body), []), float(s))
        coord.tick(float(s) + 0.5, 1_700_000_000.0 + s)

    try:
        for s in range(1, 21):
            second(s)
        gc.collect()
        for s in range(21, 60):
            second(s)
        assert any(r["event"] == "finding" for r in map(json.loads, open(path))), "the dead rank was not found"
        assert gc.collect() == 0
    finally:
        journal.close()
