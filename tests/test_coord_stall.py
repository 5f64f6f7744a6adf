"""The coordinator's own stall (SIGSTOP, paused VM): its silence is not the hosts'.

Before: on resume the first tick saw every host silent for as long as the stall
lasted and named each one lost, its ranks presumed dead (dead_rank), on healthy jobs.
"""

from __future__ import annotations

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.own_stall import is_stall
from watchdog.coordinator.service import Coordinator


@pytest.fixture
def coord(tmp_path):
    path = str(tmp_path / "journal.jsonl")
    c = Coordinator(Config(journal=path, job="job", world_size=8), Journal(path, lambda: (1.7e9, 0.0)))
    yield c
    c.journal.close()


SKEW_S = -7.0  # the agents' clocks run 7 s behind the coordinator's: freshness must not depend on it


def _healthy(c, at, seq, sent_at=None, hosts=("a", "b")):
    """Reports arriving at coordinator time ``at``, sent at ``sent_at`` (default: just then)."""
    sent = 1.7e9 + (at if sent_at is None else sent_at) + SKEW_S
    for host, ranks in (("a", range(4)), ("b", range(4, 8))):
        if host in hosts:
            c.accept(t.report(host, [t.rank(r, step=100 + seq) for r in ranks], seq=seq, sent_wall=sent), at)


def _opened(c, at):
    return [f.key for f in c.tick(at, 1.7e9 + at).opened]


def test_without_the_stall_notice_the_hosts_look_lost():
    """The failure the guard prevents: the same numbers, no stall declared."""
    c = Coordinator(Config(journal="/dev/null", job="job", world_size=8), Journal("/dev/null", lambda: (1.7e9, 0.0)))
    _healthy(c, 10.0, 1)
    assert _opened(c, 10.5) == []
    assert {k for k, _ in _opened(c, 40.0)} == {"host_unobserved"}  # every host silent: nobody to vouch


def test_after_a_stall_detection_waits_for_a_report_sent_after_it_and_finds_nothing(coord):
    _healthy(coord, 10.0, 1)
    assert _opened(coord, 10.5) == []
    coord.stalled(40.0, 29.5, 1.7e9 + 40.0)  # the daemon's loop was stopped for 29.5 s
    assert _opened(coord, 40.0) == []  # every host silent 30 s: held, not lost
    # Queued in the listen backlog during the stall: sent at 20, 25, 30 s, folded now. Stale: still held.
    for seq, sent in ((2, 20.0), (3, 25.0), (4, 30.0)):
        _healthy(coord, 40.05, seq, sent_at=sent)
        assert _opened(coord, 40.1) == [] and coord.stall_guard.stall is not None
    _healthy(coord, 40.6, 5, hosts=("a",))  # host a sent after the resume, b not yet
    assert _opened(coord, 40.7) == [] and coord.stall_guard.stall is not None
    _healthy(coord, 41.0, 6)
    assert _opened(coord, 41.1) == [] and coord.stall_guard.stall is None  # detection is back
    recs = [r for r in journal.read(coord.journal.path) if r["event"] == je.COORDINATOR_STALLED]
    assert len(recs) == 1 and recs[0]["gap_s"] == 29.5 and recs[0]["hosts"] == ["a", "b"]
    assert [r for r in journal.read(coord.journal.path) if r["event"] in (je.FINDING, je.HOST_LOST)] == []


def test_a_new_agent_after_the_stall_counts_as_heard(coord):
    _healthy(coord, 10.0, 1)
    coord.stalled(40.0, 29.5, 1.7e9 + 40.0)
    for host, ranks in (("a", range(4)), ("b", range(4, 8))):
        coord.accept(t.report(host, [t.rank(r) for r in ranks], seq=1, agent_id=f"new-{host}"), 40.5)
    assert _opened(coord, 40.6) == [] and coord.stall_guard.stall is None


def test_a_host_that_really_went_away_is_still_named_one_deadline_later(coord):
    _healthy(coord, 10.0, 1)
    coord.stalled(40.0, 29.5, 1.7e9 + 40.0)
    for seq, at in ((2, 40.1), (3, 41.0), (4, 42.0)):  # host b never reports again
        _healthy(coord, at, seq, hosts=("a",))
        assert _opened(coord, at + 0.1) == []
    _healthy(coord, 44.9, 5, hosts=("a",))
    opened = _opened(coord, 45.0)  # one host-silence deadline (5 x 1 s) after the resume
    # Named as silent (host a's collectives went on past b's, so b's ranks ran: analysis/silence.py).
    assert opened == [("host_unobserved", ())]


@pytest.mark.parametrize(
    ("gap", "tick", "stall"),
    [(1.2, 1.0, False), (1.9, 0.25, False), (2.5, 0.25, True), (3.9, 1.0, False), (4.5, 1.0, True), (30.0, 1.0, True)],
)
def test_what_counts_as_a_stall(gap, tick, stall):
    assert is_stall(gap, tick) is stall
