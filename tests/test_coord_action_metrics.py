"""The job's state and its actions as metrics, counted from the control loop's
own events: a restart that fails and escalates to an abort, a dry run, and the
coordinator's registry after a real restart decision."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import CollectorRegistry
from test_coord_actions import RESTART, coordinator, finding, gone, old_view, stuck_in_init

from watchdog.coordinator import testing as T
from watchdog.coordinator.control.action_metrics import ActionMetrics
from watchdog.coordinator.control.loop import JobController
from watchdog.coordinator.metrics import CoordinatorMetrics
from watchdog.coordinator.recovery import abort
from watchdog.coordinator.vocabularies import JobState


def value(registry, name, **labels):
    return registry.get_sample_value(name, labels) or 0.0


def one_hot(registry) -> str:
    on = [s.value for s in JobState if value(registry, "watchdog_coordinator_job_state", state=s.value) == 1]
    assert len(on) == 1, on
    return on[0]


def test_a_failed_restart_and_the_abort_it_escalates_to():
    reg = CollectorRegistry()
    m = ActionMetrics(CoordinatorMetrics(reg))
    c, v = JobController(replace(RESTART, resume_timeout_s=60)), old_view()

    def tick(findings, view, now):
        reqs, events = T.with_lines(c.tick(findings, view, now))
        for name, payload in events:
            m.note(name, payload)
        return reqs

    assert one_hot(reg) == "running"
    tick([finding()], v, 101.0)
    assert one_hot(reg) == "restarting"
    assert value(reg, "watchdog_coordinator_actions_total", action="restart", outcome="started") == 1
    assert value(reg, "watchdog_coordinator_restarts_total") == 1
    v = gone(v, 102.0)
    tick([], v, 102.0)
    v = stuck_in_init(v, 110.0)
    tick([], v, 162.5)  # the resume timeout: restart failed, abort (stacks first)
    assert value(reg, "watchdog_coordinator_actions_total", action="restart", outcome="failed") == 1
    assert value(reg, "watchdog_coordinator_actions_total", action="restart", outcome="succeeded") == 0
    assert value(reg, "watchdog_coordinator_actions_total", action="abort", outcome="started") == 1
    assert one_hot(reg) == "aborting"
    tick([], v, 162.5 + abort.STACKS_WAIT_S)

    v = T.view([replace(v.ranks[r].state, alive=False) for r in range(4)], 180.0, base=v, seq=5)
    tick([], v, 180.0)
    assert one_hot(reg) == "failed"
    assert value(reg, "watchdog_coordinator_actions_total", action="abort", outcome="succeeded") == 1
    assert value(reg, "watchdog_coordinator_restarts_total") == 1  # the abort is no restart


def test_a_dry_run_is_counted_as_one_and_never_as_a_success():
    reg = CollectorRegistry()
    m = ActionMetrics(CoordinatorMetrics(reg))
    c = JobController(replace(RESTART, dry_run=True))
    for name, payload in T.lines(c.tick([finding()], old_view(), 101.0)[1]):
        m.note(name, payload)
    assert value(reg, "watchdog_coordinator_actions_total", action="restart", outcome="dry_run") == 1
    for outcome in ("started", "succeeded", "failed"):
        assert value(reg, "watchdog_coordinator_actions_total", action="restart", outcome=outcome) == 0
    assert value(reg, "watchdog_coordinator_restarts_total") == 0
    assert one_hot(reg) == "degraded"


def test_the_coordinator_exports_its_decision(tmp_path):
    from watchdog.coordinator.testing import SimJob

    c = coordinator(tmp_path, policy=RESTART)
    sim = SimJob(jitter=0.1, seed=11)
    sim.hang(3, 40)
    sim.run_until(40.0, coordinator=c, tick_s=0.5)
    reg = c.registry
    assert value(reg, "watchdog_coordinator_actions_total", action="restart", outcome="started") == 1
    assert value(reg, "watchdog_coordinator_restarts_total") == 1
    assert one_hot(reg) == "restarting"
    c.journal.close()


def test_a_restarted_coordinator_exports_the_state_it_rebuilt_from_the_journal(tmp_path):
    from watchdog.coordinator.testing import SimJob

    c = coordinator(tmp_path, policy=RESTART)
    sim = SimJob(jitter=0.1, seed=11)
    sim.hang(3, 40)
    sim.run_until(40.0, coordinator=c, tick_s=0.5)
    assert one_hot(c.registry) == "restarting"
    c.journal.close()
    again = coordinator(tmp_path, policy=RESTART)  # the same journal, killed mid-restart
    assert one_hot(again.registry) == "running"  # nothing replayed yet
    again.recover(0.0, 1.7e9)
    assert one_hot(again.registry) == "restarting"
    again.journal.close()
