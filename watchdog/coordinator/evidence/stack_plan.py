"""Which ranks' stacks to ask for: at a hang, every live rank, capped per host. Pure.

One culprit's stack and one waiter's are enough at 4 ranks; at 1,000 or 16,000
the question is "which ranks are where", so a hang (``collective_hang``, and
``frozen_rank``: a stopped rank stalls every peer) asks each host for all of its
live ranks. The agent dumps them in parallel within its own deadline
(``watchdog.agent.command_channel.dumpall``); the coordinator never asks one host for more than
``max_per_host`` (and never more than a command may carry, ``MAX_TARGETS``).
What the cap leaves out is returned, so it is journaled (``stacks_capped``)
instead of silently missing.

Order within a host when the cap bites: the finding's culprits and the ranks it
wants stacks of, then its waiters, then the lowest ranks: the odd one out must
never be the one left out.
"""

from __future__ import annotations

from watchdog.contracts import commands
from watchdog.contracts.journal.commands import StacksCappedRecord

from ...contracts.finding import Finding
from ..view import columns
from ..view.cluster import ClusterView, FoldedRank

ALL_RANKS_KINDS = frozenset({"collective_hang", "frozen_rank", "wedged"})
MAX_PER_HOST = 64  # a host with more ranks than this is unusual; 64 py-spy dumps at 8 at a time fit the deadline


def live(rv: FoldedRank) -> bool:
    return rv.state.alive and rv.state.status != "exited"


def every_rank(
    f: Finding, view: ClusterView, max_per_host: int = MAX_PER_HOST
) -> tuple[list[int], dict[str, list[int]]]:
    """(ranks to dump, {host: ranks left out by the cap})."""
    cap = max(1, min(max_per_host, commands.MAX_TARGETS))
    first = set(f.ranks) | set(f.wants_stacks)
    waiters = {w for w in f.evidence.get("waiters") or () if isinstance(w, int)}
    by_host: dict[str, list[int]] = {}
    c = columns.of(view)  # ``live`` from the columns: at 16,384 ranks the objects were ~25 ms
    for rank, host, alive, status in zip(c.rank, c.host, c.alive, c.status):
        if alive and status != "exited":
            by_host.setdefault(host, []).append(rank)
    chosen: list[int] = []
    left: dict[str, list[int]] = {}
    for host, ranks in sorted(by_host.items()):
        if len(ranks) <= cap:  # all of them (the order is the sort below)
            chosen += ranks
            continue
        ranks.sort(key=lambda r: (r not in first, r not in waiters, r))
        chosen += ranks[:cap]
        left[host] = sorted(ranks[cap:])
    return sorted(chosen), left


def capped_record(f: Finding, left: dict[str, list[int]], max_per_host: int) -> StacksCappedRecord:
    """The ``stacks_capped`` journal record: the cap, and who it left out."""
    from watchdog.stackgroups import rank_ranges_list

    return StacksCappedRecord(
        trigger={"kind": f.kind, "ranks": list(f.ranks)},
        max_per_host=max_per_host,
        ranks_left_out=sum(len(v) for v in left.values()),
        hosts={h: rank_ranges_list(v) for h, v in sorted(left.items())[:64]},
        hosts_capped=len(left),
    )
