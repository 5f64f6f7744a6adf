"""A coordinator restarted on its journal carries on: the restart budget, the
cooldown, open findings and the action in flight are rebuilt (control/replay.py), so
an action already taken is never repeated and the budget never resets.

The first controller's events are journaled with wall = WALL0 + its monotonic
time; the second starts later on its own clocks. No sleeps."""

from __future__ import annotations

from dataclasses import replace
from typing import TypedDict

from watchdog.contracts import commands
from watchdog.contracts.finding import Finding
from watchdog.coordinator import testing as T
from watchdog.coordinator.control import replay as recover
from watchdog.coordinator.control.loop import JobController
from watchdog.coordinator.detectors import tracker
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.policy_file import Policy
from watchdog.coordinator.vocabularies import JobState

S = JobState
WALL0 = 1_700_000_000.0


class Launcher(TypedDict):
    launcher_pid: int
    launcher_start_us: int


LAUNCHER: Launcher = {"launcher_pid": 500, "launcher_start_us": 77}
POLICY = Policy(
    actions={"dead_rank": "restart", "collective_hang": "abort"},
    min_finding_age_s=0,
    cooldown_s=60,
    abort_grace_s=5,
    max_restarts=1,
)


def finding(kind="dead_rank", ranks=(1,), detected=100.0):
    return Finding(
        kind=kind,
        ranks=ranks,
        hosts=("host0",),
        reason=f"{kind} on {list(ranks)}",
        onset_mono=99.0,
        detected_mono=detected,
        onset_wall=WALL0 + 99.0,
        detected_wall=WALL0 + detected,
    )


def old_view(now=100.0):
    return T.view([T.rank(r, world_size=4, **LAUNCHER) for r in range(4)], now)


def new_view(now, seq=1, step=22):
    return T.view(
        [
            T.rank(
                r,
                world_size=4,
                pid=2000 + r,
                proc_start_us=1_800_000_000_000_000,
                step=step,
                recent_steps=T.steps(step - 1, 2),
                **LAUNCHER,
            )
            for r in range(4)
        ],
        now,
        seq=seq,
    )


class Journaled:
    """What the service would have written: every event at its tick's wall time."""

    def __init__(self) -> None:
        self.records: list[dict] = [{"event": je.START, "t_wall": WALL0, "job": "job"}]

    def add(self, now: float, events) -> None:
        self.records += [{"event": name, "t_wall": WALL0 + now, **payload} for name, payload in events]

    def tick(self, c: JobController, findings, view, now):
        reqs, events = T.with_lines(c.tick(findings, view, now))
        self.add(now, events)
        return reqs, events


def names(events):
    return [n for n, _ in events]


def sigs(reqs):
    return [(r.args["signal"], r.target["rank"], r.target["pid"]) for r in reqs if r.type == commands.SIGNAL]


def restarted(records, now, pol=POLICY):
    """A new coordinator process: its clocks read ``now`` (mono) and WALL0 + now (wall)."""
    rec = recover.replay(records, now, WALL0 + now, "job", pol)
    c = JobController(pol)
    c.restore(rec, now)
    return c, rec


def test_killed_after_the_old_workers_were_gone_it_sees_the_resume_and_never_restarts_again():
    j, c = Journaled(), JobController(POLICY)
    j.tick(c, [finding()], old_view(), 101.0)
    dead = T.view([replace(s.state, alive=False) for s in old_view().ranks.values()], 102.0, base=old_view(), seq=2)
    _, events = j.tick(c, [], dead, 102.0)
    assert names(events) == [je.RESTART]
    # -- the coordinator is SIGKILLed here; a new one starts 20 s later on the same journal --
    c2, rec = restarted(j.records, 122.0)
    s = rec.summary(122.0)
    assert (s["job_state"], s["restarts_used"], s["next_action_id"]) == ("restarting", 1, "a-2")
    assert s["in_flight"] == {
        "action_id": "a-1",
        "action": "restart",
        "phase": "resume",
        "restart": 1,
        "workers": [0, 1, 2, 3],
        "started_again": False,
    }
    assert c2.tick([finding(detected=122.0)], T.view([], 122.0), 122.0) == ([], [])  # no agent heard yet: wait
    v = new_view(123.0)
    reqs, events = T.with_lines(c2.tick([], v, 123.0))
    assert reqs == [] and names(events) == [je.RESUMED, je.ACTION_OUTCOME, je.STATE]
    assert events[1][1]["action_id"] == "a-1" and events[1][1]["ok"] is True
    assert events[0][1]["steps_lost"] == 100 - events[0][1]["step"]  # the step reached, from the journal
    # The budget and the failure it was spent on survived: the next dead rank, after
    # the cooldown, aborts instead of restarting; it is a dead rank on the same host
    # again, which the repeat breaker names first.
    reqs, events = T.with_lines(c2.tick([finding(ranks=(2,), detected=190.0)], v, 190.0))
    action = dict(events)[je.ACTION]
    assert (action["action_id"], action["action"]) == ("a-2", "abort")
    assert "the same failure at the same place after 1 restart(s)" in action["reason"]


def test_killed_while_the_old_workers_were_stopping_it_signals_only_those_processes():
    j, c = Journaled(), JobController(POLICY)
    reqs, _ = j.tick(c, [finding()], old_view(), 101.0)
    assert sigs(reqs) == [("SIGTERM", r, 1000 + r) for r in range(4)]
    progress = next(r for r in j.records if r["event"] == je.ACTION_PROGRESS)
    assert progress["idents"][0] == [0, 1000, 1_700_000_000_000_000, "host0"]
    c2, rec = restarted(j.records, 103.0)
    assert rec.op is not None and rec.op.phase == "term" and c2.state is S.RESTARTING
    # Ranks 0 and 2 are gone; 1 and 3 still alive; rank 0 already came back as a new process.
    v = T.view(
        [
            T.rank(0, world_size=4, pid=2000, proc_start_us=1_800_000_000_000_000, **LAUNCHER),
            T.rank(1, world_size=4, **LAUNCHER),
            T.rank(2, world_size=4, alive=False, **LAUNCHER),
            T.rank(3, world_size=4, **LAUNCHER),
        ],
        104.0,
    )
    assert c2.tick([], v, 104.0) == ([], [])  # within the grace period of the rebuilt action
    reqs, events = T.with_lines(c2.tick([], v, 108.5))
    assert sigs(reqs) == [("SIGKILL", 1, 1001), ("SIGKILL", 3, 1003)]  # never the new pid 2000
    assert all(p.get("action_id") == "a-1" for _, p in events)


def test_an_abort_decided_but_not_yet_sent_starts_again_with_the_stacks():
    hang = finding("collective_hang", (2,))
    records = Journaled().records + [
        {
            "event": je.ACTION,
            "t_wall": WALL0 + 101.0,
            "action_id": "a-1",
            "action": "abort",
            "reason": "hang",
            "kind": "collective_hang",
            "ranks": [2],
            "hosts": ["host0"],
            "dry_run": False,
            "job_state": "degraded",
        },
        {"event": je.STATE, "t_wall": WALL0 + 101.0, "job_state": "aborting", "from": "degraded", "on": "abort"},
    ]
    c2, rec = restarted(records, 110.0)
    assert rec.restart_op and c2.state is S.ABORTING
    reqs, _ = c2.tick([hang], old_view(110.0), 110.0)
    (dump,) = [r for r in reqs if r.type == commands.DUMP_STACKS]
    assert [t["rank"] for t in dump.targets] == [0, 1, 2, 3] and dump.trigger["action"] == "a-1"


def test_a_restart_that_had_stopped_nothing_is_closed_as_interrupted_and_stays_counted():
    records = Journaled().records + [
        {"event": je.FINDING, "t_wall": WALL0 + 100.0, **finding().to_dict()},
        {
            "event": je.ACTION,
            "t_wall": WALL0 + 101.0,
            "action_id": "a-1",
            "action": "restart",
            "reason": "dead",
            "kind": "dead_rank",
            "ranks": [1],
            "hosts": ["host0"],
            "dry_run": False,
            "restart": 1,
        },
        {"event": je.STATE, "t_wall": WALL0 + 101.0, "job_state": "restarting", "from": "degraded", "on": "restart"},
    ]
    c2, rec = restarted(records, 105.0)
    assert [o.action_id for o in rec.interrupted] == ["a-1"] and "interrupted" in rec.interrupted[0].result
    assert c2.op is None and c2.state is S.DEGRADED and len(c2.job.restarts) == 1
    assert list(rec.active) == [("dead_rank", (1,))]


def test_open_findings_are_not_opened_again_and_resolved_ones_stay_closed():
    f1, f2 = finding(ranks=(1,)), finding("collective_hang", (2,))
    records = Journaled().records + [
        {"event": je.FINDING, "t_wall": WALL0 + 100.0, **f1.to_dict()},
        {"event": je.FINDING, "t_wall": WALL0 + 100.0, **f2.to_dict()},
        {"event": je.RESOLVED, "t_wall": WALL0 + 104.0, "kind": "collective_hang", "ranks": [2]},
    ]
    rec = recover.replay(records, 200.0, WALL0 + 200.0, "job", POLICY)
    assert list(rec.active) == [("dead_rank", (1,))]
    assert rec.active[("dead_rank", (1,))].first.onset_mono == 99.0  # the old onset, on the new clock
    _, opened, _ = tracker.update(rec.active, [replace(f1, detected_mono=200.0)], 200.0, ["dead_rank"])
    assert opened == []


def test_other_jobs_records_dry_runs_and_hostile_lines_are_ignored():
    records = [
        {"event": je.START, "t_wall": WALL0, "job": "other"},
        {
            "event": je.ACTION,
            "t_wall": WALL0 + 1,
            "action_id": "a-7",
            "action": "restart",
            "restart": 1,
            "kind": "dead_rank",
            "ranks": [1],
        },
        {"event": je.START, "t_wall": WALL0 + 2, "job": "job"},
        {"event": je.ACTION, "t_wall": WALL0 + 3, "action_id": "a-1", "action": "restart", "dry_run": True},
        {"event": je.ACTION_PROGRESS, "t_wall": "x", "action_id": 5, "idents": "nonsense"},
        {"event": je.STATE, "t_wall": WALL0 + 3, "job_state": "on fire"},
        {"event": je.FINDING, "t_wall": WALL0 + 3, "kind": "dead_rank", "ranks": ["x"]},
    ]
    rec = recover.replay(records, 10.0, WALL0 + 10.0, "job", POLICY)
    assert rec.job.restarts == () and rec.job.state is S.RUNNING and rec.count == 1 and rec.op is None
    assert rec.active == {}
    assert recover.replay([], 10.0, WALL0, "job", POLICY).empty


def test_the_coordinator_journals_what_it_recovered_and_continues_the_ids(tmp_path):
    from watchdog.coordinator.config import Config
    from watchdog.coordinator.journal import jsonl as journal
    from watchdog.coordinator.journal.jsonl import Journal
    from watchdog.coordinator.service import Coordinator

    path = str(tmp_path / "journal.jsonl")
    j = Journaled()
    c = JobController(POLICY)
    j.tick(c, [finding()], old_view(), 101.0)
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(__import__("json").dumps(r) + "\n" for r in j.records)
    coord = Coordinator(
        Config(journal=path, job="job", world_size=4, policy=POLICY), Journal(path, lambda: (WALL0 + 130.0, 130.0))
    )
    rec = coord.recover(130.0, WALL0 + 130.0)
    assert rec.op is not None and coord.control.state is S.RESTARTING
    (summary,) = [r for r in journal.read(path) if r["event"] == je.RECOVERED]
    assert summary["restarts_used"] == 1 and summary["in_flight"]["action_id"] == "a-1"
    assert summary["open_findings"] == []  # the finding itself was never journaled in this test
    coord.journal.close()


def test_a_fresh_journal_recovers_nothing():
    records = [
        {"event": je.START, "t_wall": WALL0, "job": "job"},
        {"event": je.CONFIG, "t_wall": WALL0, "config": {}},
        {"event": je.HOST_SEEN, "t_wall": WALL0, "host": "h"},
    ]
    assert recover.replay(records, 1.0, WALL0 + 1.0, "job", POLICY).empty


def test_recovered_findings_are_not_resolved_before_any_agent_reported(tmp_path):
    import json

    from watchdog.coordinator.config import Config
    from watchdog.coordinator.journal import jsonl as journal
    from watchdog.coordinator.journal.jsonl import Journal
    from watchdog.coordinator.service import Coordinator

    path = str(tmp_path / "journal.jsonl")
    recs = Journaled().records + [{"event": je.FINDING, "t_wall": WALL0 + 100.0, **finding().to_dict()}]
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in recs)
    coord = Coordinator(
        Config(journal=path, job="job", world_size=4, policy=POLICY, resolve_grace_s=0.0),
        Journal(path, lambda: (WALL0 + 200.0, 200.0)),
    )
    coord.recover(200.0, WALL0 + 200.0)
    for k in range(10):
        coord.tick(200.0 + k, WALL0 + 200.0 + k)
    assert list(coord.active) == [("dead_rank", (1,))]
    assert [r for r in journal.read(path) if r["event"] == je.RESOLVED] == []
    coord.journal.close()


def test_an_action_this_module_cannot_carry_on_is_closed_saying_so():
    records = [
        *Journaled().records,
        {
            "event": je.ACTION,
            "t_wall": WALL0 + 1,
            "action_id": "a-1",
            "action": "some_newer_action",
            "kind": "straggler",
            "ranks": [2],
            "hosts": ["host0"],
        },
        {"event": je.ACTION_PROGRESS, "t_wall": WALL0 + 1, "action_id": "a-1", "idents": [[2, 1002, 7, "host0"]]},
        {"event": je.STATE, "t_wall": WALL0 + 1, "job_state": "restarting", "from": "degraded", "on": "restart"},
    ]
    rec = recover.replay(records, 10.0, WALL0 + 10.0, "job", POLICY)
    assert rec.op is None and rec.job.state is S.RUNNING
    assert rec.interrupted[0].result is not None
    assert rec.interrupted[0].result.startswith(
        "interrupted: the coordinator restarted and cannot carry this action on"
    )


def test_a_rollback_restart_killed_while_the_old_workers_were_stopping_carries_on_as_a_restart():
    # Its rollback commands went out in the replies that carried the SIGTERMs, so
    # what is left after a coordinator restart is the restart's own: stop those
    # processes, then wait for the new ones (which resume before the anomaly).
    pol = replace(POLICY, actions={"loss_anomaly": "rollback_restart"})
    anomaly = replace(finding(kind="loss_anomaly", ranks=(1,)), evidence={"step": 40})
    j, c = Journaled(), JobController(pol)
    reqs, _ = j.tick(c, [anomaly], old_view(), 101.0)
    assert sum(r.type == commands.ROLLBACK for r in reqs) == 1  # one host: one rollback command
    assert sigs(reqs) == [("SIGTERM", r, 1000 + r) for r in range(4)]
    c2, rec = restarted(j.records, 103.0, pol)
    assert rec.op is not None and (rec.op.action, rec.op.phase) == ("rollback_restart", "term")
    assert rec.interrupted == () and c2.state is S.RESTARTING
    v = T.view([T.rank(r, world_size=4, alive=r != 1, **LAUNCHER) for r in range(4)], 104.0)
    reqs, _ = c2.tick([], v, 108.5)
    assert sigs(reqs) == [("SIGKILL", r, 1000 + r) for r in (0, 2, 3)]  # the old processes, as a restart would


def test_the_failures_restarts_were_spent_on_survive_a_coordinator_restart():
    # The repeat-failure breaker compares a new failure with the ones restarts
    # were spent on: a coordinator restarted on its journal must still know them,
    # frames included (they arrive in a stack_groups record after the action).
    from watchdog.coordinator.control import fingerprint

    pol = replace(POLICY, max_restarts=5, cooldown_s=0)
    j, c = Journaled(), JobController(pol)
    evidence = {"culprits": {"1": {"host": "host0", "step": 12}}}
    j.tick(c, [replace(finding(), evidence=evidence)], old_view(), 101.0)
    frames = ("wait (train.py:80)", "loop (train.py:120)")
    j.records.append(
        {
            "event": je.STACK_GROUPS,
            "t_wall": WALL0 + 105,
            "trigger": {"kind": "dead_rank", "ranks": [1]},
            "groups": [{"culprit": True, "frames": [["wait", "train.py", 80], ["loop", "train.py", 120]]}],
        }
    )
    c.stacks({"kind": "dead_rank", "ranks": [1]}, frames)
    _, rec = restarted(j.records, 130.0, pol)
    assert rec.job.history == c.job.history
    assert [(fp.kind, fp.hosts, fp.ranks, fp.step, fp.frames) for fp in rec.job.history] == [
        ("dead_rank", ("host0",), (1,), 12, frames)
    ]
    assert fingerprint.from_dict({"kind": 3}) is None and fingerprint.from_dict("x") is None  # hostile lines


def test_a_fingerprint_survives_its_journal_form():
    from watchdog.coordinator.control import fingerprint

    fp = fingerprint.Fingerprint("collective_hang", ("h1",), (2,), 0, 40, "all_reduce", 12, ("f (a.py:1)",))
    assert fingerprint.from_dict(fp.to_dict()) == fp
    odd = {**fp.to_dict(), "ranks": [2, "x", True], "step": "12", "frames": "nope"}
    assert fingerprint.from_dict(odd) == fingerprint.Fingerprint("collective_hang", ("h1",), (2,), 0, 40, "all_reduce")


def test_a_recovered_finding_not_seen_again_starts_nothing_once_the_restart_it_caused_resumed():
    """A coordinator killed while its restart stopped the workers: the finding that
    caused it is still open in the journal. The new coordinator first hears from
    the hosts once the group resumed; with no cooldown, the finding still open
    (its resolution waits out the grace period) had the repeat breaker abort the
    resumed job. Only a finding reported on this tick starts an action."""
    pol = replace(POLICY, cooldown_s=0)
    j, c = Journaled(), JobController(pol)
    j.tick(c, [finding()], old_view(), 101.0)  # a-1: restart, SIGTERM to the old workers
    c2, rec = restarted(j.records + [{"event": je.FINDING, "t_wall": WALL0 + 100.0, **finding().to_dict()}], 103.0, pol)
    assert rec.op is not None and list(rec.active) == [("dead_rank", (1,))]
    held_open = [a.first for a in rec.active.values()]
    _, events = T.with_lines(c2.tick(held_open, new_view(104.0), 104.0, seen=set()))
    assert names(events) == [je.RESTART]  # the old workers gone; torchrun started the new ones
    reqs, events = T.with_lines(c2.tick(held_open, new_view(105.0, seq=2, step=23), 105.0, seen=set()))
    assert names(events)[:2] == [je.RESUMED, je.ACTION_OUTCOME] and je.ACTION not in names(events) and reqs == []
    assert c2.state is S.DEGRADED and c2.op is None  # the finding is open: degraded, not aborting
    # Reported again (the new incarnation of rank 1 died too): that one is acted on, a repeat.
    again = finding(detected=110.0)
    _, events = T.with_lines(c2.tick([again], new_view(110.0), 110.0, seen={again.key}))
    action = dict(events)[je.ACTION]
    assert (action["action_id"], action["action"]) == ("a-2", "abort")


def test_the_coordinator_acts_only_on_findings_its_detectors_reported_this_tick(tmp_path):
    """The service's side of the above: a finding rebuilt from the journal and not
    reported since starts no action, however long its resolution is held off."""
    import json

    from watchdog.coordinator.config import Config
    from watchdog.coordinator.journal import jsonl as journal
    from watchdog.coordinator.journal.jsonl import Journal
    from watchdog.coordinator.service import Coordinator

    path = str(tmp_path / "journal.jsonl")
    recs = Journaled().records + [{"event": je.FINDING, "t_wall": WALL0 + 100.0, **finding().to_dict()}]
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in recs)
    pol = replace(POLICY, cooldown_s=0)
    coord = Coordinator(
        Config(journal=path, job="job", world_size=4, policy=pol, resolve_grace_s=30.0),
        Journal(path, lambda: (WALL0 + 200.0, 200.0)),
    )
    coord.recover(200.0, WALL0 + 200.0)
    healthy = [T.rank(r, world_size=4, step=50, **LAUNCHER) for r in range(4)]
    for k in range(5):
        now = 200.0 + k
        coord.accept(T.report("host0", [replace(s, step=s.step + k) for s in healthy], seq=k + 1), now)
        coord.tick(now, WALL0 + now)
    assert list(coord.active) == [("dead_rank", (1,))]  # held open by the grace period
    assert [r for r in journal.read(path) if r["event"] == je.ACTION] == []
    coord.journal.close()


def test_a_launchers_restart_survives_a_coordinator_restart_and_is_never_done_again():
    # rank 1 is gone, the others are still there: the action waits for the launcher
    j, c = Journaled(), JobController(POLICY)
    one_dead = T.view([replace(old_view().ranks[1].state, alive=False)], 100.5, base=old_view(), seq=2)
    reqs, events = j.tick(c, [finding()], one_dead, 101.0)
    assert reqs == [] and [p.get("phase") for n, p in events if n == je.ACTION_PROGRESS] == ["launcher"]
    # -- killed here; the new coordinator waits for the launcher again, signals nothing --
    c2, rec = restarted(j.records, 102.0)
    assert rec.summary(102.0)["in_flight"]["phase"] == "launcher"
    dead = T.view([replace(s.state, alive=False) for s in old_view().ranks.values()], 103.0, base=old_view(), seq=3)
    reqs, events = j.tick(c2, [], dead, 103.0)
    assert reqs == [] and names(events) == [je.LAUNCHER_RESTART]
    # -- killed again after the launcher's restart: the resume is all that is left --
    c3, rec = restarted(j.records, 104.0)
    assert rec.summary(104.0)["in_flight"]["phase"] == "resume"
    reqs, events = T.with_lines(c3.tick([], new_view(105.0), 105.0))
    assert reqs == [] and names(events) == [je.RESUMED, je.ACTION_OUTCOME, je.STATE]
    assert events[1][1]["result"] == "restart 1 (by the launcher), resumed from step 20 (80 steps lost)", events[1][1]


def test_a_new_run_of_the_job_decides_afresh_a_restarted_coordinator_of_the_same_run_does_not():
    """Run r1 spent its restart and was aborted (failed). A coordinator of run r2 (same job
    name, same journal) starts with its own budget and state; one of r1 again carries on
    r1's decisions. Action ids stay unique in the journal either way."""
    r1 = [
        {"event": je.START, "t_wall": WALL0, "job": "job", "run_id": "r1"},
        {"event": je.ACTION, "t_wall": WALL0 + 1, "action_id": "a-1", "action": "restart", "restart": 1},
        {"event": je.ACTION_OUTCOME, "t_wall": WALL0 + 5, "action_id": "a-1", "ok": True},
        {"event": je.ACTION, "t_wall": WALL0 + 9, "action_id": "a-2", "action": "abort"},
        {"event": je.ACTION_OUTCOME, "t_wall": WALL0 + 10, "action_id": "a-2", "ok": True},
        {"event": je.STATE, "t_wall": WALL0 + 10, "job_state": "failed"},
    ]
    fresh = recover.replay(
        [*r1, {"event": je.START, "t_wall": WALL0 + 20, "job": "job", "run_id": "r2"}],
        30.0,
        WALL0 + 30.0,
        "job",
        POLICY,
        run_id="r2",
    )
    assert (fresh.job.state, fresh.job.restarts, fresh.job.last_action_at, fresh.count) == (S.RUNNING, (), None, 2)
    again = recover.replay(
        [*r1, {"event": je.START, "t_wall": WALL0 + 20, "job": "job", "run_id": "r1"}],
        30.0,
        WALL0 + 30.0,
        "job",
        POLICY,
        run_id="r1",
    )
    assert again.job.state is S.FAILED and len(again.job.restarts) == 1
    # Without run ids (the default), the journal's runs are one: failed is inherited.
    assert recover.replay(r1, 30.0, WALL0 + 30.0, "job", POLICY).job.state is S.FAILED
