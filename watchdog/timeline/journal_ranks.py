"""The coordinator's last known view of each rank, rebuilt from the journal.

Used for lanes without slot evidence (an older journal, or collection failed),
and for whether a process was alive, which a slot cannot say. The journal only
holds state changes and findings, so this is coarser than a slot: where a rank
was comes from the findings' own evidence (the hang's culprits and waiters, the
dead or frozen rank's last step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from watchdog.contracts.journal.findings import FindingRecord
from watchdog.contracts.journal.ranks import RankJoinedRecord, RankRestartedRecord, StateRecord
from watchdog.contracts.journal.record import Record

from .model import Lane, RankNow


@dataclass
class _Known:
    """What the journal said about one rank, last first."""

    t: float | None = None
    host: str = ""
    pid: int = 0
    alive: bool | None = None
    status: str = ""
    pg_state: str = ""
    step: Any = None  # as journaled (a finding's evidence may hold anything)
    phase: str = ""
    coll_seq: Any = None
    coll_outstanding: Any = 0
    heartbeat_age_s: Any = None
    where: str = ""
    gone_t: float | None = None  # when the coordinator journaled the process gone (wall)


def never_registered() -> RankNow:
    return RankNow(t=None, source="coordinator", where="never registered (no slot seen by any agent)", activity="init")


class KnownView:
    def __init__(self) -> None:
        self._r: dict[int, _Known] = {}

    def ranks(self) -> list[int]:
        return sorted(self._r)

    def alive(self, rank: int) -> bool | None:
        k = self._r.get(rank)
        return k.alive if k is not None else None

    def gone_seen(self, rank: int) -> float | None:
        """When the coordinator journaled the process gone (wall), if it did."""
        k = self._r.get(rank)
        return float(k.gone_t) if k is not None and isinstance(k.gone_t, (int, float)) else None

    def _get(self, rank: Any) -> _Known | None:
        try:
            return self._r.setdefault(int(rank), _Known())
        except (TypeError, ValueError):
            return None

    def add(self, rec: Record) -> None:
        t = rec.t_wall
        if isinstance(rec, (RankJoinedRecord, RankRestartedRecord)):
            if rec.rank is not None:  # a restarted rank starts over
                status = rec.status if isinstance(rec, RankJoinedRecord) else None
                pg_state = rec.pg_state if isinstance(rec, RankJoinedRecord) else None
                self._r[rec.rank] = _Known(
                    t=t, host=rec.host or "", pid=rec.pid or 0, alive=True, status=status or "", pg_state=pg_state or ""
                )
        elif isinstance(rec, StateRecord):
            k = self._get(rec.rank)
            if k is not None:
                k.t = t
                if rec.step is not None:
                    k.step = rec.step
                for name, change in (rec.changed or {}).items():
                    if isinstance(change, list) and len(change) == 2:
                        if name == "alive":
                            k.alive = change[1]
                            if change[1] is False:
                                k.gone_t = t
                        elif name in ("status", "pg_state"):
                            setattr(k, name, change[1])
        elif type(rec) is FindingRecord:  # not an expected one: an action's effect says nothing of the rank
            self._finding(rec, t)

    def _finding(self, rec: FindingRecord, t: float | None) -> None:
        kind, ev = rec.kind, rec.evidence
        for r, c in (ev.get("culprits") or {}).items():  # collective_hang
            k = self._get(r)
            if k is None or not isinstance(c, dict):
                continue
            k.t, k.host, k.pid = t, c.get("host", k.host), c.get("pid", k.pid)
            k.step, k.phase = c.get("step"), c.get("phase", "")
            k.coll_seq, k.coll_outstanding = c.get("coll_seq"), c.get("coll_outstanding", 0)
            k.heartbeat_age_s = c.get("heartbeat_age_s")
            if c.get("in_data_wait"):
                k.where = f"in the data loader at step {c.get('step')}"
            elif c.get("coll_outstanding"):
                k.where = f"in collective #{c.get('coll_seq')} at step {c.get('step')}"
            else:
                place = "in training code" if c.get("phase") in ("train", "", None) else f"in {c.get('phase')}"
                k.where = (
                    f"{place}, outside collectives and data loading, at step {c.get('step')} "
                    f"(last collective #{c.get('coll_seq')})"
                )
            if c.get("health") not in (None, "ok"):
                k.where = f"{c['health']}; {k.where}"
        for r in ev.get("waiters") or ():
            k = self._get(r)
            if k is not None and ev.get("seq") is not None:
                k.t, k.coll_seq, k.coll_outstanding = t, ev.get("seq"), 1
                k.where = f"waiting in {ev.get('op', 'a collective')} #{ev.get('seq')}"
        if kind in ("dead_rank", "frozen_rank"):
            for r in rec.ranks:
                k = self._get(r)
                if k is None:
                    continue
                k.t, k.step, k.phase = t, ev.get("step", k.step), ev.get("phase", k.phase)
                if kind == "dead_rank":
                    k.alive = False
                    if k.gone_t is None:
                        k.gone_t = t
                    k.where = f"process gone, last at step {k.step}"
                else:
                    k.where = (
                        f"frozen (heartbeat stale {ev.get('heartbeat_age_s')} s, "
                        f"{ev.get('proc_status') or 'state unknown'}) at step {k.step}"
                    )

    def lane(self, rank: int) -> Lane:
        k = self._r.get(rank) or _Known()
        alive = k.alive
        # The journal holds state changes only: say what it holds, and no more.
        step = f", at step {k.step} when last journaled" if k.step is not None else ""
        where = k.where or (
            f"no slot snapshot; {'alive' if alive else 'process gone' if alive is False else 'state unknown'}, "
            f"status {k.status or '?'}, process group {k.pg_state or '?'}{step}"
        )
        now = RankNow(
            t=k.t,
            source="coordinator",
            step=k.step,
            phase=k.phase,
            where=where,
            activity="gone" if alive is False else "",
            coll_seq=k.coll_seq,
            coll_outstanding=int(k.coll_outstanding or 0),
            heartbeat_age_s=k.heartbeat_age_s,
            alive=alive,
            status=str(k.status),
        )
        return Lane(rank=rank, host=str(k.host), pid=int(k.pid or 0), now=now)
