"""What became of the commands sent: each dispatch event journaled, logged and
counted, commands past their time expired, every rank's stack groups journaled
once all hosts asked have answered. A subsystem of the coordinator's tick
(``subsystem.py``); ``events`` also takes what a report's acks settled."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...contracts import commands
from ...contracts.journal import Record
from ..journal import event_names as je
from ..metrics import CoordinatorMetrics
from ..subsystem import Out, Tick
from .dispatch import Dispatch
from .stack_gather import StackGather


class CommandLog:
    def __init__(
        self,
        dispatch: Dispatch,
        stacks: StackGather,
        metrics: CoordinatorMetrics,
        out: Out,
        note: Callable[[str, dict[str, Any]], None],
        stack_groups: Callable[[dict[str, Any], dict[str, Any]], None],
    ) -> None:
        """``note``: each event, for the action in flight; ``stack_groups``: each
        stack-groups record with its trigger, for the failure's fingerprint."""
        self.dispatch = dispatch
        self.stacks = stacks
        self.metrics = metrics
        self.out = out
        self._note = note
        self._stack_groups = stack_groups
        self.stack_summary: dict[tuple[str, tuple[int, ...]], str] = {}  # finding key -> its stack groups in a line

    def on_tick(self, tick: Tick) -> None:
        view = tick.view
        self.events(self.dispatch.expire(tick.now, lambda h: view.hosts[h].interval_s if h in view.hosts else 1.0))
        self.groups(tick.now)

    def groups(self, now: float) -> None:
        for rec in self.stacks.due(now):
            trig = rec.trigger or {}
            self.out.log.warning(
                je.STACK_GROUPS, trigger=trig, ranks=rec.ranks, groups=len(rec.groups or ()), summary=rec.summary
            )
            self.out.record(rec)
            ranks = tuple(r for r in trig.get("ranks") or () if isinstance(r, int))
            self.stack_summary[(str(trig.get("kind")), ranks)] = rec.summary or ""
            self._stack_groups(trig, rec.payload())
            while len(self.stack_summary) > 64:  # findings are few; a flapping job must not grow this
                del self.stack_summary[next(iter(self.stack_summary))]

    def events(self, events: list[Record]) -> None:
        """Journal, log and count what the dispatch reported."""
        for rec in events:
            name, payload = rec.event, rec.payload()
            self._note(name, payload)
            self.stacks.note(name, payload)
            kind = payload.get("type", "")
            outcome = {je.COMMAND: "sent", je.COMMAND_REFUSED: "refused", je.COMMAND_EXPIRED: "expired"}.get(name)
            if name in (je.EVIDENCE, je.COMMAND_DONE):
                outcome = "done" if payload.get("ok") else "failed"
            if outcome and kind in commands.TYPES:
                self.metrics.commands.labels(kind, outcome).inc()
            brief = {k: v for k, v in payload.items() if k not in ("stacks", "slots", "flight_recorder")}
            if name == je.EVIDENCE:
                brief.update(
                    stacks=[s["rank"] for s in payload["stacks"] if s.get("ok")],
                    slots=[s["rank"] for s in payload["slots"]],
                )
                if payload.get("flight_recorder"):
                    brief["flight_recorder"] = [d["rank"] for d in payload["flight_recorder"] if d.get("ok")]
            (
                self.out.log.warning
                if name in (je.COMMAND_REFUSED, je.COMMAND_EXPIRED, je.COMMAND_UNKNOWN_ACK)
                else self.out.log.info
            )(name, **brief)
            self.out.record(rec)
