"""A hang inside a collective the hook cannot see, on a real 3-rank DDP job (torchrun,
gloo, real agent and coordinator). The model has a BatchNorm, so DDP's ``_pre_forward``
broadcasts its buffers from rank 0 in every forward: a collective issued from C++,
invisible to the hook's patching. Rank 0's data loader blocks before its forward at
step 3; ranks 1 and 2 wait in the broadcast for it. Only the Flight Recorder shows
where they are; the finding must name rank 0 and nobody else (the hook's marks alone
named every rank: no rank was in a collective they could see)."""

from __future__ import annotations

import pytest

from watchdog.dev import scenario

pytestmark = pytest.mark.integration


def test_the_rank_stuck_in_its_loader_is_the_only_one_named_while_the_others_wait_in_ddp(tmp_path):
    pytest.importorskip("torch")
    res = scenario.run(
        ["loader-hang:0@3"], ranks=3, steps=50, linger_s=2.0, timeout_s=90, script_args=["--buffers"],
        work_dir=str(tmp_path),
    )  # fmt: skip
    hangs = [f for f in res.findings if f["kind"] == "collective_hang" and f["ranks"]]
    assert hangs, res.findings or res.output[-3000:]
    assert all(f["ranks"] == [0] for f in hangs), res.findings
    first = hangs[0]["reason"]
    assert "never entered broadcast #" in first and "(per the Flight Recorder); ranks 1-2 waiting" in first, first
    assert "data loader" in first
    assert not [f for f in res.findings if {1, 2} & set(f["ranks"])], res.findings
