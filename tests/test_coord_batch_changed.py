"""batch_changed: an elastic restart with fewer ranks is an advisory finding
(no culprit), never acted on by the policy, never paged for."""

from __future__ import annotations

from pathlib import Path

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors.batch_changed import BatchChanged
from watchdog.coordinator.policy import PolicyError, parse_policy

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
