"""never_joined: expected ranks that did not register, or did not finish
process-group init, by ``join_deadline_s`` after the first rank registered.

Ranks that never reported, or reported but never called init_process_group
(pg_state "none"), are the culprits: the others sit inside init_process_group
waiting for them, so naming those would blame the victims. Only when nobody is
missing or un-called and ranks are still inside init (a wrong MASTER_ADDR, an
unreachable store) are those named. A rank's own deadline runs from when it
registered, so a restarted rank gets a fresh one. Dead ranks are dead_rank's; a
rank that steps or runs collectives has joined whatever its pg_state says.
"""

from __future__ import annotations

from ...contracts.finding import Finding, ranks_phrase, seconds
from ..analysis.health import NOT_LIVE, classify_all
from ..config import DetectorConfig
from ..view import columns
from ..view.cluster import ClusterView, FoldedRank

EVIDENCE_MAX = 64  # rank lists in evidence; the reason's ranges name them all


def _overdue(view: ClusterView, now: float, limit: float, health: dict[int, str]) -> list[FoldedRank]:
    """Ranks past their own deadline that have not stepped nor run a collective, and
    are not dead, lost or exited. A rank that steps or runs collectives has joined,
    whatever its pg_state says (a hook that could not patch init_process_group never
    updates it). Read from the view's columns, the rarest condition first: nearly
    every rank steps, and this runs every tick."""
    c = columns.of(view)
    if 0 not in c.step:
        return []
    return [
        view.ranks[r]
        for r, step, seq, registered in zip(c.rank, c.step, c.coll_seq, c.registered_at)
        if step == 0 and seq == 0 and health[r] not in NOT_LIVE and now - registered > limit
    ]


class NeverJoined:
    name = "never_joined"

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        first = view.first_registered_at()
        if first is None or view.world_size <= 1:
            return []  # a single process needs no process group
        # A coordinator that is behind has not yet read the reports queued for it
        # (intake/backpressure.py): a host whose first report waits there is not missing.
        limit = self.cfg.join_deadline_s + view.behind_s
        health = classify_all(view, now, self.cfg)
        overdue = _overdue(view, now, limit, health)
        c = columns.of(view)  # (the same columns _overdue read: built once per view)
        missing = [r for r in range(view.world_size) if r not in view.ranks] if now - first > limit else []
        uncalled = [rv for rv in overdue if rv.state.pg_state == "none"]
        inside = [rv for rv in overdue if rv.state.pg_state == "initializing"]
        if missing or uncalled:
            culprits = sorted(missing + [rv.rank for rv in uncalled])
            parts = []
            if missing:
                has = "has" if len(missing) == 1 else "have"
                parts.append(f"{ranks_phrase(missing)} {has} not registered (no agent reported them; host unknown)")
            if uncalled:
                uncalled_hosts = sorted({rv.host for rv in uncalled})
                has = "has" if len(uncalled) == 1 else "have"
                parts.append(
                    f"{ranks_phrase([rv.rank for rv in uncalled])} on host {', '.join(uncalled_hosts)} {has} not called init_process_group"
                )
            waiting = [rv.rank for rv in inside]
            tail = f"; {ranks_phrase(waiting)} waiting in rendezvous" if waiting else ""
            hosts = tuple(sorted({rv.host for rv in uncalled}))
        elif inside and not any(pg == "none" and health[r] not in NOT_LIVE for r, pg in zip(c.rank, c.pg_state)):
            # Blame the ranks inside rendezvous only when nobody is yet to call
            # init: a rank that registered a moment later than the others has a
            # later deadline of its own, and is still the likelier culprit.
            culprits = sorted(rv.rank for rv in inside)
            hosts = tuple(sorted({rv.host for rv in inside}))
            parts = [
                f"{ranks_phrase(culprits)} stuck inside init_process_group (rendezvous) with every rank registered: "
                "check MASTER_ADDR/MASTER_PORT and the store"
            ]
            tail = ""
        else:
            return []
        return [
            Finding(
                kind=self.name,
                ranks=tuple(culprits),
                hosts=hosts,
                onset_mono=first + limit,
                detected_mono=now,
                reason=f"{'; '.join(parts)} {seconds(now - first)} after the first rank registered (deadline {seconds(limit)}){tail}",
                evidence={
                    "world_size": view.world_size,
                    "registered": len(view.ranks),
                    "missing": missing[:EVIDENCE_MAX],
                    "missing_count": len(missing),
                    "not_initialized": [rv.rank for rv in uncalled],
                    "in_rendezvous": [rv.rank for rv in inside],
                },
            )
        ]
