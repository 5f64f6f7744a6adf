"""The job controller and its actions: pure, no processes, no sleeps. Time moves
by editing numbers; the view is folded from made-up reports."""

from __future__ import annotations

from dataclasses import replace
from typing import TypedDict

from watchdog.contracts import commands
from watchdog.contracts.finding import Finding
from watchdog.coordinator import testing as T
from watchdog.coordinator.control.loop import JobController
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.policy_file import Policy
from watchdog.coordinator.recovery import abort, restart
from watchdog.coordinator.vocabularies import JobState

S = JobState


class Launcher(TypedDict):
    launcher_pid: int
    launcher_start_us: int


LAUNCHER: Launcher = {"launcher_pid": 500, "launcher_start_us": 77}


def finding(kind="collective_hang", ranks=(2,), detected=100.0):
    return Finding(
        kind=kind,
        ranks=ranks,
        hosts=("host0",),
        reason=f"{kind} on {list(ranks)}",
        onset_mono=95.0,
        detected_mono=detected,
    )


def old_view(now=100.0, **changes):
    return T.view([T.rank(r, world_size=4, **LAUNCHER, **changes) for r in range(4)], now)


def gone(view, now, ranks=range(4)):
    states = [replace(view.ranks[r].state, alive=False) if r in ranks else view.ranks[r].state for r in range(4)]
    return T.view(states, now, base=view, seq=2)


def resumed(view, now, at_step=30):
    new = [
        T.rank(
            r,
            world_size=4,
            pid=2000 + r,
            proc_start_us=1_800_000_000_000_000,
            step=at_step + 2,
            recent_steps=T.steps(at_step + 1, 2),
            **LAUNCHER,
        )
        for r in range(4)
    ]
    return T.view(new, now, base=view, seq=3)


def names(events):
    return [n for n, _ in events]


def signals(reqs):
    return [(r.args["signal"], r.target["rank"], r.target["pid"]) for r in reqs if r.type == commands.SIGNAL]


RESTART = Policy(
    actions={"collective_hang": "restart", "dead_rank": "restart"}, min_finding_age_s=0, cooldown_s=30, abort_grace_s=5
)
ABORT = replace(RESTART, actions={"collective_hang": "abort"})


def test_default_policy_never_acts():
    c = JobController()
    reqs, events = T.with_lines(c.tick([finding()], old_view(), 200.0))
    assert reqs == [] and names(events) == ["state"] and c.state is S.DEGRADED
    reqs, events = T.with_lines(c.tick([], old_view(), 201.0))
    assert reqs == [] and events == [(je.STATE, {"job_state": "running", "from": "degraded", "on": "findings_clear"})]


def test_advice_leaves_the_job_running():
    # periodic_stall, batch_changed: nothing is broken, so the job is not degraded by them
    c = JobController(Policy(actions={"collective_hang": "alert"}))
    for kind in ("periodic_stall", "batch_changed"):
        reqs, events = T.with_lines(c.tick([finding(kind, ranks=(0,))], old_view(), 200.0))
        assert reqs == [] and events == [] and c.state is S.RUNNING
    reqs, events = T.with_lines(c.tick([finding("periodic_stall", ranks=(0,)), finding()], old_view(), 201.0))
    assert names(events) == ["state"] and c.state is S.DEGRADED


def test_restart_stops_the_old_workers_then_sees_the_group_resume():
    c, v = JobController(RESTART), old_view()
    reqs, events = T.with_lines(c.tick([finding()], v, 101.0))
    assert names(events) == [je.STATE, je.ACTION, je.STATE, je.ACTION_PROGRESS]
    assert events[1][1]["action"] == "restart" and events[1][1]["restart"] == 1
    assert events[1][1]["reason"].startswith("collective_hang:")
    assert signals(reqs) == [("SIGTERM", r, 1000 + r) for r in range(4)]  # workers only, never the launcher
    assert c.state is S.RESTARTING
    # Nothing new before the grace period; the finding is still open but held.
    assert c.tick([finding()], v, 103.0) == ([], [])
    reqs, events = T.with_lines(c.tick([finding()], v, 106.5))
    assert signals(reqs) == [("SIGKILL", r, 1000 + r) for r in range(4)]
    v = gone(v, 107.0)
    reqs, events = T.with_lines(c.tick([], v, 107.0))
    assert reqs == [] and names(events) == ["restart"] and events[0][1]["restart"] == 1
    v = resumed(v, 110.0, at_step=30)
    reqs, events = T.with_lines(c.tick([], v, 110.0))
    assert names(events) == [je.RESUMED, je.ACTION_OUTCOME, je.STATE]
    assert (events[0][1]["restart"], events[0][1]["step"]) == (1, 30)
    # The job had reached step 100 when the hang stopped it: 70 steps to do again.
    assert events[0][1]["steps_lost"] == 70 and events[1][1]["result"].endswith("resumed from step 30 (70 steps lost)")
    assert events[1][1]["ok"] is True and c.state is S.RUNNING and c.op is None
    # The cooldown counts from the end of the action.
    reqs, events = T.with_lines(c.tick([finding(detected=111.0)], v, 120.0))
    assert reqs == [] and je.ACTION not in names(events)


def test_a_rank_that_registered_after_the_finding_is_never_signalled():
    v = old_view(now=100.0)
    v = T.view([T.rank(1, world_size=4, pid=3001, **LAUNCHER)], 102.0, base=v, seq=2)  # torchrun restarted it
    c = JobController(RESTART)
    reqs, events = T.with_lines(c.tick([finding("dead_rank", (1,), detected=101.0)], v, 103.0))
    # rank 1 is gone: its launcher gets the grace period to stop the rest itself
    assert reqs == [] and [p["phase"] for n, p in events if n == je.ACTION_PROGRESS] == ["launcher"]
    reqs, _ = c.tick([], v, 103.0 + restart.LAUNCHER_GRACE_S)
    assert [s[1] for s in signals(reqs)] == [0, 2, 3]


def test_workers_all_gone_are_the_launchers_restart_and_never_restarted_again():
    v = old_view(now=100.0, alive=False)
    c = JobController(RESTART)
    reqs, events = T.with_lines(c.tick([finding("dead_rank", (1,))], v, 101.0))
    assert signals(reqs) == []
    (launcher,) = [p for n, p in events if n == je.LAUNCHER_RESTART]
    assert launcher["restart"] == 1 and launcher["gone"] == [0, 1, 2, 3], launcher
    assert je.RESTART not in names(events) and je.ACTION_PROGRESS not in names(events)
    reqs, events = T.with_lines(c.tick([finding("dead_rank", (1,))], v, 101.5))
    assert reqs == [] and events == []
    v = resumed(v, 110.0, at_step=30)
    reqs, events = T.with_lines(c.tick([], v, 110.0))
    assert reqs == [] and names(events) == [je.RESUMED, je.ACTION_OUTCOME, je.STATE]
    assert events[1][1]["result"] == "restart 1 (by the launcher), resumed from step 30 (70 steps lost)"


def stuck_in_init(view, now, ranks=range(4)):
    """torchrun restarted the group; the new workers hang inside init_process_group
    (a script without the attempt-prefixed store)."""
    new = [
        T.rank(
            r,
            world_size=4,
            pid=2000 + r,
            proc_start_us=1_800_000_000_000_000,
            step=0,
            pg_state="initializing",
            pg_age_s=5.0,
            collective=T.coll(),
            **LAUNCHER,
        )
        for r in ranks
    ]
    return T.view(new, now, base=view, seq=3)


def test_restart_that_never_resumes_is_an_outcome_and_escalates_to_an_abort_with_stacks():
    c, v = JobController(replace(RESTART, resume_timeout_s=60)), old_view()
    c.tick([finding()], v, 101.0)
    v = gone(v, 102.0)
    c.tick([], v, 102.0)
    v = stuck_in_init(v, 110.0)
    assert c.tick([], v, 161.0) == ([], [])  # within the resume timeout: still waiting
    reqs, events = T.with_lines(c.tick([], v, 162.5))
    assert names(events) == [je.ACTION_OUTCOME, je.ACTION, je.STATE]
    outcome, action = events[0][1], events[1][1]
    assert outcome["ok"] is False and outcome["action_id"] == "a-1"
    assert outcome["result"] == (
        "restart failed: ranks 0-3 stuck inside init_process_group (60.5 s after the old workers were gone)"
    ), outcome
    assert (action["action"], action["action_id"], action["escalated_from"]) == ("abort", "a-2", "a-1")
    assert action["reason"].startswith("restart failed: ranks 0-3 stuck inside init_process_group")
    assert "escalating to abort" in action["reason"]
    assert events[2][1] == {"job_state": "aborting", "from": "restarting", "on": "abort"}
    # The abort's first step: every stuck rank's stack, the new incarnations (never the old pids).
    (dump,) = [r for r in reqs if r.type == commands.DUMP_STACKS]
    assert [(t["rank"], t["pid"]) for t in dump.targets] == [(r, 2000 + r) for r in range(4)]
    # Then it stops them and the job has failed, with the reason on record.
    reqs, events = T.with_lines(c.tick([], v, 162.5 + abort.STACKS_WAIT_S))
    assert ("SIGTERM", -1, 500) in signals(reqs) and ("SIGTERM", 2, 2002) in signals(reqs)
    v = T.view([replace(v.ranks[r].state, alive=False) for r in range(4)], 180.0, base=v, seq=5)
    _, events = T.with_lines(c.tick([], v, 180.0))
    assert names(events) == [je.ACTION_OUTCOME, je.STATE] and c.state is S.FAILED
    assert c.tick([finding(detected=500.0)], v, 1000.0) == ([], [])  # a failed job gets nothing more


def test_restart_failed_says_which_ranks_never_came_back_and_which_died_again():
    c, v = JobController(replace(RESTART, resume_timeout_s=30)), old_view()
    c.tick([finding()], v, 101.0)
    v = gone(v, 102.0)
    c.tick([], v, 102.0)
    v = stuck_in_init(v, 110.0, ranks=(0, 1))
    v = T.view(
        [replace(v.ranks[1].state, alive=False, death={"summary": "ValueError: bad shard at data.py:9, exit 1"})],
        111.0,
        base=v,
        seq=4,
    )
    _, events = T.with_lines(c.tick([], v, 133.0))
    assert events[0][1]["result"] == (
        "restart failed: rank 0 stuck inside init_process_group; rank 1 died again: "
        "ValueError: bad shard at data.py:9, exit 1; ranks 2-3 never came back (no new "
        "process registered) (31.0 s after the old workers were gone)"
    ), events[0][1]


def test_an_abort_says_which_ranks_no_signal_can_stop():
    c, v = JobController(replace(ABORT, abort_grace_s=3)), old_view()
    c.tick([finding()], v, 101.0)
    c.tick([], v, 101.0 + abort.STACKS_WAIT_S)  # no stacks came back: SIGTERM
    v = T.view(
        [replace(v.ranks[r].state, proc_status="disk-sleep" if r == 2 else "sleeping", alive=r == 2) for r in range(4)],
        120.0,
        base=v,
        seq=2,
    )
    reqs, _ = c.tick([], v, 120.0)
    assert signals(reqs) == [("SIGKILL", -1, 500), ("SIGKILL", 2, 1002)]
    _, events = T.with_lines(c.tick([], v, 123.5))  # one round later, still in D state: reported, not waited on forever
    assert names(events) == [je.ACTION_OUTCOME, je.STATE] and c.state is S.FAILED
    assert events[0][1]["d_state"] == [2] and "rank 2 in uninterruptible sleep (D state)" in events[0][1]["result"]


def test_abort_takes_every_stack_first_then_signals_the_launcher_before_the_workers():
    v = T.view([T.rank(r, world_size=8, launcher_pid=500 + r // 4, launcher_start_us=77) for r in range(8)], 100.0)
    c = JobController(ABORT)
    reqs, events = T.with_lines(c.tick([finding()], v, 101.0))
    assert c.state is S.ABORTING
    assert [(r.type, r.host, r.ranks) for r in reqs] == [
        ("dump_stacks", "host0", [0, 1, 2, 3]),
        ("dump_stacks", "host1", [4, 5, 6, 7]),
    ]
    assert reqs[0].trigger["action"] == events[1][1]["action_id"]
    assert c.tick([finding()], v, 102.0) == ([], [])  # waiting for the stacks
    assert c.op is not None
    aid = c.op.id
    c.note(je.EVIDENCE, {"type": "dump_stacks", "host": "host0", "trigger": {"action": aid}})
    c.note(je.EVIDENCE, {"type": "dump_stacks", "host": "host1", "trigger": {"action": "a-other"}})
    assert c.tick([finding()], v, 102.5) == ([], [])  # host1 has not answered this action
    c.note(je.COMMAND_EXPIRED, {"type": "dump_stacks", "host": "host1", "trigger": {"action": aid}})
    reqs, events = T.with_lines(c.tick([finding()], v, 103.0))
    sig = signals(reqs)
    assert sig[:2] == [("SIGTERM", -1, 500), ("SIGTERM", -1, 501)]  # one launcher per host, first
    assert sorted(s[1] for s in sig[2:]) == list(range(8))
    assert names(events) == ["action_progress"]
    reqs, _ = c.tick([finding()], gone(v, 108.5, ranks=range(4)), 108.5)  # grace over, host1's ranks live on
    assert ("SIGKILL", -1, 500) in signals(reqs) and sorted(s[1] for s in signals(reqs) if s[1] >= 0) == [4, 5, 6, 7]
    v = T.view([replace(s.state, alive=False) for s in v.ranks.values()], 109.0, base=v, seq=3)
    reqs, events = T.with_lines(c.tick([finding()], v, 109.0))
    assert names(events) == [je.ACTION_OUTCOME, je.STATE] and events[0][1]["ok"] is True
    assert c.state is S.FAILED


def test_abort_does_not_wait_forever_for_stacks():
    c, v = JobController(ABORT), old_view()
    c.tick([finding()], v, 101.0)
    reqs, _ = c.tick([finding()], v, 101.0 + abort.STACKS_WAIT_S)
    assert signals(reqs)[0] == ("SIGTERM", -1, 500)


def test_exhausted_budget_aborts_with_the_reason():
    c = JobController(replace(RESTART, max_restarts=0))
    reqs, events = T.with_lines(c.tick([finding()], old_view(), 101.0))
    action = dict(events)["action"]
    assert action["action"] == "abort" and "restart budget exhausted" in action["reason"]
    assert all(r.type == "dump_stacks" for r in reqs) and c.state is S.ABORTING


def test_dry_run_journals_and_does_nothing():
    c = JobController(replace(RESTART, dry_run=True))
    reqs, events = T.with_lines(c.tick([finding()], old_view(), 101.0))
    assert reqs == [] and names(events) == [je.STATE, je.ACTION, je.ACTION_OUTCOME]
    assert dict(events)["action"]["dry_run"] is True and c.state is S.DEGRADED
    assert c.tick([finding()], old_view(), 102.0)[0] == []  # cooldown: not every tick


def test_exclude_host_restart_also_stops_the_culprit_hosts_launcher():
    pol = Policy(actions={"collective_hang": "exclude_host_restart"}, min_finding_age_s=0)
    v = T.view([T.rank(r, world_size=8, launcher_pid=500 + r // 4, launcher_start_us=77) for r in range(8)], 100.0)
    reqs, _ = JobController(pol).tick([finding()], v, 101.0)  # the finding is on host0
    sig = signals(reqs)
    assert sig[0] == ("SIGTERM", -1, 500) and ("SIGTERM", -1, 501) not in sig


# -- wired into the coordinator ---------------------------------------------------


def coordinator(tmp_path, **kw):
    from watchdog.coordinator.config import Config
    from watchdog.coordinator.journal.jsonl import Journal
    from watchdog.coordinator.service import Coordinator

    path = str(tmp_path / "journal.jsonl")
    return Coordinator(
        Config(journal=path, job="job", world_size=8, tick_s=0.5, token="secret", **kw),
        Journal(path, lambda: (1.7e9, 0.0)),
    )


def test_coordinator_journals_the_action_and_queues_signed_signals(tmp_path):
    from watchdog.coordinator.journal import jsonl as journal
    from watchdog.coordinator.testing import SimJob

    c = coordinator(tmp_path, policy=RESTART)
    sim = SimJob(jitter=0.1, seed=11)
    sim.hang(3, 40)
    sim.run_until(40.0, coordinator=c, tick_s=0.5)
    recs = journal.read(c.journal.path)
    events = [r["event"] for r in recs]
    assert events.index(je.FINDING) < events.index(je.ACTION) < events.index(je.ACTION_PROGRESS)
    action = next(r for r in recs if r["event"] == je.ACTION)
    assert action["action"] == "restart" and action["kind"] == "collective_hang"
    states = [r["job_state"] for r in recs if r["event"] == je.STATE and "job_state" in r]
    assert states[:2] == ["degraded", "restarting"]
    sent = [r for r in recs if r["event"] == je.COMMAND and r["type"] == "signal"]
    assert sent and all(r["signed"] and r["args"] == {"signal": "SIGTERM"} for r in sent[:8])
    c.journal.close()


def test_a_broken_action_never_stops_detection(tmp_path):
    c = coordinator(tmp_path, policy=RESTART)

    def broken(*a, **k):
        raise RuntimeError("bug")

    c.control.tick = broken
    c.tick(1.0, 1.7e9)
    c.tick(2.0, 1.7e9)
    assert c.control.errors == 2
    c.journal.close()


def test_a_bad_policy_file_is_a_clear_startup_error(tmp_path, capsys):
    from watchdog.coordinator.cli.coordinator import main

    bad = tmp_path / "p.toml"
    bad.write_text('[actions]\ndead_rank = "reboot"\n')
    assert main(["--policy.file", str(bad), "--journal", str(tmp_path / "j")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "'reboot'" in err


# -- checkpoint_restart -------------------------------------------------------------

CKPT = Policy(
    actions={"straggler": "checkpoint_restart"}, min_finding_age_s=0, checkpoint_timeout_s=60, abort_grace_s=5
)


def acked(view, now, step, ok=True, ranks=range(4), at=None):
    states = [
        replace(view.ranks[r].state, ctrl_ack_seq=1, ctrl_ack_step=step if at is None else at, ctrl_ack_ok=ok)
        if r in ranks
        else view.ranks[r].state
        for r in range(4)
    ]
    return T.view(states, now, base=view, seq=2)


def test_checkpoint_restart_asks_every_rank_for_one_step_ahead_then_restarts_when_all_saved():
    c, v = JobController(CKPT), old_view(last_step_s=0.1)  # every rank at step 100
    reqs, events = T.with_lines(c.tick([finding("straggler", (2,))], v, 101.0))
    assert c.state is S.CHECKPOINTING
    (req,) = reqs
    step = req.args["step"]
    assert req.type == commands.CHECKPOINT and [t["rank"] for t in req.args["ranks"]] == [0, 1, 2, 3]
    assert step == 100 + 40  # LEAD_S (4 s) of 0.1 s steps ahead of the fastest rank
    assert c.tick([], acked(v, 102.0, step, ranks=(0, 1, 2)), 102.0)[0] == []  # rank 3 not yet
    reqs, events = T.with_lines(c.tick([], acked(v, 103.0, step), 103.0))
    assert names(events)[:3] == [je.CHECKPOINTED, je.ACTION_PROGRESS, je.STATE] and c.state is S.RESTARTING
    assert dict(events)["checkpointed"]["step"] == step
    assert signals(reqs) == [("SIGTERM", r, 1000 + r) for r in range(4)]
    v = resumed(gone(v, 104.0), 106.0, at_step=step)
    c.tick([], gone(v, 104.0), 104.0)
    _, events = T.with_lines(c.tick([], v, 106.0))
    assert dict(events)["resumed"]["step"] == step and c.state is S.RUNNING


def test_checkpoint_restart_falls_back_to_a_restart_when_a_rank_saved_late_or_never():
    c, v = JobController(CKPT), old_view(last_step_s=0.1)
    ask = c.tick([finding("straggler", (2,))], v, 101.0)[0][0]
    assert ask.args is not None
    step = ask.args["step"]
    reqs, events = T.with_lines(c.tick([], acked(v, 102.0, step, at=step + 3, ranks=(1,)), 102.0))
    assert names(events)[0] == je.CHECKPOINT_FAILED and "rank 1 saved at" in events[0][1]["error"]
    assert signals(reqs) and c.state is S.RESTARTING
    c2 = JobController(CKPT)
    c2.tick([finding("straggler", (2,))], v, 101.0)
    assert c2.tick([], v, 150.0)[0] == []
    reqs, events = T.with_lines(c2.tick([], v, 161.0))
    assert names(events)[0] == je.CHECKPOINT_FAILED and "within 60 s" in events[0][1]["error"] and signals(reqs)


def test_findings_about_the_workers_an_action_stopped_name_the_action():
    c, v = JobController(RESTART), old_view()
    c.tick([finding()], v, 101.0)
    assert c.op is not None
    assert c.caused_by(finding("dead_rank", (0, 1, 2, 3), detected=102.0), 102.0) == c.op.id
    assert c.caused_by(finding("straggler", (1,), detected=102.0), 102.0) == ""
    c2 = JobController(RESTART)
    assert c2.caused_by(finding("dead_rank", (1,)), 102.0) == ""  # no action: a real fault


def test_held_actions_are_journaled_once_per_reason_not_every_tick():
    c, v = JobController(replace(RESTART, min_finding_age_s=5)), old_view()
    held = [
        e for t in (101.0, 101.5, 102.0, 103.0) for e in T.lines(c.tick([finding()], v, t)[1]) if e[0] == je.ACTION_HELD
    ]
    assert len(held) == 1 and "finding is 1.0 s old" in held[0][1]["reason"]


def test_a_restarted_group_that_died_again_fails_without_waiting_out_the_resume_timeout():
    c, v = JobController(replace(RESTART, resume_timeout_s=300)), old_view()
    c.tick([finding()], v, 101.0)
    v = gone(v, 102.0)
    c.tick([], v, 102.0)
    v = stuck_in_init(v, 110.0)
    crash = {"summary": "RuntimeError: Gloo connectFullMesh failed at train.py:12, exit 1"}
    v = T.view(
        [replace(v.ranks[r].state, alive=False, gone_age_s=0.5, death=crash) for r in range(4)], 111.0, base=v, seq=4
    )
    assert c.tick([], v, 125.0) == ([], [])  # torchrun may still start another attempt
    _, events = T.with_lines(c.tick([], v, 131.0))
    assert events[0][1]["result"].startswith(
        "restart failed: ranks 0-3 died again: RuntimeError: Gloo connectFullMesh"
    ), events[0][1]
    assert events[1][1]["action"] == "abort"
