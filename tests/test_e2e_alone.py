"""Work one rank does alone is not a hang, on a real job: ``watchdog run --
torchrun`` of an unmodified nanoGPT-shaped loop (tests/fixtures/unmodified/
rank0_eval.py, 2 ranks, gloo on CPU, a real agent and coordinator). Rank 0
alone evaluates (``model.eval()``, forwards under ``no_grad``, ~4 s) and saves a
checkpoint while rank 1 waits in DDP's all-reduce; then it spins in Python
(no forward, backward or step).

One job, asserted in order: the evaluations get no finding (the coordinator's
hang floor is 3 s here, so without the automatic eval phase each would be a
``collective_hang [0]``; the phase opens ~1.5-2 s into an evaluation, which a
2 s floor raced); rank 0's slot shows the phase the hook opened by
itself at those steps, and its progress words the forwards; the spin right
after the second is named ``collective_hang`` on rank 0 alone, a few seconds
after it began (the phase closes after 2 s with nothing moving): the first
evaluation's step, 4 s long on both ranks, does not stretch the hang deadline
(5 x its p99 would be ~20 s)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_e2e_zero_code import Stack, records
from waiting import wait_for

from watchdog.contracts import slot as wire
from watchdog.hook.testing import records_of

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parent / "fixtures" / "unmodified" / "rank0_eval.py"


def rank_slot(run_dir: Path, rank: int) -> wire.SlotSnapshot:
    for path in wire.list_slot_files(str(run_dir)):
        snap = wire.read_slot(path)
        if snap.header.identity.rank == rank:
            return snap
    raise AssertionError(f"no slot for rank {rank} in {run_dir}")


def test_an_unmarked_evaluation_alone_is_quiet_and_a_spin_after_it_is_named(tmp_path):
    stack = Stack(
        tmp_path,
        2,
        None,
        ["--steps", "40", "--eval-every", "8", "--eval-s", "4", "--out-dir", str(tmp_path)],
        env={"RANK0_EVAL_FAULT": "spin@2"},
        script=SCRIPT,
        coordinator_flags=("--hang.floor-seconds", "3"),
    ).start()
    marker = tmp_path / "fault-once"
    try:
        wait_for(marker.exists, timeout_s=150, what="rank 0 to finish its evaluations and start spinning")
        spin_at = os.stat(marker).st_mtime
        found = wait_for(
            lambda: [f for f in records(stack.jpath, "finding") if f["detected_wall"] >= spin_at],
            timeout_s=60,
            what="a finding for the spin",
            interval_s=0.2,
        )
        # A hang or a straggler during the evaluation is what this is about (a busy machine can
        # freeze both ranks' interpreters at start-up for seconds: frozen_rank's business).
        before = [
            f
            for f in records(stack.jpath, "finding")
            if f["detected_wall"] < spin_at and f["kind"] not in ("frozen_rank",)
        ]
        assert before == [], f"findings during the evaluation: {before}\n{stack.logs()}"
        hang = found[0]
        assert (hang["kind"], hang["ranks"]) == ("collective_hang", [0]), found
        latency = hang["detected_wall"] - spin_at
        assert latency < 6.0, f"spin named {latency:.1f} s after it began: {hang['reason']}"
        snap = rank_slot(stack.run_dir, 0)
        entered = [(r.step, r.payload[0]) for r in records_of(snap, wire.RecordKind.PHASE)]
        assert {(8, wire.Phase.EVAL), (16, wire.Phase.EVAL)} <= set(entered), entered  # the hook's own
        h = snap.header
        assert h.progress_word(wire.P_AUTO_COUNT) >= 2
        assert h.progress_word(wire.P_EVAL_FORWARDS) > 0 and h.progress_word(wire.P_OPTIMIZER_STEPS) == 16
        assert h.progress_word(wire.P_AUTO_PHASE) == 0  # closed: nothing moved for 2 s
    finally:
        stack.stop()
