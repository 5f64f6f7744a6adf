"""Garbage collection for a heap of millions of small, acyclic objects.

The cluster view holds each rank's step history (256 samples a rank: about
4 million objects at 16,384 ranks). Every report replaces a few of them, and
CPython's cyclic collector walks the whole old generation each time a quarter
of it has been replaced: measured in-process at 16,384 ranks, collection was
two thirds of decoding a report (788 us a report with it, 250 us without).

So after each tick the objects alive are moved out of the collector's sight
(``gc.freeze``): later collections walk only what is new. Nothing leaks through
that for acyclic data, which reference counting frees the moment it is dropped,
frozen or not. A reference cycle frozen before it became garbage would stay,
so now and then everything is unfrozen and collected once: ``FULL_EVERY_S``
after the start, then twice as long after each that found nothing (up to
``FULL_MAX_S``), back to ``FULL_EVERY_S`` after one that found something. That
collection holds the interpreter (~4.4 s at 16,384 ranks), and a real
coordinator under load leaves no cycles (measured; docs/benchmarks.md has the
coordinator at 16,384 ranks), so at a fixed 10 minutes it stopped the request loop six times an hour
for nothing. What the doubling could let pile up is bounded by memory: once
``FULL_EVERY_S`` has passed since the last one, a process whose peak RSS grew by
``GROWTH`` since then is collected at once, whatever the interval.

And before each tick (``before_tick``): at 16,384 ranks a second of reports
leaves ~1 million new objects that no freeze has hidden yet, and a tick part
that allocates tens of thousands of its own (the straggler scores when windows
close: a few per rank) set off full collections that walked all of them, in
whichever part allocated. Freezing first leaves a tick's collections only the
tick's own objects. ``gc.freeze`` is O(1).

And after each accepted report (``after_report``): what it left behind (its
ranks' new states and step samples, ~400 objects) is frozen at once, so the
collections the next reports set off never walk it. Before, the ~1 million
objects a second of reports leaves stayed visible until the next tick and young
and middle collections walked them over and over: measured in-process at
16,384 ranks, 78 us of a ~290 us schema step per report, 0 with the freeze
(``gc.freeze`` also resets the young count, so no collection runs mid-intake).

And the young generation is collected every ``YOUNG_THRESHOLD`` allocations
instead of CPython's 700: a report at 16,384 ranks allocates a few hundred
objects (a RankState, a CollectiveState and its step samples per rank), so the
default ran a young collection every report or two, each walking what the last
reports left; that was 89-162 us of a ~430 us fold. The objects are acyclic and
freed by reference counting whatever the threshold; a collection every
50,000 allocations walks at most that many, a few ms.
"""

from __future__ import annotations

import gc
import resource
from collections.abc import Callable
from dataclasses import dataclass

FULL_EVERY_S = 600.0  # the first full collection, and the interval after one that found garbage
FULL_MAX_S = 4 * 3600.0  # the longest interval, after collections that found nothing
GROWTH = 1.25  # peak RSS grown this much since the last full collection: one is due (after FULL_EVERY_S)
YOUNG_THRESHOLD = 50_000


def peak_rss() -> int:
    """The process's peak resident set (KB on Linux): O(1), unlike counting the frozen objects."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class GcPolicy:
    def __init__(
        self,
        now: float,
        enabled: bool = True,
        young_threshold: int = YOUNG_THRESHOLD,
        rss: Callable[[], int] = peak_rss,
    ) -> None:
        self.enabled = enabled
        self._rss = rss
        self._last_full = now
        self._every = FULL_EVERY_S
        self._rss_after: int | None = None  # peak RSS at the last full collection (None: none yet)
        if enabled:  # the process's collector: only a daemon that owns its process sets it
            _, older, oldest = gc.get_threshold()
            gc.set_threshold(young_threshold, older, oldest)

    def before_tick(self) -> None:
        if self.enabled:
            gc.freeze()

    def after_report(self) -> None:
        if self.enabled:
            gc.freeze()

    def after_tick(self, now: float) -> FullCollection | None:
        """Freeze what the tick left; when a full collection is due, first unfreeze
        and collect everything: then what it walked and found, and when the next
        is due (the daemon times it and says so)."""
        if not self.enabled:
            return None
        full = None
        if self._due(now):
            walked = gc.get_freeze_count()
            gc.unfreeze()
            found = gc.collect()
            self._every = min(2 * self._every, FULL_MAX_S) if found == 0 else FULL_EVERY_S
            self._last_full = now
            self._rss_after = self._rss()
            full = FullCollection(walked, found, self._every)
        gc.freeze()
        return full

    def _due(self, now: float) -> bool:
        since = now - self._last_full
        if since >= self._every:
            return True
        return since >= FULL_EVERY_S and self._rss_after is not None and self._rss() > GROWTH * self._rss_after


@dataclass(frozen=True)
class FullCollection:
    """One periodic full collection. It holds the interpreter, so the request
    loop waits the whole time: ~4.4 s for the ~5.9 M objects of a 16,384-rank
    view with full histories (``benchmarks/scale_profile.py --full-gc``)."""

    frozen: int  # objects frozen before it, all walked
    unreachable: int  # what it found to free (cycles frozen while in use)
    next_in_s: float = FULL_EVERY_S  # when the next one is due at the latest
