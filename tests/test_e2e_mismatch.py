"""collective_mismatch end to end: real torchrun (3 gloo ranks on CPU), the hook
reading PyTorch's Flight Recorder, a real agent and coordinator. Rank 1
all-reduces a tensor of another size than ranks 0 and 2 at step 20.

- 1000 elements against 4: gloo aborts a healthy rank first (seen here: rank 0,
  SIGABRT in gloo's I/O thread, which torchrun then reports as the root cause);
  the culprit must still be rank 1, named from the recorded shapes, and the
  healthy ranks' deaths blamed on no one.
- 6 elements against 4: nothing crashes, the job hangs; the Flight Recorder's
  signatures name rank 1 with both shapes."""

from __future__ import annotations

import pytest

from watchdog.dev import scenario

pytestmark = pytest.mark.integration

CASES = [("mismatch:1@20", "crash"), ("mismatch:1@20:6", "hang")]


@pytest.mark.parametrize("fault,how", CASES, ids=[c[1] for c in CASES])
def test_the_odd_rank_is_the_root_cause_whoever_dies_first(fault, how, tmp_path):
    res = scenario.run([fault], ranks=3, steps=100, timeout_s=60, work_dir=str(tmp_path))
    # The root cause is the earliest onset (the timeline's rule), whichever was detected first
    # (in the hang, collective_hang naming rank 1 may come before the Flight Recorder's read).
    assert res.findings, res.output[-2000:]
    first = min(res.findings, key=lambda f: f["onset_t"])
    assert (first["kind"], first["ranks"]) == ("collective_mismatch", [1]), res.findings
    assert {r for f in res.findings for r in f["ranks"]} == {1}, res.findings
    if how == "hang":
        assert first["evidence"]["source"] == "fr"
        assert "all_reduce of 6 float32 [6]" in first["reason"] and "all_reduce of 4 float32 [4]" in first["reason"]
    else:
        assert "4000 bytes" in first["reason"] or "1000 float32" in first["reason"]
