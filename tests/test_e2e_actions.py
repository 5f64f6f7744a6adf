"""Actions end to end: real torchrun (4 gloo ranks on CPU, --max-restarts), the
example with checkpoints, a real agent and coordinator with a policy file,
driven through ``watchdog demo --json``.

- restart after a kill and after a hang: the job finishes every step and its
  final parameters are bit-identical to a fault-free run's with the same seed
  (nothing lost, nothing applied twice); the journal reads finding -> action ->
  restart -> resumed from the checkpoint step.
- abort on a hang: every rank's stack in the journal (the culprit's at the hang
  line), every process gone, a non-zero exit, within seconds.
- an exhausted restart budget aborts instead, and says so.
- a healthy jittery run with checkpoint pauses under a policy that would restart
  on anything: no action at all (and it is the fault-free reference run).
Bounds are generous: a busy 2-core machine.
"""

from __future__ import annotations

import os

import psutil
import pytest
import torch

from watchdog import localjob, scenario
from watchdog.agent.stacks import find_py_spy
from watchdog.coordinator import journal
from watchdog.coordinator.finding import KINDS

pytestmark = pytest.mark.integration

STEPS = 60
EVERYTHING = "\n".join(["[actions]", *(f'{k} = "restart"' for k in KINDS), "[limits]",
                        "min_finding_age_seconds = 0", "cooldown_seconds = 0"]) + "\n"


def params(path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"parameter {k} differs from the fault-free run"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The healthy run: jitter, long checkpoint pauses, a restart-on-anything policy."""
    tmp = tmp_path_factory.mktemp("reference")
    policy = tmp / "policy.toml"
    policy.write_text(EVERYTHING)
    res = scenario.run([], steps=STEPS, timeout_s=240, work_dir=str(tmp), policy=str(policy), script_args=[
        "--jitter", "0.3", "--ckpt-dir", str(tmp / "ckpt"), "--ckpt-every", "20", "--ckpt-pause-s", "8",
        "--final-params", str(tmp / "final.pt")])
    return res, params(tmp / "final.pt")


def test_healthy_run_under_a_restart_everything_policy_takes_no_action(reference):
    res, _ = reference
    assert res.summary["job_exit_code"] == 0, res.output[-2000:]
    assert res.findings == [] and res.actions == [], res.output[-2000:]


def journal_events(res, *names):
    return [r for r in journal.read(res.summary["journal"]) if r["event"] in names
            and (r["event"] != "state" or "job_state" in r)]


@pytest.mark.parametrize("fault,kind,resume_step", [("kill:1@20", "dead_rank", 20),
                                                     ("hang:2@30", "collective_hang", 30)])
def test_restart_finishes_bit_exact(fault, kind, resume_step, reference, tmp_path):
    _, ref = reference
    res = scenario.run([fault], steps=STEPS, timeout_s=240, work_dir=str(tmp_path), action="restart",
                       script_args=["--final-params", str(tmp_path / "final.pt")])
    assert res.summary["job_exit_code"] == 0, res.output[-3000:]
    story = [(r["event"], r.get("action") or r.get("kind")) for r in journal_events(res, "finding", "action", "restart",
                                                                                    "resumed")]
    # Detection -> action -> restart -> resumed. Dead-rank findings for the workers
    # the restart stopped (or torchrun tore down) may come in between.
    assert story[0] == ("finding", kind), story
    assert [e for e in story if e[0] != "finding"] == [("action", "restart"), ("restart", "restart"),
                                                       ("resumed", "restart")], story
    resumed = res.events("resumed")[0]
    assert (resumed["restart"], resumed["step"]) == (1, resume_step), resumed
    assert res.events("action_outcome")[0]["ok"] is True
    assert_same(params(tmp_path / "final.pt"), ref)
    print(f"\n{fault}: resumed from step {resumed['step']} {resumed['seconds']} s after the action")


def all_gone(res) -> None:
    log = (res.work_dir / "torchrun.log").read_text(errors="replace")
    pids = {int(p) for p in __import__("re").findall(r"pid (\d+)", " ".join(
        f"pid {r['pid']}" for r in journal.read(res.summary["journal"]) if r["event"] == "rank_joined"))}
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, (alive, log[-2000:])


@pytest.mark.skipif(find_py_spy() is None, reason="py-spy not installed")
def test_hang_abort_takes_every_stack_then_stops_everything(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[actions]\ncollective_hang = "abort"\n[limits]\nmin_finding_age_seconds = 0\n'
                      'abort_grace_seconds = 3\n')
    res = scenario.run(["hang:2@30"], steps=400, timeout_s=150, work_dir=str(tmp_path), policy=str(policy),
                       max_restarts=3)
    assert res.summary["job_exit_code"] not in (0, None), res.output[-3000:]
    recs = journal.read(res.summary["journal"])
    action = next(r for r in recs if r["event"] == "action")
    assert action["action"] == "abort" and action["reason"].startswith("collective_hang"), action
    stacks = {s["rank"]: s for r in recs if r["event"] == "evidence" and r["trigger"].get("action") == action["action_id"]
              for s in r["stacks"]}
    assert sorted(stacks) == [0, 1, 2, 3] and all(s["ok"] for s in stacks.values()), stacks
    lines = localjob.EXAMPLE_SCRIPT.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if 'announce("hang"' in ln)
    hang_line = next(i for i in range(start, len(lines)) if "time.sleep(3600)" in lines[i]) + 1
    assert f"main (train_ddp.py:{hang_line})" in stacks[2]["text"], stacks[2]["text"]
    first_signal = next(r for r in recs if r["event"] == "command" and r.get("type") == "signal")
    assert first_signal["target"]["rank"] == -1  # the launcher first: no elastic restart undoes the abort
    outcome = next(r for r in recs if r["event"] == "action_outcome")
    assert outcome["ok"] and outcome["t_wall"] - action["t_wall"] < 20.0, (action, outcome)
    assert [r["job_state"] for r in recs if r["event"] == "state" and "job_state" in r][-1] == "failed"
    assert res.events("restart") == []  # torchrun did not restart the group
    all_gone(res)
    print(f"\nabort: action -> every worker gone in {outcome['t_wall'] - action['t_wall']:.2f} s")


def test_exhausted_restart_budget_aborts_with_the_reason(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[actions]\ncollective_hang = "restart"\n[limits]\nmin_finding_age_seconds = 0\n'
                      'max_restarts = 0\nabort_grace_seconds = 3\n')
    res = scenario.run(["hang:2@30"], steps=400, timeout_s=150, work_dir=str(tmp_path), policy=str(policy))
    assert res.summary["job_exit_code"] not in (0, None), res.output[-3000:]
    action = res.events("action")[0]
    assert action["action"] == "abort" and "restart budget exhausted" in action["reason"], action
    assert res.events("action_outcome")[0]["ok"] is True
    all_gone(res)
