"""Small robust statistics, pure and dependency-free (the coordinator must not
need numpy)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import repeat
from operator import sub


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile; 0.0 for no values."""
    if not values:
        return 0.0
    items = sorted(values)
    pos = (len(items) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(items) - 1)
    return items[lo] + (items[hi] - items[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


def trimmed_mean(values: Sequence[float], trim: float = 0.1) -> float:
    """Mean of the values with ``trim`` of them cut from each end: as efficient
    as the mean on jitter, as robust as the median to a few GC-pause outliers."""
    if not values:
        return 0.0
    items = sorted(values)
    cut = int(len(items) * trim)
    kept = items[cut : len(items) - cut] or items
    return sum(kept) / len(kept)


def clipped_mean(values: Sequence[float], k: float = 3.0) -> float:
    """Mean after clamping values to median +- k robust standard deviations
    (1.4826 x MAD). On ordinary jitter nothing is clamped, so it is as efficient
    as the mean (the straggler detector needs every bit of that); a GC pause or a
    one-off stall moves it by at most k sigma / n instead of its full length."""
    if not values:
        return 0.0
    med = median(values)
    mad = median([abs(v - med) for v in values]) * 1.4826
    if mad <= 0:
        return med
    lo, hi = med - k * mad, med + k * mad
    return sum(min(max(v, lo), hi) for v in values) / len(values)


def clipped_stdev(values: Sequence[float], k: float = 3.0) -> float:
    """Standard deviation after the same clamping as ``clipped_mean``."""
    n = len(values)
    if n < 2:
        return 0.0
    med = median(values)
    mad = median([abs(v - med) for v in values]) * 1.4826
    lo, hi = (med - k * mad, med + k * mad) if mad > 0 else (med, med)
    xs = [min(max(v, lo), hi) for v in values]
    mean = sum(xs) / n
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))


def clipped_mean_stdev(values: Sequence[float], k: float = 3.0) -> tuple[float, float]:
    """``(clipped_mean(values, k), clipped_stdev(values, k))``, the median and MAD
    computed once (the same numbers, bit for bit)."""
    n = len(values)
    if not n:
        return 0.0, 0.0
    items = sorted(values)
    med = _sorted_median(items)
    mad = median(list(map(abs, map(sub, values, repeat(med))))) * 1.4826  # |v - med|, C-level
    lo, hi = (med - k * mad, med + k * mad) if mad > 0 else (med, med)
    # Usually nothing is clamped (the sorted ends say so): the values as they are, in
    # their order, so the sums below are the same floats (the verdict runs this for
    # up to 2,048 ranks a tick).
    xs = values if lo <= items[0] and items[-1] <= hi else [min(max(v, lo), hi) for v in values]
    mean = sum(xs) / n
    sd = math.sqrt(sum(map(pow, map(sub, xs, repeat(mean)), repeat(2))) / (n - 1)) if n >= 2 else 0.0  # (x - mean) ** 2
    return (mean if mad > 0 else med), sd


def _sorted_median(items: Sequence[float]) -> float:
    """``median`` of values already sorted (the same interpolation)."""
    pos = (len(items) - 1) * 0.5
    lo = math.floor(pos)
    hi = min(lo + 1, len(items) - 1)
    return items[lo] + (items[hi] - items[lo]) * (pos - lo)


def median_without(sorted_values: Sequence[float], index: int) -> float:
    """Median of ``sorted_values`` with the element at ``index`` left out, in
    O(1): comparing each of n ranks with the others costs O(n log n), not O(n^2)."""
    n = len(sorted_values) - 1
    if n <= 0:
        return 0.0

    def at(j: int) -> float:
        return sorted_values[j if j < index else j + 1]

    mid = n // 2
    return at(mid) if n % 2 else (at(mid - 1) + at(mid)) / 2


def data_share(samples: Sequence) -> float:
    """Share of step time spent waiting on data, leaving out the top 10% of steps
    by data wait: one slow first batch of an epoch is not starvation, a loader
    that stalls every few steps still is."""
    if not samples:
        return 0.0
    kept = sorted(samples, key=lambda x: x.data_s)[: len(samples) - max(1, len(samples) // 10)] or list(samples)
    step = sum(x.step_s for x in kept)
    return sum(x.data_s for x in kept) / step if step > 0 else 0.0
