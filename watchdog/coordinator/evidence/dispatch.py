"""Commands waiting for their host's agent, and what came back.

The coordinator never connects to an agent: a request waits here until that
host's next report, goes out signed in the reply, and is answered by acks in a
later report. Every attempt is a fresh envelope (new id, new signature), so the
agent's replay check never trips on our own re-sends; the first answer to any
attempt completes the request and later ones are ignored.

``decide`` is the pure part: send now, wait, or give up, from (now, state).
The agent acks "running" as soon as it accepts a command, so a re-send only
happens when a reply (or the agent) was lost, not while a dump is in progress.

Returns journal events instead of writing them; the service writes them outside
its lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from watchdog.contracts import commands
from watchdog.contracts.evidence import FlightRecorderDump, SlotEvidence, StackDump
from watchdog.contracts.journal import Record
from watchdog.contracts.journal.commands import (
    CommandDoneRecord,
    CommandExpiredRecord,
    CommandRecord,
    CommandRefusedRecord,
    CommandUnknownAckRecord,
    EvidenceRecord,
)

from . import triggers
from .plan import CommandRequest

Event = Record  # what the dispatch journals: commands sent, their answers, the ones given up on
SEND, WAIT, GIVE_UP = "send", "wait", "give_up"
MAX_UNKNOWN_ACK_EVENTS = 4  # per report; the rest are one line with their count


@dataclass(frozen=True)
class DispatchConfig:
    ttl_s: float = 30.0  # envelope lifetime (agent clock)
    give_up_s: float = 60.0  # from the request: no answer by then -> command_expired
    resend_intervals: float = 3.0  # re-send when not even a "running" ack came in this many report intervals
    resend_min_s: float = 2.0
    max_attempts: int = 3
    max_per_reply: int = 16
    keep_s: float = 600.0  # answered / expired requests remembered (late and duplicate acks)


@dataclass
class Pending:
    req: CommandRequest
    created: float
    ids: list[str] = field(default_factory=list)
    sent_at: float | None = None
    running: bool = False
    state: str = "pending"  # pending / done / expired
    ended: float = 0.0
    # req.trigger as this request's journal lines carry it (triggers.brief): a
    # finding that names every rank must not put them all in each host's lines.
    trigger: dict[str, Any] = field(default_factory=dict)


def decide(p: Pending, now: float, interval_s: float, cfg: DispatchConfig) -> str:
    if now - p.created >= cfg.give_up_s:
        return GIVE_UP
    if p.sent_at is None:
        return SEND
    if p.running or len(p.ids) >= cfg.max_attempts:
        return WAIT
    if now - p.sent_at >= max(cfg.resend_min_s, cfg.resend_intervals * interval_s):
        return SEND
    return WAIT


class Dispatch:
    def __init__(
        self, token: str, cfg: DispatchConfig = DispatchConfig(), new_id: Callable[[], str] = commands.new_id
    ) -> None:
        self._token, self.cfg, self._new_id = token, cfg, new_id
        self._lock = threading.Lock()
        # Oldest first, and by host: every report asks for its host's commands, and a
        # finding's evidence is a request to each of 2,048 hosts at 16,384 ranks;
        # scanning them all per report was hosts^2 a second.
        self._pending: dict[int, Pending] = {}  # id(p) -> p
        self._by_host: dict[str, dict[int, Pending]] = {}
        self._by_id: dict[str, Pending] = {}

    def request(self, reqs: list[CommandRequest], now: float) -> None:
        briefs: dict[int, dict[str, Any]] = {}  # a plan's requests share one trigger: brief it once
        with self._lock:
            for r in reqs:
                brief = briefs.get(id(r.trigger))
                if brief is None:
                    brief = briefs[id(r.trigger)] = triggers.brief(r.trigger)
                p = Pending(req=r, created=now, trigger=brief)
                self._pending[id(p)] = p
                self._by_host.setdefault(r.host, {})[id(p)] = p

    def pending(self) -> list[Pending]:
        with self._lock:
            return list(self._pending.values())

    def outgoing(
        self, job: str, host: str, agent_wall: float, interval_s: float, now: float
    ) -> tuple[list[dict], list[Event]]:
        """Signed commands for this host's reply. ``agent_wall``: the report's
        sent_wall, so the envelope's times are in the agent's own clock."""
        out: list[dict] = []
        events: list[Event] = []
        with self._lock:
            for p in list(self._by_host.get(host, {}).values()):
                if len(out) >= self.cfg.max_per_reply:
                    break
                if decide(p, now, interval_s, self.cfg) != SEND:
                    continue
                cmd = commands.sign(
                    commands.make(
                        job=job,
                        type=p.req.type,
                        host=host,
                        args=p.req.args if p.req.args is not None else {"ranks": list(p.req.targets)},
                        target=p.req.target,
                        issued_wall=agent_wall,
                        ttl_s=self.cfg.ttl_s,
                        id=self._new_id(),
                    ),
                    self._token,
                )
                p.ids.append(cmd["id"])
                p.sent_at = now
                self._by_id[cmd["id"]] = p
                out.append(cmd)
                events.append(
                    CommandRecord(
                        id=cmd["id"],
                        type=cmd["type"],
                        host=host,
                        ranks=p.req.ranks,
                        trigger=p.trigger,
                        attempt=len(p.ids),
                        signed=bool(cmd["sig"]),
                        expires_wall=cmd["expires_wall"],
                        **({"target": cmd["target"], "args": cmd["args"]} if p.req.target else {}),
                    )
                )
        return out, events

    def acked(self, host: str, acks: tuple[dict, ...] | list[dict], now: float) -> list[Event]:
        events: list[Event] = []
        unknown = 0
        with self._lock:
            for a in acks:
                cid = a.get("id")
                p = self._by_id.get(cid) if isinstance(cid, str) else None
                if p is None or p.req.host != host:
                    # Journaled one by one only up to a few per report: a report full of
                    # made-up ids must not become thousands of journal lines.
                    unknown += 1
                    if unknown <= MAX_UNKNOWN_ACK_EVENTS:
                        events.append(
                            CommandUnknownAckRecord(host=host, id=str(cid)[:80], type=str(a.get("type"))[:40])
                        )
                    continue
                if p.state == "done":
                    continue  # another attempt already answered
                if a.get("running") is True:
                    p.running = True
                    continue
                late = p.state == "expired"
                self._finish(p, "done", now)
                events.append(self._outcome(p, str(cid), host, a, late))
        if unknown > MAX_UNKNOWN_ACK_EVENTS:  # added field: how many more were left out of the journal
            events.append(CommandUnknownAckRecord(host=host, id="", type="", more=unknown - MAX_UNKNOWN_ACK_EVENTS))
        return events

    def _outcome(self, p: Pending, cid: str, host: str, a: dict, late: bool) -> Event:
        base: dict[str, Any] = {"command_id": cid, "type": p.req.type, "host": host, "trigger": p.trigger, "late": late}
        error = str(a.get("error") or "")[:2000]
        if isinstance(a.get("refused"), str) and a["refused"]:
            return CommandRefusedRecord(**base, reason=a["refused"][:40], error=error)
        ok = a.get("ok") is True
        if p.req.type not in commands.EVIDENCE:
            return CommandDoneRecord(**base, ok=ok, error=error)
        stacks, bad = _parse(a.get("stacks"), StackDump)
        slots, bad2 = _parse(a.get("slots"), SlotEvidence)
        fr, bad3 = _parse(a.get("flight_recorder"), FlightRecorderDump)
        if bad or bad2 or bad3:
            error = (error + "; " if error else "") + f"{bad + bad2 + bad3} malformed entries dropped"
        bound = _bound(a.get("bound"))
        return EvidenceRecord(
            **base, ok=ok, error=error, stacks=stacks, slots=slots, flight_recorder=fr or None, bound=bound or None
        )

    def _finish(self, p: Pending, state: str, now: float) -> None:
        p.state, p.ended = state, now
        if self._pending.pop(id(p), None) is not None:
            mine = self._by_host[p.req.host]
            del mine[id(p)]
            if not mine:
                del self._by_host[p.req.host]

    def expire(self, now: float, interval_of: Callable[[str], float]) -> list[Event]:
        """Give up on requests past ``give_up_s``; forget long-finished ones."""
        events: list[Event] = []
        with self._lock:
            for p in list(self._pending.values()):
                if decide(p, now, interval_of(p.req.host), self.cfg) == GIVE_UP:
                    self._finish(p, "expired", now)
                    events.append(
                        CommandExpiredRecord(
                            type=p.req.type,
                            host=p.req.host,
                            ids=p.ids,
                            ranks=p.req.ranks,
                            trigger=p.trigger,
                            acknowledged=p.running,
                            waited_s=round(now - p.created, 3),
                        )
                    )
            stale = [i for i, p in self._by_id.items() if p.state != "pending" and now - p.ended > self.cfg.keep_s]
            for i in stale:
                del self._by_id[i]
        return events


def _bound(raw: Any) -> dict[str, Any] | None:
    """The agent's dump bound (parallel, deadline, duration, late ranks), numbers
    only: it is journaled, so nothing else an agent sends gets through."""
    if not isinstance(raw, dict):
        return None
    out: dict[str, Any] = {}
    for key in ("parallel", "deadline_s", "duration_s"):
        v = raw.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) < 1e9:
            out[key] = v
    late = raw.get("late")
    if isinstance(late, list):
        out["late"] = [r for r in late[: commands.MAX_TARGETS] if isinstance(r, int) and not isinstance(r, bool)]
    return out or None


def _parse(raw: Any, cls: Any) -> tuple[list[dict], int]:
    """Entries the evidence reader will accept, through its own from_dict."""
    if not isinstance(raw, list):
        return [], 0
    out, bad = [], 0
    for item in raw:
        try:
            out.append(cls.from_dict(item).to_dict())
        except (TypeError, ValueError, AttributeError):
            bad += 1
    return out, bad
