"""loss_anomaly: NaN on one rank (host-attributable), divergence, spikes. Pure, no sleeps."""

from __future__ import annotations

from array import array

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
    base: list[tuple[int, list[float], dict]] = [(s, [1.0 + 0.01 * (s % 3)] * 4, {}) for s in range(1, 12)]
    v = fold_series([*base, (12, [1.0, 9.0, 1.0, 1.0], {})])
    (f,) = DET.check(120.0, v)
    assert f.ranks == (1,) and f.hosts == () and f.evidence["cause"] == "spike" and f.evidence["step"] == 12


def test_spike_on_every_rank_is_job_wide_and_noise_is_not_a_spike():
    base: list[tuple[int, list[float], dict]] = [(s, [1.0 + 0.05 * (s % 4)] * 4, {}) for s in range(1, 12)]
    assert DET.check(120.0, fold_series([*base, (12, [1.3, 1.25, 1.2, 1.3], {})])) == []
    (f,) = DET.check(120.0, fold_series([*base, (12, [8.0, 9.0, 7.0, 8.5], {})]))
    assert f.ranks == () and "every rank" in f.reason


def _spike_reference(hist):
    """The spike test, sample by sample, as loss_anomaly runs it on a rank not screened
    out (on the (step, loss) pairs it once kept)."""
    import statistics

    from watchdog.coordinator.view.loss_screen import SPIKE_MADS, SPIKE_MIN_HISTORY, SPIKE_RATIO, SPIKE_RECENT

    for i in range(max(SPIKE_MIN_HISTORY, len(hist) - SPIKE_RECENT), len(hist)):
        base = [v for _, v in hist[:i]]
        med = statistics.median(base)
        mad = statistics.median(abs(v - med) for v in base) * 1.4826
        bound = max(med + SPIKE_MADS * mad, med * SPIKE_RATIO if med > 0 else med + SPIKE_MADS * mad)
        if hist[i][1] > bound:
            return True
    return False


def test_a_calm_rank_never_holds_a_spike():
    """The screen that spares the spike test on most ranks (loss_screen.calm) is
    exact: whatever the history (falling, noisy, negative, zero, spiking at the
    bound), a rank it calls calm is one the full test finds no spike on."""
    import random

    from watchdog.coordinator.view.loss_screen import calm

    rng = random.Random(7)
    calm_seen = spikes_seen = 0
    for trial in range(3000):
        n = rng.randrange(0, 70)
        shape = rng.choice(("flat", "falling", "noisy", "negative", "zeros", "spiky"))
        vals = []
        for k in range(n):
            v = {
                "flat": 2.0 + rng.gauss(0, 0.01),
                "falling": 10.0 / (1 + k) + rng.uniform(0, 0.1),
                "noisy": rng.uniform(0.01, 3.0),
                "negative": -1.0 + rng.gauss(0, 0.5),
                "zeros": rng.choice((0.0, 0.0, 1.0)),
                "spiky": 1.0 + rng.gauss(0, 0.05),
            }[shape]
            if shape == "spiky" and rng.random() < 0.1:
                v *= rng.uniform(1.5, 30.0)  # near and far past the bound
            vals.append(v)
        hist = tuple((100 + k, v) for k, v in enumerate(vals))
        spiked = _spike_reference(hist)
        spikes_seen += spiked
        if calm(array("d", vals)):
            calm_seen += 1
            assert not spiked, (trial, shape, hist)
    assert calm_seen > 500 and spikes_seen > 50  # both sides exercised


def test_a_spike_on_one_rank_is_still_named_with_the_others_screened_out():
    series = [(100 + i, [1.0 + 0.01 * (i % 3)] * 4, None) for i in range(20)]
    series.append((120, [1.0, 1.0, 9.0, 1.0], None))
    v = fold_series(series)
    assert [rv.loss_calm for rv in v.ranks.values()] == [True, True, False, True]
    (f,) = DET.check(121.0, v)
    assert f.ranks == (2,) and f.evidence["cause"] == "spike"
