"""An unmarked stall that recurs on one rank is said once and never paged, on a
real job: ``watchdog run -- torchrun`` of an unmodified DDP loop
(tests/fixtures/unmodified/rank0_upload.py, 2 ranks, gloo on CPU, a real agent
and coordinator) in which rank 0 alone blocks ~3 s in ``upload_metrics`` every
8 steps (a sleep: no forward, backward, step or checkpoint) while rank 1 waits
in DDP's all-reduce. Four such stalls: the hook samples rank 0's frame during
each, and the coordinator says one periodic_stall advisory naming rank 0, the
period and ``upload_metrics``, and no finding (no hang, straggler or extra
work) from the start of the job to its end.

The same upload holding the GIL (``--gil``) freezes rank 0's heartbeat each
time: frozen_rank names the first freeze (nothing is known yet), the
recurrences are expected (one advisory, no finding), and a SIGSTOP of the
same rank afterwards is named at once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from test_e2e_zero_code import Stack, records
from waiting import wait_for

from watchdog.coordinator.analysis import intermittent_stalls as stalls

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parent / "fixtures" / "unmodified" / "rank0_upload.py"


def test_a_stall_rank_0_makes_alone_every_8_steps_is_one_advisory_naming_its_frame(tmp_path):
    stack = Stack(tmp_path, 2, None, ["--steps", "34", "--every", "8", "--stall-s", "3"], script=SCRIPT).start()
    try:
        # The job is over for the coordinator once both ranks said they exited (their hooks' atexit):
        # their last steps are in by then. (Not torchrun's exit: gloo's teardown takes seconds more.)
        wait_for(
            lambda: (
                len([r for r in records(stack.jpath, "state") if r["changed"].get("status", [""])[-1] == "exited"]) >= 2
            ),
            timeout_s=150,
            what="both ranks to finish the job",
            interval_s=0.2,
        )
        advisories = [f for f in records(stack.jpath, "finding") if f["kind"] == "periodic_stall"]
        others = [f for f in records(stack.jpath, "finding") if f["kind"] != "periodic_stall"]
        assert others == [], f"findings on a healthy job: {others}\n{stack.logs()}"
        assert len(advisories) == 1, advisories
        (a,) = advisories
        assert a["ranks"] == [0] and a["evidence"]["period_steps"] == 8, a
        assert a["evidence"]["frame"].startswith("upload_metrics (rank0_upload.py:"), a
        assert "every 8 steps in upload_metrics" in a["reason"] and a["evidence"]["cost_s"] >= 2.0, a
    finally:
        stack.stop()


def test_a_freeze_rank_0_makes_alone_every_6_steps_is_named_once_then_advice_and_a_sigstop_is_still_named(tmp_path):
    # frozen_rank's threshold under the 2.5 s freezes (its default is 3 s): each one crosses it
    flags = ("--frozen.heartbeat-age-seconds", "1.5")
    args = ["--steps", "60", "--every", "6", "--stall-s", "2.5", "--gil"]
    stack = Stack(tmp_path, 2, None, args, script=SCRIPT, coordinator_flags=flags).start()

    def findings(kind: str | None = None) -> list[dict]:
        return [f for f in records(stack.jpath, "finding") if kind is None or f["kind"] == kind]

    try:
        wait_for(lambda: findings("periodic_stall"), timeout_s=150, what="the advisory", interval_s=0.2)
        pid = stack.torchrun.rank_pids()[0]
        before = findings()
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.time()
        (advisory,) = [f for f in before if f["kind"] == "periodic_stall"]
        assert advisory["ranks"] == [0] and advisory["evidence"]["period_steps"] == 6, advisory
        assert "every 6 steps with its heartbeat frozen" in advisory["reason"], advisory
        assert 2.0 <= advisory["evidence"]["cost_s"] <= 4.0, advisory
        # the first freeze, before anything was known of it; the two after it: nothing
        (first,) = [f for f in before if f["kind"] != "periodic_stall"]
        assert first["kind"] == "frozen_rank" and first["ranks"] == [0], before
        assert first["evidence"]["proc_status"] != "stopped" and first["evidence"]["step"] < 12, first
        stopped = wait_for(
            lambda: [f for f in findings("frozen_rank") if f["evidence"]["proc_status"] == "stopped"],
            timeout_s=20,
            what="the SIGSTOP named",
            interval_s=0.1,
        )
        assert stopped[0]["ranks"] == [0] and "stopped by a signal" in stopped[0]["reason"], stopped
        # at once: not after the allowance a freeze that ends by itself gets
        allowed = stalls.EXPECTED_FACTOR * advisory["evidence"]["cost_s"] + stalls.EXPECTED_MARGIN_S
        assert stopped[0]["t_wall"] - stopped_at < allowed, (stopped[0]["t_wall"] - stopped_at, allowed)
        assert {tuple(f["ranks"]) for f in findings()} == {(0,)}, findings()
    finally:
        stack.stop()
