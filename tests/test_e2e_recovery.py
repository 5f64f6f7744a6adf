"""Recovery that learns, end to end: real torchrun (3 gloo ranks on CPU), the
example, a real agent and coordinator with a policy file (``watchdog demo``).

- a hang that comes back at the same place after a restart escalates on its
  second occurrence (abort: "deterministic ..."), with one restart spent of three;
- a NaN loss on one rank is a loss_anomaly naming that rank and its host, and
  rollback_restart resumes from the checkpoint before the NaN: the job finishes
  with finite parameters.
Bounds are generous: a busy 2-core machine.
"""

from __future__ import annotations

import math
import re

import pytest

from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.dev import scenario

pytestmark = pytest.mark.integration


def events(res, name):
    return [r for r in journal.read(res.summary["journal"]) if r["event"] == name]


def test_a_hang_that_comes_back_after_a_restart_escalates_instead_of_restarting_again(tmp_path):
    policy = tmp_path / "policy.toml"
    # The default [repeats]; one host: excluding it would end the job, so the place decides (control/repeats.py).
    policy.write_text(
        '[actions]\ncollective_hang = "restart"\n[limits]\nmin_finding_age_seconds = 0\n'
        "cooldown_seconds = 0\nmax_restarts = 3\nabort_grace_seconds = 3\n"
    )
    res = scenario.run(
        ["hang:2@35"],
        ranks=3,
        steps=400,
        timeout_s=240,
        work_dir=str(tmp_path),
        policy=str(policy),
        max_restarts=3,
        script_args=["--faults-every-attempt", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "10"],
    )
    assert res.summary["job_exit_code"] not in (0, None), res.output[-3000:]
    actions = events(res, je.ACTION)
    assert [a["action"] for a in actions] == ["restart", "abort"], actions
    # Resumed from the checkpoint at 30 (a hang before the first step after a restart
    # would never count as resumed: the hang comes back a few steps later here).
    assert len(events(res, je.RESTART)) == 1 and events(res, je.RESUMED)[0]["step"] == 30
    # The restarted group hanging again is a fault of its own (not the restart's effect).
    assert [f["ranks"] for f in events(res, je.FINDING) if f["kind"] == "collective_hang"] == [[2], [2]]
    (rep,) = events(res, je.REPEAT_FAILURE)
    assert (rep["rule"], rep["occurrences"], rep["action"], rep["ranks"]) == ("same_place", 2, "abort", [2]), rep
    assert actions[1]["reason"].startswith("deterministic: the same failure at the same place after 1 restart(s)")
    assert actions[1]["fingerprint"]["step"] == 35 and rep["earlier"][0]["step"] == 35
    print(
        f"\nrepeat: second hang opened -> abort decided in {actions[1]['t_wall'] - rep_finding_t(res):.1f} s: "
        f"{actions[1]['reason'][:160]}"
    )


def rep_finding_t(res):
    """When the second collective_hang was journaled."""
    return [r for r in events(res, je.FINDING) if r["kind"] == "collective_hang"][-1]["t_wall"]


def test_a_nan_on_one_rank_rolls_back_to_the_checkpoint_before_it(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[actions]\nloss_anomaly = "rollback_restart"\n[limits]\nmin_finding_age_seconds = 0\n'
        "cooldown_seconds = 0\nabort_grace_seconds = 3\n"
    )
    res = scenario.run(
        ["nan:1@25"],
        ranks=3,
        steps=80,
        timeout_s=240,
        work_dir=str(tmp_path),
        policy=str(policy),
        script_args=["--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "10"],
    )
    assert res.summary["job_exit_code"] == 0, res.output[-3000:]
    found = [f for f in events(res, je.FINDING) if f["kind"] == "loss_anomaly"]
    assert found and found[0]["ranks"] == [1] and found[0]["evidence"]["host_attributable"], res.findings
    assert found[0]["evidence"]["step"] == 26  # the step that ended with the NaN loss (mon.step's numbering)
    (action,) = events(res, je.ACTION)
    assert (action["action"], action["kind"], action["ranks"]) == ("rollback_restart", "loss_anomaly", [1])
    told = next(p for p in events(res, je.ACTION_PROGRESS) if p.get("phase") == "rollback")
    assert told["before_step"] == 26
    resumed = events(res, je.RESUMED)[0]
    assert resumed["step"] == 20, resumed  # the newest checkpoint before step 26, not the NaN one at 30
    log = (res.work_dir / "torchrun.log").read_text(errors="replace")
    checksum = re.search(r"done: 80 steps, parameter checksum (\S+)", log)
    assert checksum and math.isfinite(float(checksum.group(1))), log[-2000:]
    first = res.first("loss_anomaly")
    print(
        f"\nnan: NaN -> loss_anomaly in {res.latency_s(first) if first else '?'} s; rollback to step "
        f"{resumed['step']}, resumed {resumed['seconds']} s after the action"
    )
