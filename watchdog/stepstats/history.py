"""``StepStats.history`` without a copy per report: a read-only view of a run of
samples in a list that successive histories of one rank share.

A rank's history is its last ``history_steps`` (256) samples, and each report
adds ~4. As a tuple, every report built a new one (the old history plus the new
samples, then its last 256): two copies of ~256 pointers, and a reference count
changed on each of 256 samples scattered over the heap, then again when the old
tuple was freed; ~256 cache misses per rank per report, at 16,384 ranks
~60-80 us of a ~500 us report. Here the next history appends its samples to the
buffer it shares with the one before and only moves its bounds; the buffer is
copied (its last ``history_steps`` samples into a new one) when it reaches
twice that, once per ~64 reports.

A buffer is only ever appended to, and only by the newest history on it (its
"tip": the one that ends where the buffer ends), so the samples a ``History``
shows never change. Folding into an older history (the pure ``view.fold``
folding into an older view, a StepStats kept from before) finds it is not the
tip and copies it into a buffer of its own. Like ``steps._Running``, this
relies on one writer at a time per rank (the Folder folds under its lock).

A ``History`` reads as the tuple of its samples: length, truth, indexing,
slices (tuples), iteration, ``reversed``, ``in``, ``==`` with a tuple or
another ``History``, ``hash``, ``repr``, ``+``; a copy or pickle of it is that
tuple."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from operator import index
from typing import Any, overload

from watchdog.contracts.report import StepSample


class History:
    """``buf[start:end]`` of a buffer shared with the rank's other histories;
    never empty (an empty history is ``()``). The three are read (never set)
    by ``steps.add_samples``, which reads the newest sample without a call."""

    __slots__ = ("buf", "end", "start")

    def __init__(self, buf: list[StepSample], start: int, end: int) -> None:
        self.buf = buf
        self.start = start
        self.end = end

    def __len__(self) -> int:
        return self.end - self.start

    def __bool__(self) -> bool:
        return True  # never empty

    @overload
    def __getitem__(self, i: int) -> StepSample: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[StepSample, ...]: ...

    def __getitem__(self, i: int | slice) -> StepSample | tuple[StepSample, ...]:
        start, end = self.start, self.end
        if i.__class__ is int:  # the usual read: [-1]
            at = start + i if i >= 0 else end + i
            if start <= at < end:
                return self.buf[at]
            raise IndexError("tuple index out of range")
        if isinstance(i, slice):
            a, b, step = i.indices(end - start)
            if step == 1:
                return tuple(self.buf[start + a : start + b]) if a < b else ()
            return tuple(self.buf[start:end][i])
        try:
            return self[index(i)]
        except TypeError:
            raise TypeError(f"tuple indices must be integers or slices, not {type(i).__name__}") from None

    def __iter__(self) -> Iterator[StepSample]:
        return iter(self.buf[self.start : self.end])

    def __reversed__(self) -> Iterator[StepSample]:
        # From the end, reading only the samples the caller gets to (the newest,
        # usually): a reversed copy would touch every sample.
        n = len(self.buf)
        return islice(reversed(self.buf), n - self.end, n - self.start)

    def __contains__(self, x: object) -> bool:
        return x in self.buf[self.start : self.end]

    def as_tuple(self) -> tuple[StepSample, ...]:
        return tuple(self.buf[self.start : self.end])

    def count(self, x: object) -> int:
        return self.as_tuple().count(x)

    def index(self, x: object, *args: Any) -> int:
        return self.as_tuple().index(x, *args)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, History):
            return self.as_tuple() == other.as_tuple()
        if isinstance(other, tuple):
            return self.as_tuple() == other
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(self.as_tuple())

    def __add__(self, other: object) -> tuple[StepSample, ...]:
        if isinstance(other, History):
            return self.as_tuple() + other.as_tuple()
        if isinstance(other, tuple):
            return self.as_tuple() + other
        return NotImplemented

    def __radd__(self, other: object) -> tuple[StepSample, ...]:
        if isinstance(other, tuple):
            return other + self.as_tuple()
        return NotImplemented

    def __repr__(self) -> str:
        return repr(self.as_tuple())

    def __reduce__(self) -> tuple[Any, ...]:
        return (tuple, (self.as_tuple(),))  # a copy or pickle is the plain tuple


Sequence.register(History)

# A history as StepStats holds it: a History, or a tuple (the empty one, a
# caller's, or under a config without a bound).
Steps = tuple[StepSample, ...] | History


def appendable(h: Steps) -> tuple[list[StepSample], int, int]:
    """(buffer, origin, end): a buffer whose ``[origin:end]`` is ``h`` and that
    may be appended to: ``h``'s own if ``h`` is its tip, else a new copy."""
    if h.__class__ is History:
        buf, end = h.buf, h.end
        if len(buf) == end:
            return buf, h.start, end
        return buf[h.start : end], 0, end - h.start
    return list(h), 0, len(h)


def snapshot(buf: list[StepSample], origin: int, keep: int) -> History:
    """The last ``keep`` samples of ``buf`` (those from ``origin`` on): a
    History on ``buf``, or on a copy of them when ``buf`` has grown to twice
    ``keep`` (so a buffer holds at most ~2x the samples it shows)."""
    end = len(buf)
    start = max(origin, end - keep)
    if end >= 2 * keep and start:
        return History(buf[start:], 0, end - start)
    return History(buf, start, end)
