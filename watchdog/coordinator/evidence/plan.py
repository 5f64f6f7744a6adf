"""Which evidence to ask the agents for when a finding opens. Pure.

- Slot snapshots of the ranks a finding concerns and of the others (up to
  MAX_SNAPSHOTS), so a timeline has every lane. A dead rank's slot file is still
  on disk and its agent reads it, so ``dead_rank`` gets snapshots too.
- Python stacks of the ranks the detector wants confirmed (``wants_stacks``),
  at most ``max_dumps`` per finding (a dump pauses a rank); for a hang or a
  frozen rank, every live rank's (``stack_plan``): the culprit's stack says
  where it is stuck, the others' what they are blocked in. Only live
  processes: a dead rank has no stack.

- The Flight Recorder buffers of every live rank for a hang or a mismatched
  collective (``FR_KINDS``): each rank's hook dumps its own, so the per-rank
  files PyTorch's analyzer reads can be written from the journal, and our
  verdict and PyTorch's compared on the same fault (``watchdog timeline --fr-dump``).

One request per (host, type): an agent answers for its own ranks.

The context (the other ranks' snapshots, every rank's stacks and Flight
Recorder buffers) is the job's, not the finding's: findings
opened together share it (``context``: the parts that no finding opened just
before asked for; ``collect.Collector``). A whole job stopped at once
(a Slurm suspend, a shared filesystem hung) opened a frozen_rank finding per
rank: with a context each, 96 ranks asked every rank's stack 96 times (3,140
commands, 97 stack records), and at 16,384 ranks it would be ~10^8 commands
and tens of GB of snapshots. Shared, each finding adds its culprits' snapshot
and stack (and ranks that froze together are now one finding: 49 commands).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import Any

from watchdog.contracts import commands

from ...contracts.finding import Finding
from ..view import columns
from ..view.cluster import ClusterView
from . import stack_plan

MAX_DUMPS = 8
FR_KINDS = frozenset({"collective_hang", "frozen_rank", "collective_mismatch", "wedged"})
MAX_SNAPSHOTS = 64  # ~40 KB of journal per rank snapshot; a 1000-rank job keeps the culprits + 63 others
# The parts of the context, by the command that asks for each: the other ranks'
# snapshots, every live rank's stack, every rank's Flight Recorder.
CONTEXT = frozenset({commands.SNAPSHOT_SLOTS, commands.DUMP_STACKS, commands.DUMP_FLIGHT_RECORDER})


@dataclass(frozen=True)
class CommandRequest:
    """A command the coordinator wants one host's agent to run (evidence or an
    action's signal); ``dispatch`` sends it in a report reply and tracks the answer."""

    host: str
    type: str  # commands.DUMP_STACKS / SNAPSHOT_SLOTS
    targets: tuple[dict[str, int], ...]  # commands.target(), sorted by rank
    trigger: dict[str, Any]  # {"kind", "ranks"}: the finding, as evidence.py records it
    # For ``signal`` (actions): the envelope's target and args; evidence types
    # carry their targets in args["ranks"].
    target: dict[str, int] | None = None
    args: dict[str, Any] | None = None

    @property
    def ranks(self) -> list[int]:
        return [t["rank"] for t in self.targets]


def trigger(f: Finding) -> dict[str, Any]:
    return {"kind": f.kind, "ranks": list(f.ranks)}


def stack_ranks(f: Finding, view: ClusterView, max_dumps: int = MAX_DUMPS) -> list[int]:
    """The live ranks the finding wants confirmed, at most ``max_dumps``."""
    return sorted(set([r for r in f.wants_stacks if r in view.ranks and stack_plan.live(view.ranks[r])][:max_dumps]))


def snapshot_ranks(f: Finding, view: ClusterView, max_snapshots: int = MAX_SNAPSHOTS) -> list[int]:
    """The culprits, then the other ranks up to ``max_snapshots``: a post-mortem
    needs what the others were doing too (waiting in the collective the culprit
    never entered, still stepping, torn down after it)."""
    named = [r for r in sorted(set(f.ranks) | set(f.wants_stacks)) if r in view.ranks]
    others = islice((r for r in sorted(view.ranks) if r not in named), max(0, max_snapshots - len(named)))
    return sorted(named + list(others))


def plan(
    f: Finding, view: ClusterView, max_dumps: int = MAX_DUMPS, max_stacks_per_host: int = stack_plan.MAX_PER_HOST
) -> list[CommandRequest]:
    """A hang or a frozen rank asks for every live rank's stack (``stack_plan``),
    anything else for those of the ranks it wants confirmed."""
    return plan_capped(f, view, max_dumps, max_stacks_per_host)[0]


def plan_capped(
    f: Finding,
    view: ClusterView,
    max_dumps: int = MAX_DUMPS,
    max_stacks_per_host: int = stack_plan.MAX_PER_HOST,
    context: frozenset[str] = CONTEXT,
) -> tuple[list[CommandRequest], dict[str, list[int]]]:
    """``plan``, and for a hang the ranks the per-host cap left out ({host:
    ranks}, journaled as ``stacks_capped``). At 16,384 ranks a hang's plan is
    three requests to each of 2,048 hosts: every live rank is chosen once (it was
    three times, ~60 ms each), and a rank list shared by two types (stacks and
    Flight Recorder) is grouped by host once. ``context``: the parts of the
    context to ask for (those another finding asked for just before are shared)."""
    want = context_of(f.kind) & context
    every: list[int] = []
    left: dict[str, list[int]] = {}
    if want & {commands.DUMP_STACKS, commands.DUMP_FLIGHT_RECORDER}:
        every, left = stack_plan.every_rank(f, view, max_stacks_per_host)
    if commands.DUMP_STACKS in want:
        stacks = every
    else:
        stacks, left = stack_ranks(f, view, max_dumps), {}
    room = MAX_SNAPSHOTS if commands.SNAPSHOT_SLOTS in want else 0  # 0: the named ranks' only
    wanted = [(commands.SNAPSHOT_SLOTS, snapshot_ranks(f, view, room)), (commands.DUMP_STACKS, stacks)]
    if commands.DUMP_FLIGHT_RECORDER in want:
        wanted.append((commands.DUMP_FLIGHT_RECORDER, every))
    return _requests(f, view, wanted), left


def context_of(kind: str) -> frozenset[str]:
    """The parts of the context a finding of ``kind`` asks for."""
    return frozenset(
        (commands.SNAPSHOT_SLOTS,)
        + ((commands.DUMP_STACKS,) if kind in stack_plan.ALL_RANKS_KINDS else ())
        + ((commands.DUMP_FLIGHT_RECORDER,) if kind in FR_KINDS else ())
    )


def _requests(f: Finding, view: ClusterView, wanted: list[tuple[str, list[int]]]) -> list[CommandRequest]:
    out = []
    grouped: dict[int, list[tuple[str, tuple[dict[str, int], ...]]]] = {}  # id(rank list) -> its targets by host
    trig = trigger(f)  # one for all: read only (at 16,384 ranks a hang's plan is 6,144 requests)
    for kind, ranks in wanted:
        by_host = grouped.get(id(ranks))
        if by_host is None:
            by_host = grouped[id(ranks)] = _targets_by_host(view, ranks)
        out += [CommandRequest(host=host, type=kind, targets=targets, trigger=trig) for host, targets in by_host]
    return out


def _targets_by_host(view: ClusterView, ranks: list[int]) -> list[tuple[str, tuple[dict[str, int], ...]]]:
    """[(host, its ranks' targets by rank)] sorted by host, in one pass over ``ranks``;
    identities from the view's columns (at 16,384 ranks the objects were ~30 ms),
    or for a few ranks from their objects: the columns' rank index is O(ranks) to
    build, and a job-wide stop has a finding per rank, each asking for its own."""
    by_host: dict[str, list[dict[str, int]]] = {}
    target = commands.target
    if len(ranks) * 64 < len(view.ranks):
        folded = view.ranks
        idents = [(r, folded[r].state.pid, folded[r].state.proc_start_us, folded[r].host) for r in sorted(ranks)]
    else:
        c = columns.of(view)
        row = dict(zip(c.rank, range(len(c.rank))))
        pid, start, host_of = c.pid, c.proc_start_us, c.host
        idents = [(r, pid[row[r]], start[row[r]], host_of[row[r]]) for r in sorted(ranks)]
    for r, p, st, host in idents:
        t = target(r, p, st)
        ts = by_host.get(host)
        if ts is None:
            by_host[host] = [t]
        else:
            ts.append(t)
    return [(host, tuple(ts)) for host, ts in sorted(by_host.items())]


def brief(reqs: list[CommandRequest], hosts_listed: int = 8) -> dict[str, dict[str, Any]]:
    """The requests for a log line: hosts and ranks per type (and the hosts'
    names while there are few): at 16,384 ranks the full list was 6,144 dicts
    in one line."""
    out: dict[str, dict[str, Any]] = {}
    for r in reqs:
        got = out.get(r.type)
        if got is None:
            got = out[r.type] = {"hosts": 0, "ranks": 0, "on": []}
        got["hosts"] += 1
        got["ranks"] += len(r.targets)
        if len(got["on"]) < hosts_listed:
            got["on"].append(r.host)
    for got in out.values():
        if got["hosts"] > hosts_listed:
            del got["on"]
    return out
