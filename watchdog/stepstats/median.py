"""``stats.median`` of a long list without sorting all of it.

The goodput ledger takes two medians over every rank for every step (~65,000
values a second at 16,384 ranks); sorting each whole list was most of its
split. Here two pivots are read from a sorted sample of the values, the values
outside them only counted (C-level filters), and the few between them sorted
(~1.0 ms instead of ~1.6 for 16,384 jittered values):
the middle order statistics are then those of the full sort, the very same
float objects, so the result is ``stats.median``'s bit for bit. Where the
pivots miss (a skewed sample) or a value is not finite, the full sort answers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from operator import ge, le

from . import stats

SMALL = 2048  # below this a full sort is as quick
SAMPLE = 256  # values sampled to place the pivots


def median(values: Sequence[float], small: int | None = None) -> float:
    """``stats.median(values)``; ``small``: SMALL unless told (tests)."""
    n = len(values)
    if n < (SMALL if small is None else small) or not math.isfinite(
        sum(values)
    ):  # NaN orders nothing; an infinity sums to one
        return stats.median(values)
    pos = (n - 1) * 0.5
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    sample = sorted(values[:: max(1, n // SAMPLE)])
    m = len(sample)
    if sample[0] == sample[-1]:  # the values look all alike: a sort of such runs is quicker than filtering
        return stats.median(values)
    reach = 2 * math.isqrt(m) + 2  # the sample's median is within ~sqrt(m)/2 ranks of the true one
    a, b = sample[max(0, m // 2 - reach)], sample[min(m - 1, m // 2 + reach)]
    upper = list(filter(partial(le, a), values))  # a <= v
    below = n - len(upper)
    mid = sorted(filter(partial(ge, b), upper))  # a <= v <= b
    if not (below <= lo and hi < below + len(mid)):
        return stats.median(values)
    x, y = mid[lo - below], mid[hi - below]
    return x + (y - x) * (pos - lo)
