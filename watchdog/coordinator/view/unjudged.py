"""Deaths a launcher replaced before any tick judged them stay in view until one has.

dead_rank judges a death only once every other host reported since it (or 1.5
report intervals passed, longer while a host is silent): one of them may hold an
earlier death, the root cause. torchrun (``--max-restarts``) replaces a failed
group within seconds, and the dead rank's agent tells the death once, then its
successor: a successor folded before that patience ran out took the dead
incarnation's place in the view, and the death was never judged (journaled with
its cause, no finding). On several hosts that is the common case, whenever
another host's report is late.

So every death folded is pending (``died``) until a tick judged it: a tick whose
dead_rank check waited for no death, on a view that showed it dead (``release``).
A pending death whose successor is folded is held (``hold``): the coordinator
shows it in place of the successor (``overlay``) until then, so it is judged, root
cause first, as if the successor had come later; the successor is folded meanwhile
and shown from the next view on, with everything it reported. A death judged
already is not held. A rank replaced again while held keeps the earliest death
(the root cause). Nothing is pending longer than ``HOLD_MAX_S``, whatever the ticks do.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from . import columns
from .cluster import ClusterView, FoldedRank

HOLD_MAX_S = 60.0  # a death is judged within the silence limit; past this, show the successor anyway


class Unjudged:
    """Deaths not judged yet, and those held in view. Not thread-safe: the coordinator
    calls it under its lock."""

    def __init__(self) -> None:
        self._pending: dict[tuple[int, int], float] = {}  # (rank, pid) -> when its death was folded
        self._held: dict[int, tuple[FoldedRank, float]] = {}  # rank -> (dead incarnation, held since)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def died(self, rank: int, pid: int, now: float) -> None:
        """A report said this incarnation is gone."""
        self._pending.setdefault((rank, pid), now)

    def hold(self, dead: list[FoldedRank], now: float) -> None:
        """Incarnations whose successor was just folded (``Folder.take_replaced``), oldest first."""
        for rv in dead:
            if (rv.rank, rv.state.pid) in self._pending:
                self._held.setdefault(rv.rank, (rv, now))

    def overlay(self, view: ClusterView) -> ClusterView:
        """``view`` with each held death in place of its rank's successor (the same ranks, in
        the same order; columns patched, not rebuilt)."""
        shown = {r: rv for r, (rv, _) in self._held.items() if r in view.ranks}
        if not shown:
            return view
        ranks = MappingProxyType({r: shown.get(r, rv) for r, rv in view.ranks.items()})
        return columns.attach(replace(view, ranks=ranks), columns.with_rows(columns.of(view), shown))

    def release(self, view: ClusterView, now: float, judged: bool) -> None:
        """A tick ran on ``view``: ``judged``, its dead_rank check waited for no death, so
        the deaths ``view`` showed are judged (and no longer held); any pending too long goes too."""
        for key, since in list(self._pending.items()):
            rv = view.ranks.get(key[0])
            shown = rv is not None and rv.state.pid == key[1] and rv.died_at is not None
            if (judged and shown) or now - since >= HOLD_MAX_S:
                del self._pending[key]
                held = self._held.get(key[0])
                if held is not None and held[0].state.pid == key[1]:
                    del self._held[key[0]]
