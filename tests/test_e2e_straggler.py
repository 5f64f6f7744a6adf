"""Rank 0 slower by work of its own, end to end: real torchrun (2 gloo ranks on
CPU), the hook, a real agent reading each rank's run-queue wait from /proc, a
real coordinator. It is the ``extra_work`` advisory (never a page), not a
``straggler`` finding, and its evidence carries the agent's schedstat reads
(the host left rank 0 its CPU). The noisy neighbour's side of those reads is
tests/test_agent_runq.py; the rules, tests/test_coord_slowcause.py."""

from __future__ import annotations

import pytest

from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.dev import scenario

pytestmark = pytest.mark.integration


def test_rank_0_slower_by_its_own_work_is_advice_not_a_page(tmp_path):
    res = scenario.run(["slow:0:1.6"], ranks=2, steps=300, timeout_s=180, work_dir=str(tmp_path))
    found = [r for r in journal.read(res.summary["journal"]) if r["event"] == je.FINDING]
    assert [(f["kind"], f["ranks"]) for f in found] == [("extra_work", [0])], found
    (advice,) = found
    assert "work it does alone" in advice["reason"] and "so it is not its host" in advice["reason"], advice
    ev = advice["evidence"]
    assert 1.3 < ev["factor"] < 2.0 and ev["cost_share"] > 0.1, ev
    # Both ranks' run-queue shares came from the agent's schedstat reads, over the wire.
    assert ev["runq_contention"] - ev["runq_baseline_contention"] < 0.25, ev
    assert ev["runq_wait_share"] + ev["runq_baseline_wait_share"] > 0, ev
