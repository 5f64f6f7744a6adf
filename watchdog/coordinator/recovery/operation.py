"""What every action shares: the operation in flight and the signals it sends."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from watchdog.contracts import commands
from watchdog.contracts.journal.record import Record

from ...contracts.finding import Finding
from ..evidence.plan import CommandRequest
from ..view.cluster import ClusterView

Event = Record  # what an action journals (contracts/journal/actions.py)
Ident = tuple[int, int, str]  # (pid, start us, host)


@dataclass(frozen=True)
class Operation:
    id: str  # "a-<n>": in every command trigger and journal line of this action
    action: str  # a policy action
    reason: str
    finding: Finding
    started: float  # coordinator monotonic
    grace_s: float  # SIGTERM -> SIGKILL
    restart_n: int = 0  # for restarts: which one (1-based, per coordinator)
    phase: str = "start"
    phase_at: float = 0.0
    last_sent: float = -1e18
    kills: int = 0  # SIGKILL rounds sent
    # The processes this action is about, fixed at start: a rank that registers
    # later is a new incarnation and must never be hit by this action's signals.
    workers: tuple[tuple[int, Ident], ...] = ()  # (rank, (pid, start, host))
    launchers: tuple[Ident, ...] = ()
    hosts_answered: frozenset[str] = frozenset()
    hosts_asked: frozenset[str] = frozenset()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def at(self, phase: str, now: float, **kw: Any) -> Operation:
        return replace(self, phase=phase, phase_at=now, **kw)

    def trigger(self) -> dict[str, Any]:
        return {"kind": self.finding.kind, "ranks": list(self.finding.ranks), "action": self.id}


@dataclass(frozen=True)
class ActionStep:
    op: Operation
    requests: tuple[CommandRequest, ...] = ()
    events: tuple[Event, ...] = ()
    done: bool = False
    ok: bool = True
    state_event: str = ""  # a JobState transition event to apply ("aborted", "resumed", ...)


def old_workers(view: ClusterView, f: Finding, hosts: frozenset[str] | None = None) -> tuple[tuple[int, Ident], ...]:
    """The incarnations that existed when the finding was raised (a rank that
    registered after it was restarted already, by torchrun itself)."""
    out = []
    for rank, rv in sorted(view.ranks.items()):
        if rv.registered_at <= f.detected_mono and (hosts is None or rv.host in hosts):
            out.append((rank, (rv.state.pid, rv.state.proc_start_us, rv.host)))
    return tuple(out)


def launchers_of(view: ClusterView, workers: tuple[tuple[int, Ident], ...]) -> tuple[Ident, ...]:
    seen: dict[tuple[int, str], Ident] = {}
    for rank, (_, _, host) in workers:
        s = view.ranks[rank].state
        if s.launcher_pid > 1:
            seen.setdefault((s.launcher_pid, host), (s.launcher_pid, s.launcher_start_us, host))
    return tuple(sorted(seen.values(), key=lambda x: (x[2], x[0])))


def live(view: ClusterView, rank: int, ident: Ident) -> bool:
    """Is this incarnation still there? A replaced incarnation is gone."""
    rv = view.ranks.get(rank)
    if rv is None or (rv.state.pid, rv.state.proc_start_us) != ident[:2]:
        return False
    return rv.state.alive and rv.state.status != "exited"


def live_workers(op: Operation, view: ClusterView) -> list[tuple[int, Ident]]:
    return [(r, i) for r, i in op.workers if live(view, r, i)]


def signals(
    op: Operation, name: str, workers: list[tuple[int, Ident]], launchers: tuple[Ident, ...] = ()
) -> tuple[CommandRequest, ...]:
    """One signal command per process; launchers first (one that sees its workers
    die before its own signal would restart them)."""
    reqs = [
        CommandRequest(
            host=h,
            type=commands.SIGNAL,
            targets=(commands.target(-1, pid, start),),
            trigger=op.trigger(),
            target=commands.target(-1, pid, start),
            args={"signal": name},
        )
        for pid, start, h in launchers
    ]
    reqs += [
        CommandRequest(
            host=h,
            type=commands.SIGNAL,
            targets=(commands.target(r, pid, start),),
            trigger=op.trigger(),
            target=commands.target(r, pid, start),
            args={"signal": name},
        )
        for r, (pid, start, h) in workers
    ]
    return tuple(reqs)


def idents(op: Operation) -> list[list[Any]]:
    """The processes an action is about, as journaled in its first signals' record:
    [rank, pid, start us, host] per worker, [-1, pid, start us, host] per launcher.
    A coordinator restarted mid-action rebuilds the action from them (control/replay.py)
    and never signals anything else."""
    return [[r, pid, start, host] for r, (pid, start, host) in op.workers] + [
        [-1, pid, start, host] for pid, start, host in op.launchers
    ]


def brief(op: Operation, **kw: Any) -> dict[str, Any]:
    """The fields every record of an action starts with (``kw`` overrides one in place)."""
    return {"action_id": op.id, "action": op.action, "kind": op.finding.kind, "ranks": list(op.finding.ranks), **kw}
