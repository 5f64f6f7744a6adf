"""An unmarked stall that recurs on one rank is said once and never paged, on a
real job: ``watchdog run -- torchrun`` of an unmodified DDP loop
(tests/fixtures/unmodified/rank0_upload.py, 2 ranks, gloo on CPU, a real agent
and coordinator) in which rank 0 alone blocks ~3 s in ``upload_metrics`` every
8 steps (a sleep: no forward, backward, step or checkpoint) while rank 1 waits
in DDP's all-reduce. Four such stalls: the hook samples rank 0's frame during
each, and the coordinator says one periodic_stall advisory naming rank 0, the
period and ``upload_metrics``, and no finding (no hang, straggler or extra
work) from the start of the job to its end."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_e2e_zero_code import Stack, records
from waiting import wait_for

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
