"""The coordinator end to end in-process, time moved by numbers: simulated jobs
with one fault each, journal and metrics checked; isolation of a failing detector."""

from __future__ import annotations

from dataclasses import replace

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.testing import SimJob


@pytest.fixture
def make(tmp_path):
    made: list[Coordinator] = []

    def _make(**kw):
        path = str(tmp_path / f"journal{len(made)}.jsonl")
        now = {"mono": 0.0}
        c = Coordinator(Config(journal=path, **kw), Journal(path, lambda: (1.7e9 + now["mono"], now["mono"])))
        made.append(c)
        return c

    yield _make
    for c in made:
        c.journal.close()


def findings(c):
    recs = journal.read(c.journal.path)
    return [(r["kind"], tuple(r["ranks"])) for r in recs if r["event"] == je.FINDING]


def count(c, name, **labels):
    return c.registry.get_sample_value(name, labels) or 0


SCENARIOS = [
    ("hang", lambda s: s.hang(3, 40), [("collective_hang", (3,))]),
    ("sigstop", lambda s: s.stop(3, 40), [("frozen_rank", (3,)), ("collective_hang", (3,))]),
    ("sigkill, torchrun tears the group down", lambda s: s.kill(3, 40, victims_die_after=0.15), [("dead_rank", (3,))]),
    ("sigkill, the others hang", lambda s: s.kill(3, 40), [("dead_rank", (3,)), ("collective_hang", (3,))]),
    ("uneven inputs: rank exits early", lambda s: s.exit_early(3, 40), [("collective_hang", (3,))]),
    ("slow rank", lambda s: s.slow(3, 1.3), [("straggler", (3,))]),
    ("starved rank", lambda s: s.starve(3, 0.08), [("loader_starvation", (3,))]),
    ("healthy with checkpoints", lambda s: None, []),
]


@pytest.mark.parametrize("name,inject,want", SCENARIOS, ids=[c[0] for c in SCENARIOS])
def test_one_fault_one_culprit(make, name, inject, want):
    c = make(job="job", world_size=8, tick_s=0.5)
    sim = SimJob(jitter=0.1, seed=11, checkpoint_every=50 if name.startswith("healthy") else 0, checkpoint_s=20.0)
    inject(sim)
    sim.run_until(40.0, coordinator=c, tick_s=0.5)
    assert findings(c) == want
    for kind, _ in want:
        assert count(c, "watchdog_coordinator_findings_total", kind=kind) == 1
        assert count(c, "watchdog_coordinator_findings_active", kind=kind) == 1


def test_hang_gauges_and_status(make):
    c = make(job="job", world_size=8)
    sim = SimJob(jitter=0.1)
    sim.hang(6, 40)
    sim.run_until(30.0, coordinator=c, tick_s=1.0)
    assert count(c, "watchdog_coordinator_hang_seconds") > 10
    assert count(c, "watchdog_coordinator_ranks_alive") == 8 and count(c, "watchdog_coordinator_ranks_expected") == 8
    doc = c.status(30.0, 1.7e9)
    assert doc["findings"][0]["kind"] == "collective_hang" and doc["findings"][0]["ranks"] == [6]
    assert doc["ranks"][6]["findings"] == ["collective_hang"] and doc["ranks"][0]["coll"]["outstanding"] == 1


def test_restart_resolves_the_death_and_journals_it(make):
    c = make(job="job", world_size=2, resolve_grace_s=0.0)
    c.accept(t.report("h", [t.rank(0, world_size=2), t.rank(1, world_size=2)], seq=1), 10.0)
    c.accept(t.report("h", [t.rank(0, world_size=2), t.rank(1, world_size=2, alive=False)], seq=2), 11.0)
    assert [f.key for f in c.tick(11.5, 1.7e9).opened] == [("dead_rank", (1,))]
    new = [t.rank(r, world_size=2, pid=7000 + r, proc_start_us=1_800_000_000_000_000, step=0) for r in (0, 1)]
    c.accept(t.report("h", new, seq=3), 20.0)
    result = c.tick(20.5, 1.7e9 + 10)
    assert [r.finding.key for r in result.resolved] == [("dead_rank", (1,))]
    assert result.resolved[0].duration_s == pytest.approx(20.5 - 10.8, abs=0.01)
    events = [r["event"] for r in journal.read(c.journal.path)]
    assert events.count(je.RANK_RESTARTED) == 2 and je.RESOLVED in events
    resolved = next(r for r in journal.read(c.journal.path) if r["event"] == je.RESOLVED)
    assert resolved["kind"] == "dead_rank" and resolved["ranks"] == [1] and resolved["duration_s"] > 9


def test_a_raising_detector_is_counted_and_the_rest_still_run(make):
    c = make(job="job", world_size=8)

    class Boom:
        name = "straggler"

        def check(self, now, view):
            raise ZeroDivisionError("oops")

    c.runner.detectors = tuple(Boom() if d.name == "straggler" else d for d in c.runner.detectors)
    states = t.with_rank(t.healthy(), 2, alive=False)
    c.accept(t.report("host0", states[:4]), 10.0)
    c.accept(t.report("host1", states[4:]), 10.0)
    for now in (10.5, 11.0):
        result = c.tick(now, 1.7e9)
    assert count(c, "watchdog_detector_errors_total", detector="straggler") == 2
    assert count(c, "watchdog_detector_success", detector="straggler") == 0
    assert count(c, "watchdog_detector_success", detector="dead_rank") == 1
    assert findings(c) == [("dead_rank", (2,))] and all(o.ok for o in result.outcomes if o.name != "straggler")


def test_a_detector_whose_gauges_raise_is_isolated_like_a_raising_check(make):
    c = make(job="job", world_size=8)
    sim = SimJob(jitter=0.1, seed=11)
    sim.slow(3, 1.3)
    sim.hang(6, 300)
    sim.run_until(30.0, coordinator=c, tick_s=0.5)
    score = count(c, "watchdog_coordinator_straggler_score", rank="3")
    assert score > 1.2 and count(c, "watchdog_detector_errors_total", detector="straggler") == 0

    class GaugesBoom:
        def __init__(self, det):
            self.name, self.check = det.name, det.check

        def gauges(self, now, view):
            raise ZeroDivisionError("oops")

    c.runner.detectors = tuple(GaugesBoom(d) if d.name == "straggler" else d for d in c.runner.detectors)
    sim.run_until(60.0, coordinator=c, tick_s=0.5)
    assert count(c, "watchdog_detector_errors_total", detector="straggler") == 60  # every tick, like a raising check
    assert count(c, "watchdog_detector_success", detector="straggler") == 0
    assert count(c, "watchdog_coordinator_straggler_score", rank="3") == score  # kept: neither zeroed nor removed
    assert count(c, "watchdog_coordinator_hang_seconds") > 10  # the other detectors' gauges still move
    assert ("collective_hang", (6,)) in findings(c)


def test_host_loss_is_journaled_once(make):
    c = make(job="job", world_size=8)
    c.accept(t.report("host0", t.healthy()[:4]), 10.0)
    c.accept(t.report("host1", t.healthy()[4:]), 10.0)
    # host0's ranks then fail inside all-reduce #101 that host1's never entered: evidence host1 is gone.
    failed = [
        t.rank(r, alive=False, collective=t.coll(seq=101, outstanding=1, since_s=2.0), step_age_s=3.0) for r in range(4)
    ]
    c.accept(t.report("host0", failed, seq=2), 15.0)
    for now in (15.5, 16.0, 16.5):
        c.tick(now, 1.7e9)
    events = [r for r in journal.read(c.journal.path) if r["event"] in (je.HOST_LOST, je.FINDING)]
    assert [(r["event"], r.get("host") or r.get("hosts")) for r in events] == [
        (je.HOST_LOST, "host1"),
        (je.FINDING, ["host1"]),
    ]
    assert count(c, "watchdog_coordinator_hosts", state="lost") == 1


def test_journal_failure_does_not_stop_detection(make, monkeypatch):
    c = make(job="job", world_size=8)

    def broken(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(c.journal, "write", broken)
    c.accept(t.report("host0", t.with_rank(t.healthy(), 1, alive=False)[:4]), 10.0)
    result = c.tick(10.5, 1.7e9)
    assert [f.key for f in result.opened] == [("dead_rank", (1,))]
    assert count(c, "watchdog_coordinator_journal_errors_total") >= 1


def test_finding_walls_come_from_the_tick_clock(make):
    c = make(job="job", world_size=8)
    c.accept(t.report("host0", [replace(t.rank(1), alive=False, heartbeat_age_s=0.4)]), 100.0)
    (f,) = c.tick(101.0, 5000.0).opened
    assert f.detected_wall == 5000.0 and f.onset_wall == pytest.approx(5000.0 - (101.0 - f.onset_mono))


def test_status_table_renders_missing_ranks_and_lost_hosts(make):
    from watchdog.coordinator.cli.status import render

    c = make(job="job", world_size=6)
    c.accept(t.report("host0", [t.rank(r, world_size=6, in_data_wait=r == 1) for r in range(4)]), 10.0)
    c.accept(t.report("host1", [t.rank(4, world_size=6)]), 3.0)
    c.tick(10.5, 1.7e9)
    text = render(c.status(10.5, 1.7e9))
    lines = text.splitlines()
    assert lines[0] == "job job: 5/6 ranks registered, 2 hosts (1 unobserved, its agent silent: host1)"
    assert lines[2].split() == [
        "RANK",
        "HOST",
        "HEALTH",
        "STEP",
        "PHASE",
        "STEP_MS",
        "DATA_MS",
        "COMP_MS",
        "COLL_MS",
        "HB_AGE",
        "FINDINGS",
    ]
    row = {ln.split()[0]: ln.split() for ln in lines[3:9]}
    assert row["1"][4] == "train/data" and row["4"][2] == "unobserved" and row["4"][-1] == "-"
    assert row["5"][1:3] == ["-", "missing"]
    assert "[host_unobserved] host host1: no report from its agent" in text


def test_the_views_a_tick_reads_carry_the_folders_columns(make):
    """The detectors read the columns the Folder kept as reports folded, also from
    the copy of the view a late coordinator makes (its lag in the silence limits),
    never columns rebuilt from the rank objects (what they are there to avoid)."""
    from watchdog.coordinator.view import columns

    c = make(job="job", world_size=8)
    for h in range(2):
        c.accept(t.report(f"host{h}", t.healthy(8)[4 * h : 4 * h + 4]), 10.0)
    calm = c.view_at(10.5)
    c.backpressure.observe_lag(0.8, 10.5)  # the request loop ran late
    late = c.view_at(10.6)
    assert late.behind_s > 0 and late is not calm
    for v in (calm, late):
        kept = columns.cached(v)
        assert kept is not None and list(kept.rank) == list(v.ranks)
