"""loss_anomaly: NaN on one rank (host-attributable), divergence, spikes. Pure, no sleeps."""

from __future__ import annotations

from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors.loss_anomaly import LossAnomaly
from watchdog.coordinator.testing import rank, view

DET = LossAnomaly(DetectorConfig())


def states(step, losses, bad=None, world=4):
    """One report: rank r's loss at ``step`` is losses[r]; ``bad``: rank -> first bad step."""
    bad = bad or {}
    out = []
    for r in range(world):
        v = losses[r]
        finite = v == v
        out.append(
            rank(
                r,
                world_size=world,
                step=step,
                loss=v if finite else 0.0,
                loss_finite=finite,
                loss_step=step,
                loss_bad_step=bad.get(r, 0),
                loss_bad_count=1 if r in bad else 0,
            )
        )
    return out


def fold_series(series, world=4, ranks_per_host=2):
    """series: list of (step, [loss per rank], bad) folded in order, one report per second."""
    v = None
    for i, (step, losses, bad) in enumerate(series):
        v = view(states(step, losses, bad, world), now=100.0 + i, base=v, ranks_per_host=ranks_per_host, seq=i + 1)
    return v


def test_no_loss_reported_no_finding():
    assert DET.check(110.0, view([rank(r, world_size=4) for r in range(4)])) == []


def test_nan_on_one_rank_while_the_others_are_finite_blames_its_host():
    v = fold_series([(10, [1.0, 1.0, 1.0, 1.0], {}), (11, [1.0, 1.0, float("nan"), 1.0], {2: 11})])
    (f,) = DET.check(110.0, v)
    assert (f.ranks, f.hosts) == ((2,), ("host1",)) and f.evidence["host_attributable"] is True
    assert "silent data corruption" in f.reason and f.evidence["step"] == 11


def test_the_earliest_nan_is_the_root_cause_once_it_spread():
    # DDP: rank 2's NaN gradient reached every rank at the next all-reduce.
    nan = float("nan")
    v = fold_series([(11, [1.0, 1.0, nan, 1.0], {2: 11}), (12, [nan] * 4, {0: 12, 1: 12, 2: 11, 3: 12})])
    (f,) = DET.check(110.0, v)
    assert f.ranks == (2,) and f.evidence["witnesses"] == [0, 1, 3]


def test_every_rank_nan_at_once_is_divergence_with_no_culprit():
    nan = float("nan")
    (f,) = DET.check(110.0, fold_series([(12, [nan] * 4, dict.fromkeys(range(4), 12))]))
    assert f.ranks == () and f.hosts == () and "diverged" in f.reason


def test_a_rank_not_yet_at_that_step_is_waited_for():
    v = view(
        states(11, [1.0, 1.0, float("nan"), 1.0], {2: 11})[:3] + [rank(3, world_size=4, step=9, loss=1.0, loss_step=9)],
        ranks_per_host=2,
    )
    v2 = view([rank(r, world_size=4, step=10, loss=1.0, loss_step=10) for r in (0, 1)], base=v, ranks_per_host=2, seq=2)
    assert DET.check(110.0, v2) == []  # ranks 0, 1 and 3 could still turn out NaN at step 11


def test_spike_on_one_rank_names_it_without_a_host():
    base = [(s, [1.0 + 0.01 * (s % 3)] * 4, {}) for s in range(1, 12)]
    v = fold_series([*base, (12, [1.0, 9.0, 1.0, 1.0], {})])
    (f,) = DET.check(120.0, v)
    assert f.ranks == (1,) and f.hosts == () and f.evidence["cause"] == "spike" and f.evidence["step"] == 12


def test_spike_on_every_rank_is_job_wide_and_noise_is_not_a_spike():
    base = [(s, [1.0 + 0.05 * (s % 4)] * 4, {}) for s in range(1, 12)]
    assert DET.check(120.0, fold_series([*base, (12, [1.3, 1.25, 1.2, 1.3], {})])) == []
    (f,) = DET.check(120.0, fold_series([*base, (12, [8.0, 9.0, 7.0, 8.5], {})]))
    assert f.ranks == () and "every rank" in f.reason
