"""The selection median is ``stats.median`` exactly: random lists with ties,
signed zeros, integers, skew and non-finite values, at sizes around the point
where it stops sorting everything."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from watchdog.stepstats import stats
from watchdog.stepstats.median import median

values = st.lists(
    st.sampled_from([0.0, -0.0, 0.1, 0.1, 0.2, 1, 3.5, 1e-9])
    | st.floats(0.0, 10.0)
    | st.floats(allow_nan=True, allow_infinity=True),
    min_size=1,
    max_size=300,
)


def same(a: float, b: float) -> bool:
    return (a == b and math.copysign(1, a) == math.copysign(1, b)) or (a != a and b != b)


@settings(max_examples=400, deadline=None)
@given(values, st.integers(1, 64))
def test_equal_to_the_full_sort(xs, small):
    assert same(median(xs, small=small), stats.median(xs))


def test_long_lists_jittered_skewed_and_tied():
    rng = random.Random(7)
    for trial in range(60):
        n = rng.choice((2048, 2049, 5000, 16384, 16385))
        kind = trial % 4
        if kind == 0:
            xs = [rng.gauss(0.2, 0.01) for _ in range(n)]
        elif kind == 1:
            xs = [rng.choice((0.0, 0.005, 0.3)) for _ in range(n)]
        elif kind == 2:
            xs = sorted(rng.expovariate(3.0) for _ in range(n))  # sorted: the strided sample sees it all
        else:
            xs = [0.0] * (n // 2) + [rng.random() for _ in range(n - n // 2)]
        assert same(median(xs), stats.median(xs)), trial
