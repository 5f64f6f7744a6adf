"""Evidence for the findings a tick opened: which commands to send (``plan``), at
most once a cooldown per finding, the context shared by findings opened close
together. A subsystem of the coordinator's tick (``subsystem.py``)."""

from __future__ import annotations

from ...contracts import commands
from ...contracts.finding import Finding
from ..config import Config
from ..detectors import tracker
from ..journal import event_names as je
from ..subsystem import Out, Tick
from ..view.cluster import ClusterView
from . import plan as evidence_plan
from . import stack_plan, triggers
from .dispatch import Dispatch
from .plan import CommandRequest
from .stack_gather import StackGather

COLLECT_COOLDOWN_S = 60.0  # a finding that flaps open/resolved is not dumped every time
# Findings opened within this long of one whose evidence included the context
# (every rank's stacks, the others' snapshots) share it and ask only for their
# own culprits' (evidence_plan). Long enough for one event seen host by host
# (agents slowed to 10 s by back-pressure), short enough that an unrelated
# fault later gets a context of its own.
CONTEXT_SHARED_S = 15.0


def expect_stacks(stacks: StackGather, reqs: list[CommandRequest], now: float) -> None:
    """Stacks asked for (a hang's evidence, an abort's first step): their groups
    are journaled once every host asked has answered (``stack_gather``)."""
    by_trigger: dict[str, tuple[dict, dict[str, list[int]]]] = {}
    keys: dict[int, str] = {}  # a plan's requests share one trigger: its key made once, not per host
    for r in reqs:
        if r.type == commands.DUMP_STACKS:
            key = keys.get(id(r.trigger))
            if key is None:
                key = keys[id(r.trigger)] = triggers.key(r.trigger)
            by_trigger.setdefault(key, (r.trigger, {}))[1].setdefault(r.host, []).extend(r.ranks)
    for trigger, hosts in by_trigger.values():
        stacks.expect(trigger, hosts, now)


class Collector:
    def __init__(self, cfg: Config, dispatch: Dispatch, stacks: StackGather, out: Out) -> None:
        self.cfg = cfg
        self.dispatch = dispatch
        self.stacks = stacks
        self.out = out
        # Unsigned commands only where agents accept them: both sides without a token, on loopback.
        self._commands_ok = bool(cfg.token) or commands.is_loopback(cfg.listen[0])
        self._collected: dict[tracker.Key, float] = {}  # finding key -> when evidence was last requested
        self._context_at: dict[str, float] = {}  # part of the context -> when last asked for (collect)
        self._no_evidence_logged = False

    def on_tick(self, tick: Tick) -> None:
        self.collect(list(tick.faults), tick.view, tick.now)

    def collect(self, opened: list[Finding], view: ClusterView, now: float) -> None:
        if not self.cfg.evidence:
            return
        self._collected = {k: t for k, t in self._collected.items() if now - t < COLLECT_COOLDOWN_S}
        for f in opened:
            if (not f.ranks and not f.wants_stacks) or f.key in self._collected:
                continue
            if not self._commands_ok:
                if not self._no_evidence_logged:
                    self._no_evidence_logged = True
                    self.out.log.warning(
                        "evidence_disabled",
                        reason="no job token and not listening on loopback: agents would refuse unsigned commands",
                    )
                return
            cap = self.cfg.stacks_max_per_host
            shared = frozenset(p for p, at in self._context_at.items() if now - at < CONTEXT_SHARED_S)
            context = evidence_plan.CONTEXT - shared
            reqs, left = evidence_plan.plan_capped(f, view, max_stacks_per_host=cap, context=context)
            if left:
                rec = stack_plan.capped_record(f, left, cap)
                self.out.log.warning(je.STACKS_CAPPED, **rec.payload())
                self.out.record(rec)
            if reqs:
                self._collected[f.key] = now
                for part in evidence_plan.context_of(f.kind) & context:
                    self._context_at[part] = now
                expect_stacks(self.stacks, reqs, now)
                self.dispatch.request(reqs, now)
                # Hosts and ranks per type: the per-host requests are journaled as they go out (``command``).
                self.out.log.info(
                    "evidence_requested",
                    kind=f.kind,
                    ranks=list(f.ranks),
                    requests=evidence_plan.brief(reqs),
                    context_shared=sorted(shared & evidence_plan.context_of(f.kind)),
                )
