"""Which evidence to ask the agents for when a finding opens. Pure.

- Slot snapshots of the ranks a finding concerns and of the others (up to
  MAX_SNAPSHOTS), so a timeline has every lane. A dead rank's slot file is still
  on disk and its agent reads it, so ``dead_rank`` gets snapshots too.
- Python stacks of the ranks the detector wants confirmed (``wants_stacks``),
  plus, for a hang, ONE waiting rank: the culprit's stack says where it is stuck,
  a waiter's shows what the others are blocked in. Only live processes: a dead
  rank has no stack. At most ``max_dumps`` per finding: a dump pauses a rank.

- The Flight Recorder buffers of every live rank for a hang or a mismatched
  collective (``FR_KINDS``): each rank's hook dumps its own, so the per-rank
  files PyTorch's analyzer reads can be written from the journal, and our
  verdict and PyTorch's compared on the same fault (``watchdog timeline --fr-dump``).

One request per (host, type): an agent answers for its own ranks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from watchdog import commands

from . import stack_plan
from .finding import Finding
from .view import ClusterView, FoldedRank

MAX_DUMPS = 8
FR_KINDS = frozenset({"collective_hang", "frozen_rank", "collective_mismatch"})
MAX_SNAPSHOTS = 64  # ~40 KB of journal per rank snapshot; a 1000-rank job keeps the culprits + 63 others


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


def _live(rv: FoldedRank) -> bool:
    return rv.state.alive and rv.state.status != "exited"


def stack_ranks(f: Finding, view: ClusterView, max_dumps: int = MAX_DUMPS) -> list[int]:
    wanted = [r for r in f.wants_stacks if r in view.ranks and _live(view.ranks[r])][:max_dumps]
    if f.kind == "collective_hang":
        waiters = [w for w in f.evidence.get("waiters") or () if isinstance(w, int)]
        extra = next((w for w in sorted(waiters) if w not in wanted and w in view.ranks and _live(view.ranks[w])), None)
        if extra is not None:
            wanted = wanted[: max_dumps - 1] + [extra]
    return sorted(set(wanted))


def snapshot_ranks(f: Finding, view: ClusterView, max_snapshots: int = MAX_SNAPSHOTS) -> list[int]:
    """The culprits, then the other ranks up to ``max_snapshots``: a post-mortem
    needs what the others were doing too (waiting in the collective the culprit
    never entered, still stepping, torn down after it)."""
    named = [r for r in sorted(set(f.ranks) | set(f.wants_stacks)) if r in view.ranks]
    others = [r for r in sorted(view.ranks) if r not in named]
    return sorted(named + others[: max(0, max_snapshots - len(named))])


def plan(
    f: Finding, view: ClusterView, max_dumps: int = MAX_DUMPS, max_stacks_per_host: int = stack_plan.MAX_PER_HOST
) -> list[CommandRequest]:
    """A hang asks for every live rank's stack (``stack_plan``), anything else
    for the culprits' and one waiter's."""
    out = []
    stacks = (
        stack_plan.every_rank(f, view, max_stacks_per_host)[0]
        if f.kind in stack_plan.ALL_RANKS_KINDS
        else stack_ranks(f, view, max_dumps)
    )
    wanted = [(commands.SNAPSHOT_SLOTS, snapshot_ranks(f, view)), (commands.DUMP_STACKS, stacks)]
    if f.kind in FR_KINDS:
        wanted.append((commands.DUMP_FLIGHT_RECORDER, stack_plan.every_rank(f, view, max_stacks_per_host)[0]))
    for kind, ranks in wanted:
        for host, rvs in sorted(_by_host(view.ranks[r] for r in ranks).items()):
            targets = tuple(commands.target(rv.rank, rv.state.pid, rv.state.proc_start_us) for rv in rvs)
            out.append(CommandRequest(host=host, type=kind, targets=targets, trigger=trigger(f)))
    return out


def _by_host(rvs: Iterable[FoldedRank]) -> dict[str, list[FoldedRank]]:
    out: dict[str, list[FoldedRank]] = {}
    for rv in sorted(rvs, key=lambda x: x.rank):
        out.setdefault(rv.host, []).append(rv)
    return out
