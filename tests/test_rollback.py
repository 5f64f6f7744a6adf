"""rollback_restart: the coordinator names the checkpoint, the agent writes the
rollback file, the restarted script reads it (watchdog.hook.rollback). Pure or
file-only: no processes, no sleeps."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import cast

from watchdog.agent.command_channel.handlers import Actions
from watchdog.agent.command_channel.stacks import StackDumper
from watchdog.contracts import commands
from watchdog.contracts import slot as wire
from watchdog.contracts.finding import Finding
from watchdog.coordinator import testing as T
from watchdog.coordinator.control.loop import JobController
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.policy_file import Policy, parse_policy
from watchdog.hook import rollback

NO_DUMPER = cast(StackDumper, None)  # a rollback never dumps stacks
POLICY = Policy(actions={"loss_anomaly": "rollback_restart"}, min_finding_age_s=0, cooldown_s=0)


def nan_finding(step=120):
    return Finding(
        kind="loss_anomaly",
        ranks=(2,),
        hosts=("host0",),
        reason="NaN",
        onset_mono=95.0,
        detected_mono=100.0,
        evidence={"cause": "nonfinite", "step": step},
    )


def test_rollback_restart_tells_every_host_first_then_stops_the_workers():
    v = T.view([T.rank(r, world_size=8, launcher_pid=500, launcher_start_us=7) for r in range(8)], 100.0)
    c = JobController(POLICY)
    reqs, events = T.with_lines(c.tick([nan_finding()], v, 101.0))
    kinds = [r.type for r in reqs]
    assert kinds[:2] == [commands.ROLLBACK, commands.ROLLBACK] and set(kinds[2:]) == {commands.SIGNAL}
    assert {r.host for r in reqs[:2]} == {"host0", "host1"}
    assert reqs[0].args == {"before_step": 120, "action": "a-1"}
    prog = [p for n, p in events if n == je.ACTION_PROGRESS]
    assert prog[0]["phase"] == "rollback" and prog[0]["before_step"] == 120
    assert parse_policy('[actions]\nloss_anomaly = "rollback_restart"').action_for("loss_anomaly") == "rollback_restart"


def test_without_an_anomaly_step_it_is_a_plain_restart_that_says_so():
    v = T.view([T.rank(r, world_size=4) for r in range(4)], 100.0)
    reqs, events = T.with_lines(JobController(POLICY).tick([nan_finding(step=0)], v, 101.0))
    assert commands.ROLLBACK not in [r.type for r in reqs]
    assert "names no anomaly step" in next(p for n, p in events if n == je.ACTION_PROGRESS)["error"]


def cmd(args, job="train"):
    return commands.make(job=job, type=commands.ROLLBACK, host="h", args=args, issued_wall=1000.0, ttl_s=30.0)


def test_the_agent_writes_the_file_the_hook_reads(tmp_path):
    actions = Actions("h", lambda job: (), NO_DUMPER, run_dir=str(tmp_path), wall=lambda: 1234.5)
    out = actions.rollback(cmd({"before_step": 120, "action": "a-3"}))
    assert out["ok"], out
    doc = json.loads((tmp_path / wire.rollback_filename("train")).read_text())
    assert doc["before_step"] == 120 and doc["action"] == "a-3" and doc["written_wall"] == 1234.5
    mon = SimpleNamespace(config=SimpleNamespace(run_dir=str(tmp_path), job="train"))
    assert rollback.requested(mon) == rollback.Rollback(before_step=120, action="a-3")
    assert rollback.requested(run_dir=str(tmp_path), job="other") is None  # another job's file is not ours
    assert not Actions("h", lambda job: (), NO_DUMPER).rollback(cmd({"before_step": 1}))["ok"]  # no run dir


def test_a_malformed_file_is_no_rollback(tmp_path):
    path = tmp_path / wire.rollback_filename("train")
    for text in (
        "{not json",
        json.dumps({"job": "train", "before_step": "120"}),
        json.dumps([1]),
        json.dumps({"job": "train", "before_step": 0}),
    ):
        path.write_text(text)
        assert rollback.requested(run_dir=str(tmp_path), job="train") is None
    assert rollback.requested(None) is None


def test_rollback_commands_are_checked_and_destructive():
    assert commands.ROLLBACK in commands.DESTRUCTIVE
    ok = commands._args_ok
    assert ok(cmd({"before_step": 5, "action": "a-1"}))
    assert not ok(cmd({"before_step": 0})) and not ok(cmd({"before_step": True})) and not ok(cmd({}))
