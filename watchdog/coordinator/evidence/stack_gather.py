"""Every rank's stack for one trigger, gathered across hosts into one small
``stack_groups`` journal record.

The finding is journaled (fsync'd) before any evidence exists, and a journaled
finding is never rewritten. So the grouped answer is its own record, written
once every host asked for stacks has answered, refused, or been given up on
(``command_expired``), or at the latest ``wait_s`` after the request::

    {"event": "stack_groups", "trigger": {"kind": "collective_hang", "ranks": [2]},
     "asked": 16384, "hosts_asked": 2048, "hosts_answered": 2048, "hosts_missing": [],
     "late_ranks": 0, "ranks": 16384, "groups": [Group.to_dict(), ...],
     "summary": "odd ones out: rank 2 in ...; rank 9000 in ... (the other 16382 in ...)",
     "odd_ones_out": [[[2, 2]], [[9000, 9000]]], "dropped_groups": 0, "dropped_ranks": 0}

Groups, not copies: 16,384 identical stacks are one group with a range list.
The record is what ``watchdog timeline`` shows with the root cause, and its
``summary`` is logged as a warning next to the finding for whoever tails logs.

Memory: stack texts are not kept; each rank is reduced to its signature on
arrival (signatures are shared, so 16,384 ranks in 3 places hold 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from watchdog import stackgroups
from watchdog.contracts import commands
from watchdog.contracts.journal.commands import StackGroupsRecord

from ..journal import event_names as je
from . import triggers

WAIT_S = 90.0  # past the dispatch's give-up (60 s): a host that never answers has been given up on by then


@dataclass
class _Pending:
    trigger: dict[str, Any]
    culprits: tuple[int, ...]
    hosts: set[str]
    asked: int
    created: float
    answered: set[str] = field(default_factory=set)
    missing: set[str] = field(default_factory=set)
    late: set[int] = field(default_factory=set)
    by_rank: dict[int, tuple] = field(default_factory=dict)  # rank -> signature key


class StackGather:
    def __init__(self, wait_s: float = WAIT_S) -> None:
        self.wait_s = wait_s
        self._pending: dict[str, _Pending] = {}
        self._keys: dict[tuple, tuple] = {}  # interned signatures

    def expect(self, trigger: dict[str, Any], ranks_by_host: dict[str, list[int]], now: float) -> None:
        """Stacks were asked for: ``ranks_by_host`` says from whom."""
        if not ranks_by_host:
            return
        culprits = tuple(r for r in trigger.get("ranks") or () if isinstance(r, int))
        self._pending[_key(trigger)] = _Pending(
            trigger=trigger,
            culprits=culprits,
            hosts=set(ranks_by_host),
            asked=sum(len(v) for v in ranks_by_host.values()),
            created=now,
        )

    def note(self, name: str, payload: dict[str, Any]) -> None:
        """A dispatch event: ``evidence`` of type dump_stacks, or its refusal/expiry."""
        if payload.get("type") != commands.DUMP_STACKS or not isinstance(payload.get("trigger"), dict):
            return
        p = self._pending.get(_key(payload["trigger"]))
        host = payload.get("host")
        if p is None or host not in p.hosts:
            return
        if name == je.EVIDENCE:
            p.answered.add(host)
            for s in payload.get("stacks") or ():
                self._add(p, s)
            bound = payload.get("bound") or {}
            p.late.update(r for r in bound.get("late") or () if isinstance(r, int))
        elif name in (je.COMMAND_REFUSED, je.COMMAND_EXPIRED):
            p.missing.add(host)

    def _add(self, p: _Pending, s: dict[str, Any]) -> None:
        rank = s.get("rank") if isinstance(s, dict) else None
        if not isinstance(rank, int) or isinstance(rank, bool):
            return
        key = stackgroups.signature(bool(s.get("ok")), str(s.get("text") or ""), str(s.get("error") or ""))
        if rank in p.by_rank and (p.by_rank[rank][0] or not key[0]):
            return  # keep the first good dump of a rank
        p.by_rank[rank] = self._keys.setdefault(key, key)

    def due(self, now: float) -> list[StackGroupsRecord]:
        """``stack_groups`` records for the triggers that are complete (or waited long enough)."""
        out = []
        for k, p in list(self._pending.items()):
            if p.answered | p.missing >= p.hosts or now - p.created >= self.wait_s:
                del self._pending[k]
                out.append(self._record(p))
        if not self._pending:
            self._keys.clear()
        return out

    @staticmethod
    def _record(p: _Pending) -> StackGroupsRecord:
        members: dict[tuple, list[int]] = {}
        for rank, key in p.by_rank.items():
            members.setdefault(key, []).append(rank)
        g = stackgroups.from_members(members, p.culprits)
        unanswered = sorted(p.hosts - p.answered)
        return StackGroupsRecord(
            trigger=p.trigger,
            asked=p.asked,
            hosts_asked=len(p.hosts),
            hosts_answered=len(p.answered),
            hosts_missing=unanswered[:64],
            late_ranks=len(p.late),
            **g.to_dict(),
        )


def _key(trigger: dict[str, Any]) -> str:
    """The same for the full trigger (``expect``) and the brief one its answers carry."""
    return triggers.key(trigger)
