"""The coordinator's last known view of each rank, rebuilt from the journal.

Used for lanes without slot evidence (an older journal, or collection failed),
and for whether a process was alive, which a slot cannot say. The journal only
holds state changes and findings, so this is coarser than a slot: where a rank
was comes from the findings' own evidence (the hang's culprits and waiters, the
dead or frozen rank's last step).
"""

from __future__ import annotations

from typing import Any

from watchdog.contracts.journal import names as je

from .model import Lane, RankNow


def never_registered() -> RankNow:
    return RankNow(t=None, source="coordinator", where="never registered (no slot seen by any agent)", activity="init")


class KnownView:
    def __init__(self) -> None:
        self._r: dict[int, dict[str, Any]] = {}

    def ranks(self) -> list[int]:
        return sorted(self._r)

    def alive(self, rank: int) -> bool | None:
        return self._r.get(rank, {}).get("alive")

    def gone_seen(self, rank: int) -> float | None:
        """When the coordinator journaled the process gone (wall), if it did."""
        t = self._r.get(rank, {}).get("gone_t")
        return float(t) if isinstance(t, (int, float)) else None

    def _get(self, rank: Any) -> dict[str, Any] | None:
        try:
            return self._r.setdefault(int(rank), {})
        except (TypeError, ValueError):
            return None

    def add(self, rec: dict) -> None:
        ev, t = rec["event"], rec.get("t_wall")
        if ev in (je.RANK_JOINED, je.RANK_RESTARTED):
            d = self._get(rec.get("rank"))
            if d is not None:
                d.clear()  # a restarted rank starts over
                d.update(
                    t=t,
                    host=rec.get("host", ""),
                    pid=rec.get("pid", 0),
                    alive=True,
                    status=rec.get("status", ""),
                    pg_state=rec.get("pg_state", ""),
                )
        elif ev == je.STATE:
            d = self._get(rec.get("rank"))
            if d is not None:
                d.update(t=t, step=rec.get("step", d.get("step")))
                for name, change in (rec.get("changed") or {}).items():
                    if isinstance(change, list) and len(change) == 2:
                        d[name] = change[1]
                        if name == "alive" and change[1] is False:
                            d["gone_t"] = t
        elif ev == je.FINDING:
            self._finding(rec, t)

    def _finding(self, rec: dict, t: Any) -> None:
        kind, ev = rec.get("kind"), rec.get("evidence") or {}
        for r, c in (ev.get("culprits") or {}).items():  # collective_hang
            d = self._get(r)
            if d is None or not isinstance(c, dict):
                continue
            d.update(
                t=t,
                host=c.get("host", d.get("host", "")),
                pid=c.get("pid", d.get("pid", 0)),
                step=c.get("step"),
                phase=c.get("phase", ""),
                coll_seq=c.get("coll_seq"),
                coll_outstanding=c.get("coll_outstanding", 0),
                heartbeat_age_s=c.get("heartbeat_age_s"),
            )
            if c.get("in_data_wait"):
                d["where"] = f"in the data loader at step {c.get('step')}"
            elif c.get("coll_outstanding"):
                d["where"] = f"in collective #{c.get('coll_seq')} at step {c.get('step')}"
            else:
                place = "in training code" if c.get("phase") in ("train", "", None) else f"in {c.get('phase')}"
                d["where"] = (
                    f"{place}, outside collectives and data loading, at step {c.get('step')} "
                    f"(last collective #{c.get('coll_seq')})"
                )
            if c.get("health") not in (None, "ok"):
                d["where"] = f"{c['health']}; {d['where']}"
        for r in ev.get("waiters") or ():
            d = self._get(r)
            if d is not None and ev.get("seq") is not None:
                d.update(
                    t=t,
                    coll_seq=ev.get("seq"),
                    coll_outstanding=1,
                    where=f"waiting in {ev.get('op', 'a collective')} #{ev.get('seq')}",
                )
        if kind in ("dead_rank", "frozen_rank"):
            for r in rec.get("ranks") or ():
                d = self._get(r)
                if d is None:
                    continue
                d.update(t=t, step=ev.get("step", d.get("step")), phase=ev.get("phase", d.get("phase", "")))
                if kind == "dead_rank":
                    d["alive"] = False
                    d.setdefault("gone_t", t)
                    d["where"] = f"process gone, last at step {d.get('step')}"
                else:
                    d["where"] = (
                        f"frozen (heartbeat stale {ev.get('heartbeat_age_s')} s, "
                        f"{ev.get('proc_status') or 'state unknown'}) at step {d.get('step')}"
                    )

    def lane(self, rank: int) -> Lane:
        d = self._r.get(rank, {})
        alive = d.get("alive")
        # The journal holds state changes only: say what it holds, and no more.
        step = f", at step {d['step']} when last journaled" if d.get("step") is not None else ""
        where = d.get("where") or (
            f"no slot snapshot; {'alive' if alive else 'process gone' if alive is False else 'state unknown'}, "
            f"status {d.get('status') or '?'}, process group {d.get('pg_state') or '?'}{step}"
        )
        now = RankNow(
            t=d.get("t"),
            source="coordinator",
            step=d.get("step"),
            phase=d.get("phase", ""),
            where=where,
            activity="gone" if alive is False else "",
            coll_seq=d.get("coll_seq"),
            coll_outstanding=int(d.get("coll_outstanding") or 0),
            heartbeat_age_s=d.get("heartbeat_age_s"),
            alive=alive,
            status=str(d.get("status", "")),
        )
        return Lane(rank=rank, host=str(d.get("host", "")), pid=int(d.get("pid") or 0), now=now)
