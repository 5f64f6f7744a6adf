"""collective_mismatch: ranks issued different collectives at the same (group, seq).

The odd rank(s) are named from the recorded shapes (``mismatch.find``), whoever
died first: gloo fails on the rank that reads the odd message, often a healthy
one. The onset is when the mismatched collective was issued, before any death
it causes, so this finding is the root cause, and dead_rank spares the ranks
that issued the usual collective (see dead_rank).
"""

from __future__ import annotations

from ...contracts.finding import Finding, group_name, ranks_phrase
from ..analysis.mismatch import find
from ..config import DetectorConfig
from ..view.cluster import ClusterView

SOURCES = {"fr": "the Flight Recorder", "hook": "the hook's collective marks"}


class CollectiveMismatch:
    name = "collective_mismatch"

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        m = find(view)
        if m is None:
            return []
        where = f"collective #{m.seq} on {group_name(m.group)}"
        if m.odd:
            odd = "; ".join(f"rank {r}: {m.shapes[r]}" for r in m.odd)
            usual = m.shapes[m.usual[0]]
            reason = (
                f"{ranks_phrase(m.odd)} issued another collective than {ranks_phrase(m.usual)} at {where}: "
                f"{odd}, where the others issued {usual} (recorded by {SOURCES[m.source]})"
            )
        else:
            shapes = "; ".join(f"rank {r}: {s}" for r, s in m.shapes.items())
            reason = (
                f"ranks disagree at {where} and no majority tells which is odd: {shapes} "
                f"(recorded by {SOURCES[m.source]})"
            )
        return [
            Finding(
                kind=self.name,
                ranks=m.odd,
                hosts=tuple(sorted({view.ranks[r].host for r in m.odd})),
                onset_mono=m.onset,
                detected_mono=now,
                reason=reason,
                evidence={
                    "group": m.group,
                    "seq": m.seq,
                    "source": m.source,
                    "shapes": {str(r): s for r, s in m.shapes.items()},
                    "usual": list(m.usual),
                },
                wants_stacks=m.odd,
            )
        ]
