"""wedged: every rank stopped together, nobody missing; the hosts and the group, never a rank.

Two shapes of one event (analysis/wedge.py): every rank frozen with heartbeats stopped in
one instant (a scheduler's suspend, a hung filesystem every rank blocks on, a
node-wide driver wedge), or every live rank waiting in one collective past the
hang deadline with none missing from it (a fabric or transport wedge). A
policy may restart on it; it never counts against a rank or a host
(finding.BLAMELESS_KINDS: no per-host culprit count, no repeat history).
"""

from __future__ import annotations

from ...contracts.finding import Finding, group_name, ranks_phrase, seconds
from ..analysis.wedge import frozen_together
from ..config import DetectorConfig
from ..view.cluster import ClusterView
from .collective_hang import hang_state


class Wedged:
    name = "wedged"

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        fz = frozen_together(now, view, self.cfg)
        if fz is not None:
            where = _hosts(fz.hosts)
            return [
                Finding(
                    kind=self.name,
                    ranks=(),
                    hosts=fz.hosts,
                    reason=(
                        f"every rank of the job ({ranks_phrase(fz.ranks)} on {where}) froze together: heartbeats "
                        f"stopped within {seconds(fz.span_s)} of each other, stale for "
                        f"{seconds(now - fz.first)}, nobody missing or first: one cause outside the ranks "
                        "(a fabric, driver or filesystem wedge, a scheduler's suspend); no rank is blamed"
                    ),
                    onset_mono=fz.first,
                    detected_mono=now,
                    evidence={
                        "how": "frozen_together",
                        "ranks_total": len(fz.ranks),
                        "stopped_within_s": round(fz.span_s, 3),
                    },
                    wants_stacks=fz.ranks[:8],
                )
            ]
        st = hang_state(now, view, self.cfg)
        if st is None or st.age_s <= st.deadline_s:
            return []
        b = st.blame
        if b is None or b.culprits or b.how in ("unheard", "unproven"):
            return []  # someone is missing (collective_hang names them) or not known yet
        hosts = tuple(sorted({view.ranks[r].host for r in b.waiters}))
        coll = f"{b.op} #{b.seq} on {group_name(b.group)}"
        return [
            Finding(
                kind=self.name,
                ranks=(),
                hosts=hosts,
                reason=(
                    f"every live rank ({ranks_phrase(b.waiters)} on {_hosts(hosts)}) waiting in {coll} for "
                    f"{seconds(now - b.waiting_since)}, none missing from it: a fabric, transport or driver wedge "
                    "(or mismatched collectives no recording shows); no rank is blamed; stacks requested"
                ),
                onset_mono=st.onset,
                detected_mono=now,
                evidence={
                    "how": "one_collective",
                    "group": b.group,
                    "seq": b.seq,
                    "op": b.op,
                    "source": b.source,
                    "ranks_total": len(b.waiters),
                    "hang_s": round(st.age_s, 3),
                    "deadline_s": round(st.deadline_s, 3),
                },
                wants_stacks=b.waiters,
            )
        ]


def _hosts(hosts: tuple[str, ...]) -> str:
    return (
        f"host {hosts[0]}"
        if len(hosts) == 1
        else f"hosts {', '.join(hosts)}"
        if len(hosts) <= 4
        else f"{len(hosts):,} hosts"
    )
