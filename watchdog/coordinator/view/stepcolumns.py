"""One step's samples across the ranks that reported it, as columns: what the
goodput ledger buffers until every live rank has reported the step, then splits.

Columns of doubles (arrays, filled a block of ranks at a time by copying)
rather than a sample object per rank: the split reads every value of every
step, ~65,000 samples a second at 16,384 ranks, and a float made while reading
an array and dropped at once is cheaper than one kept alive in a list."""

from __future__ import annotations

from array import array


class StepColumns:
    """Per row: the rank (``ranks``), step time, data wait, compute before
    clipping ((step - data) - collective) and pause flag (1.0: a checkpoint or
    eval phase); ``seen``: the ranks with a row. A rank added again keeps its
    first row's place and takes the new values (what a dict of rank -> sample
    did: a restarted rank's step)."""

    __slots__ = ("compute_s", "data_s", "pause", "ranks", "seen", "step_s")

    def __init__(self) -> None:
        self.ranks: list[int] = []
        self.seen: set[int] = set()
        self.step_s = array("d")
        self.data_s = array("d")
        self.compute_s = array("d")
        self.pause = array("d")

    def __len__(self) -> int:
        return len(self.ranks)

    def extend(self, ranks: list[int], step_s: array, data_s: array, compute_s: array, pause: array) -> None:
        """Add a row per rank (``ranks`` distinct)."""
        had = len(self.seen)
        self.seen.update(ranks)
        self.ranks += ranks
        self.step_s += step_s
        self.data_s += data_s
        self.compute_s += compute_s
        self.pause += pause
        if len(self.seen) != had + len(ranks):  # a rank had a row already: keep its place, the new values
            newest = dict(zip(self.ranks, range(len(self.ranks))))  # rank -> its last row
            rows = [newest[r] for r in dict.fromkeys(self.ranks)]  # in the order ranks first came
            self.ranks = [self.ranks[i] for i in rows]
            self.step_s = array("d", [self.step_s[i] for i in rows])
            self.data_s = array("d", [self.data_s[i] for i in rows])
            self.compute_s = array("d", [self.compute_s[i] for i in rows])
            self.pause = array("d", [self.pause[i] for i in rows])

    def paused(self) -> bool:
        """A row in a checkpoint or eval phase (compared as bytes: no float made)."""
        return self.pause.tobytes().count(0) != 8 * len(self.pause)

    def rows(self) -> dict[int, tuple[float, float, float, float]]:
        """rank -> (step_s, data_s, compute_s, pause), in row order (for tests and debugging)."""
        return {
            r: (s, d, c, p) for r, s, d, c, p in zip(self.ranks, self.step_s, self.data_s, self.compute_s, self.pause)
        }
