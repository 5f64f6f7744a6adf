"""The evidence plan built in one pass (``plan_capped``) asks for exactly what the
plan it replaced asked for (kept below as the reference), host by host, with the
same targets and triggers, and leaves out the same ranks when the per-host cap
bites; the ``evidence_requested`` log line counts hosts and ranks per type."""

from __future__ import annotations

import pytest

from watchdog.contracts import commands
from watchdog.coordinator import testing as t
from watchdog.coordinator.evidence import stack_plan
from watchdog.coordinator.evidence.plan import (
    FR_KINDS,
    MAX_DUMPS,
    CommandRequest,
    brief,
    plan_capped,
    stack_ranks,
    trigger,
)


def _every_rank(f, view, max_per_host):
    """``stack_plan.every_rank`` as it was: liveness read from each rank's objects, every host sorted."""
    cap = max(1, min(max_per_host, commands.MAX_TARGETS))
    first = set(f.ranks) | set(f.wants_stacks)
    waiters = {w for w in f.evidence.get("waiters") or () if isinstance(w, int)}
    by_host: dict[str, list[int]] = {}
    for rank, rv in view.ranks.items():
        if stack_plan.live(rv):
            by_host.setdefault(rv.host, []).append(rank)
    chosen: list[int] = []
    left: dict[str, list[int]] = {}
    for host, ranks in sorted(by_host.items()):
        ranks.sort(key=lambda r: (r not in first, r not in waiters, r))
        chosen += ranks[:cap]
        if len(ranks) > cap:
            left[host] = sorted(ranks[cap:])
    return sorted(chosen), left


def _snapshot_ranks(f, view, max_snapshots=64):
    named = [r for r in sorted(set(f.ranks) | set(f.wants_stacks)) if r in view.ranks]
    others = [r for r in sorted(view.ranks) if r not in named]
    return sorted(named + others[: max(0, max_snapshots - len(named))])


def _reference(f, view, max_dumps=MAX_DUMPS, max_stacks_per_host=stack_plan.MAX_PER_HOST):
    """The plan as it was before the one-pass rewrite, with the service's cap check."""
    stacks = (
        _every_rank(f, view, max_stacks_per_host)[0]
        if f.kind in stack_plan.ALL_RANKS_KINDS
        else stack_ranks(f, view, max_dumps)
    )
    wanted = [(commands.SNAPSHOT_SLOTS, _snapshot_ranks(f, view)), (commands.DUMP_STACKS, stacks)]
    if f.kind in FR_KINDS:
        wanted.append((commands.DUMP_FLIGHT_RECORDER, _every_rank(f, view, max_stacks_per_host)[0]))
    left = _every_rank(f, view, max_stacks_per_host)[1] if f.kind in stack_plan.ALL_RANKS_KINDS else {}
    return _requests(f, view, wanted), left


def _requests(f, view, wanted):
    out = []
    for kind, ranks in wanted:
        by_host: dict[str, list] = {}
        for rv in sorted((view.ranks[r] for r in ranks), key=lambda x: x.rank):
            by_host.setdefault(rv.host, []).append(rv)
        for host, rvs in sorted(by_host.items()):
            targets = tuple(commands.target(rv.rank, rv.state.pid, rv.state.proc_start_us) for rv in rvs)
            out.append(CommandRequest(host=host, type=kind, targets=targets, trigger=trigger(f)))
    return out


def _view():
    # 96 ranks, 12 per host (so a cap of 5 bites), two dead and one exited
    ranks = t.with_rank(t.with_rank(t.healthy(96), 13, alive=False), 70, alive=False)
    ranks = t.with_rank(ranks, 41, status="exited")
    return t.view(ranks, ranks_per_host=12)


FINDINGS = [
    t.finding("collective_hang", [50], wants=[50], waiters=[3, 60, 61, 95]),
    t.finding("frozen_rank", [13, 77], wants=[77]),
    t.finding("collective_mismatch", [8, 9], wants=[8, 9, 40]),
    t.finding("straggler", [60]),
    t.finding("dead_rank", [13, 70]),
    t.finding("batch_changed", [], wants=[1, 2]),
]


@pytest.mark.parametrize("cap", [64, 11, 5, 1])  # 11: one less than a full host
@pytest.mark.parametrize("f", FINDINGS, ids=[f.kind for f in FINDINGS])
def test_one_pass_plan_is_the_reference_plan(f, cap):
    view = _view()
    got, left = plan_capped(f, view, max_stacks_per_host=cap)
    want, want_left = _reference(f, view, max_stacks_per_host=cap)
    assert got == want
    assert left == want_left
    if cap == 5 and f.kind in stack_plan.ALL_RANKS_KINDS:
        assert left  # the cap bit: the test covers the left-out ranks


@pytest.mark.parametrize("f", FINDINGS, ids=[f.kind for f in FINDINGS])
def test_without_the_context_a_finding_asks_its_culprits_snapshots_and_stacks_only(f):
    view = _view()
    named = sorted(r for r in set(f.ranks) | set(f.wants_stacks) if r in view.ranks)
    live = sorted(r for r in set(f.wants_stacks) if r in view.ranks and stack_plan.live(view.ranks[r]))[:MAX_DUMPS]
    got, left = plan_capped(f, view, context=frozenset())
    assert got == _requests(f, view, [(commands.SNAPSHOT_SLOTS, named), (commands.DUMP_STACKS, live)])
    assert left == {}


def test_the_log_line_counts_hosts_and_ranks_per_type():
    view = _view()
    reqs, _ = plan_capped(FINDINGS[0], view)
    b = brief(reqs, hosts_listed=4)
    assert b[commands.SNAPSHOT_SLOTS] == {
        "hosts": 6,
        "ranks": 64,
    }  # MAX_SNAPSHOTS: ranks 0-62 and 50; no names past 4 hosts
    assert b[commands.DUMP_STACKS] == {"hosts": 8, "ranks": 93}  # every live rank
    assert b[commands.DUMP_FLIGHT_RECORDER]["ranks"] == 93
    small = brief([r for r in reqs if r.host in ("host0", "host1")], hosts_listed=4)
    assert small[commands.DUMP_STACKS] == {"hosts": 2, "ranks": 23, "on": ["host0", "host1"]}
