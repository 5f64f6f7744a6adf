"""batch_changed: an elastic restart with fewer ranks is an advisory finding
(no culprit), never acted on by the policy, never paged for."""

from __future__ import annotations

from pathlib import Path

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors.batch_changed import BatchChanged
from watchdog.coordinator.policy_file import PolicyError, parse_policy

RULES = Path(__file__).parent.parent / "deploy" / "prometheus" / "rules" / "watchdog-alerts.rules.yml"


def test_fewer_ranks_after_a_restart():
    old = t.view([t.rank(r, world_size=4, alive=r < 2) for r in range(4)], now=10.0, ranks_per_host=2)
    new = t.view(
        [t.rank(r, world_size=2, pid=2000 + r, proc_start_us=1_800_000_000_000_000) for r in range(2)],
        now=20.0,
        ranks_per_host=2,
        base=old,
        seq=2,
    )
    [f] = BatchChanged(DetectorConfig()).check(20.0, new)
    assert f.ranks == () and f.wants_stacks == ()
    assert f.evidence["old_world_size"] == 4 and f.evidence["new_world_size"] == 2
    assert "restarted with 2 ranks instead of 4" in f.reason and "learning rate" in f.reason


def _restart(old_batch: int, new_batch: int):
    """8 ranks with ``old_batch`` samples each come back as 4 with ``new_batch`` (0: not known)."""
    old = t.view([t.rank(r, world_size=8, alive=r < 4, batch_per_rank=old_batch) for r in range(8)], now=10.0)
    return t.view(
        [
            t.rank(r, world_size=4, pid=2000 + r, proc_start_us=1_800_000_000_000_000, batch_per_rank=new_batch)
            for r in range(4)
        ],
        now=20.0,
        base=old,
        seq=2,
    )


def test_old_and_new_global_batch_where_the_hook_knows_the_per_rank_batch():
    [f] = BatchChanged(DetectorConfig()).check(20.0, _restart(32, 32))
    e = f.evidence
    assert (e["old_global_batch"], e["new_global_batch"]) == (256, 128)
    assert (e["old_per_rank_batch"], e["per_rank_batch"], e["global_batch_ratio"]) == (32, 32, 0.5)
    assert "the global batch is 128 samples instead of 256 (32 per rank, was 32)" in f.reason
    assert "keep the global batch with 64 per rank" in f.reason


def test_a_script_that_kept_its_global_batch_raises_nothing():
    """It doubled its per-rank batch for half the ranks: the learning rate still fits."""
    assert BatchChanged(DetectorConfig()).check(20.0, _restart(32, 64)) == []


def test_per_rank_batch_unknown_falls_back_to_the_world_size_ratio():
    [f] = BatchChanged(DetectorConfig()).check(20.0, _restart(0, 0))
    assert f.evidence["per_rank_batch"] is None and f.evidence["global_batch_ratio"] == 0.5
    assert "with the same per-rank batch the global batch is 0.5x" in f.reason


@pytest.mark.parametrize(
    "states",
    [
        [t.rank(r, world_size=4) for r in range(4)],  # steady
        [t.rank(r, world_size=4) for r in range(2)],  # ranks still joining
    ],
)
def test_no_finding_without_a_change(states):
    assert BatchChanged(DetectorConfig()).check(100.0, t.view(states)) == []


def test_the_policy_cannot_act_on_it():
    assert parse_policy('[actions]\nbatch_changed = "alert"\n').action_for("batch_changed") == "alert"
    with pytest.raises(PolicyError, match="advisory"):
        parse_policy('[actions]\nbatch_changed = "restart"\n')


def test_no_alert_pages_for_it():
    text = RULES.read_text()
    assert "batch_changed" not in text
