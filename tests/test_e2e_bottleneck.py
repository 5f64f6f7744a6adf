"""A communication-bound job, end to end: real torchrun (4 gloo ranks on CPU),
each step a 16 MB all-reduce on 5 ms of compute. The coordinator must call it
communication-bound, and its goodput counters must add up to the wall time the
journal spans. (Data-bound, straggler-bound and healthy verdicts ride on the
runs of test_e2e_faults.py: one real run per verdict.)"""

from __future__ import annotations

import pytest

from watchdog.coordinator import goodput, journal
from watchdog.coordinator import journal_events as je
from watchdog.dev import scenario

pytestmark = pytest.mark.integration


def test_large_all_reduce_on_small_compute_is_communication_bound(tmp_path):
    res = scenario.run(
        [], steps=120, compute_ms=5.0, timeout_s=150, work_dir=str(tmp_path), script_args=["--comm-mb", "16"]
    )
    assert res.summary["job_exit_code"] == 0, res.output[-2000:]
    recs = journal.read(res.summary["journal"])
    verdicts = [r for r in recs if r["event"] == je.VERDICT]
    assert [v["verdict"] for v in verdicts] == ["communication"], verdicts
    assert verdicts[0]["reason"].startswith("communication-bound: ")
    final = [r for r in recs if r["event"] == je.GOODPUT][-1]
    span = goodput.job_span(recs)
    assert span is not None, "no rank exited cleanly"
    accounted = sum(final["seconds"].values()) + final["pending_s"]
    assert abs(accounted - span) <= 0.01 * span + 0.5, (accounted, span)  # + a report interval and a tick
    assert final["profile"]["coll_s"] > final["profile"]["compute_s"], final["profile"]
