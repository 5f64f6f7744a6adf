"""Which ranks' losses could hold a spike at all, decided as each loss is folded.

loss_anomaly's spike test compares each of a rank's last ``SPIKE_RECENT``
losses with a robust bound of the losses before it: two medians per sample.
Run on every rank every tick, that was 1.1-1.3 s a tick at 16,384 ranks
reporting losses. But that bound is never below twice the median of the earlier
losses (when the median is positive), and that median is never below their
minimum. So a rank whose recent losses are all at most twice the minimum of
its earlier ones holds no spike, exactly: ``calm`` says so, once per new loss
(the fold builds the new history then anyway), and the detector runs its test
only on the ranks that are not calm.
"""

from __future__ import annotations

from collections.abc import Sequence

SPIKE_MIN_HISTORY = 8  # earlier samples needed before a spike can be judged
SPIKE_RECENT = 8  # samples in which a spike is still reported
SPIKE_MADS = 10.0
SPIKE_RATIO = 2.0


def calm(values: Sequence[float]) -> bool:
    """No sample that the spike test judges (``values[i]`` for the last
    ``SPIKE_RECENT`` with ``i >= SPIKE_MIN_HISTORY``) can exceed its bound: each
    is at most ``SPIKE_RATIO`` x the minimum of the samples before the newest,
    which is at most ``SPIKE_RATIO`` x the median of those before it."""
    n = len(values)
    if n <= SPIKE_MIN_HISTORY:
        return True  # too few to judge any
    floor = min(values[:-1])
    peak = max(values[max(SPIKE_MIN_HISTORY, n - SPIKE_RECENT) :])
    return floor > 0 and peak <= SPIKE_RATIO * floor
