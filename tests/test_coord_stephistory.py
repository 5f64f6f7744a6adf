"""``StepStats.history`` is a ``stephistory.History`` (a run of a buffer shared
with the rank's other histories) where it was a tuple: every reader must see
exactly what the tuple showed, and no history may ever show another's samples
(a buffer is appended to by the newest history on it only)."""

from __future__ import annotations

import copy
import pickle
import random
from bisect import bisect_left, bisect_right
from operator import attrgetter

import pytest

from watchdog.coordinator.config import DetectorConfig
from watchdog.report import StepSample
from watchdog.stepstats.history import History, appendable, snapshot
from watchdog.stepstats.steps import StepStats, add_samples

_STEP = attrgetter("step")


def samples(first: int, n: int) -> list[StepSample]:
    return [StepSample(first + i, 0.1 + i / 1000, 0.01, 0.0) for i in range(n)]


def histories(rng: random.Random) -> list[tuple[History, tuple[StepSample, ...]]]:
    """Histories at random places in buffers longer than them, each with the tuple it must read as."""
    out = []
    for _ in range(60):
        buf = samples(rng.randrange(100), rng.randrange(1, 40))
        start = rng.randrange(len(buf))
        end = rng.randrange(start + 1, len(buf) + 1)
        out.append((History(buf, start, end), tuple(buf[start:end])))
    return out


def test_a_history_reads_as_the_tuple_of_its_samples():
    rng = random.Random(5)
    for h, t in histories(rng):
        n = len(t)
        assert len(h) == n and bool(h) and h == t and t == h and (h != t) is False and (t != h) is False
        assert hash(h) == hash(t) and repr(h) == repr(t) and str(h) == str(t)
        assert list(h) == list(t) and list(reversed(h)) == list(reversed(t)) and tuple(h) == t
        for i in range(-n - 2, n + 2):
            if -n <= i < n:
                assert h[i] is t[i]
            else:
                with pytest.raises(IndexError):
                    h[i]
        bounds = [None, *range(-n - 3, n + 4)]
        for _ in range(200):
            sl = slice(rng.choice(bounds), rng.choice(bounds), rng.choice((None, 1, 1, 2, 3, -1, -2)))
            got = h[sl]
            assert type(got) is tuple and got == t[sl], sl
        for x in (t[0], t[-1], StepSample(-1, 0.0, 0.0, 0.0), None):
            assert (x in h) == (x in t)
            assert h.count(x) == t.count(x)
        assert h.index(t[-1]) == t.index(t[-1])
        with pytest.raises(ValueError):
            h.index(None)
        assert h + t == t + t and t + h == t + t and h + h == t + t and h + () == t
        assert h[False] is t[False]  # any index, as a tuple takes it
        with pytest.raises(TypeError):
            h["0"]  # type: ignore[call-overload]
        assert copy.copy(h) == t and copy.deepcopy(h) == t and pickle.loads(pickle.dumps(h)) == t
        assert type(pickle.loads(pickle.dumps(h))) is tuple
        for k in (t[0].step - 1, t[0].step, t[-1].step, t[-1].step + 1, (t[0].step + t[-1].step) // 2):
            assert bisect_right(h, k, key=_STEP) == bisect_right(t, k, key=_STEP)  # goodput's search
            assert bisect_left(h, k, key=_STEP) == bisect_left(t, k, key=_STEP)
        assert h != t[:-1] and h != (*t, t[0]) and h != list(t) and h != 3


def test_histories_compare_by_their_samples_not_their_buffers():
    buf = samples(0, 10)
    assert History(buf, 2, 5) == History(samples(0, 10), 2, 5) == History(buf[2:5], 0, 3)
    assert History(buf, 2, 5) != History(buf, 2, 6) and History(buf, 2, 5) != History(buf, 3, 6)
    assert StepStats(history=History(buf, 2, 5)) == StepStats(history=tuple(buf[2:5]))  # as a field too


def test_a_branch_copies_and_the_tip_appends_without_touching_older_histories():
    """appendable/snapshot: the newest history on a buffer appends in place; any
    other (a branch off an older one) gets a buffer of its own."""
    xs, other = samples(0, 5), samples(100, 1)
    buf, origin, _ = appendable(())
    buf += xs[:3]
    a = snapshot(buf, origin, 4)
    buf, origin, end = appendable(a)
    assert buf is a.buf and (origin, end) == (0, 3)  # a is the tip: its buffer, appended to
    buf += xs[3:]
    b = snapshot(buf, origin, 4)
    assert b.buf is a.buf and a == tuple(xs[:3]) and b == tuple(xs[1:])
    buf, origin, end = appendable(a)  # a again: no longer the tip
    assert buf is not a.buf and buf == xs[:3] and (origin, end) == (0, 3)
    buf += other
    c = snapshot(buf, origin, 4)
    assert a == tuple(xs[:3]) and b == tuple(xs[1:]) and c == (*xs[:3], *other)
    buf, origin, end = appendable(b)  # b is still its buffer's tip
    assert buf is b.buf and (origin, end) == (1, 5)


def test_a_buffer_is_copied_when_it_reaches_twice_what_it_shows():
    """Memory: a rank's buffer holds at most ~2x history_steps samples."""
    cfg = DetectorConfig(warmup_steps=0, history_steps=16)
    s, kept = StepStats(), []
    for k in range(0, 400, 4):
        s = add_samples(s, tuple(samples(k, 4)), cfg)
        kept.append((s, tuple(s.history)))
        h = s.history
        assert isinstance(h, History) and len(h.buf) <= 2 * cfg.history_steps
    buffers = {id(st.history.buf) for st, _ in kept}  # type: ignore[union-attr]
    assert len(buffers) <= 400 // 4 // 2  # shared: one per (2 x 16 - 16) / 4 = 4 reports at most
    assert all(st.history == t for st, t in kept)  # none shows another's samples


def test_the_next_history_shares_the_buffer():
    """The point of it: a report appends its samples, it does not copy the history."""
    cfg = DetectorConfig()
    s = StepStats()
    for k in range(0, 1200, 4):
        s = add_samples(s, tuple(samples(k, 4)), cfg)
    h = s.history
    s2 = add_samples(s, tuple(samples(1200, 4)), cfg)
    assert isinstance(h, History) and isinstance(s2.history, History)
    if len(h.buf) + 4 < 2 * cfg.history_steps:
        assert s2.history.buf is h.buf
    assert s2.history == (tuple(h) + tuple(samples(1200, 4)))[-cfg.history_steps :]
