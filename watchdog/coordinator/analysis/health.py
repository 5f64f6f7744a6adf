"""Per-rank health and the root-cause analysis every detector shares.

The root cause of a fault is the earliest event: when one rank dies or freezes,
the others block in the next collective, and may then time out, die, or freeze
themselves (a wait that holds the GIL). ``analyze`` finds the collective most
ranks are waiting in and the ranks that have not entered it, so every detector
blames the same rank, and ``victims`` tells dead_rank/frozen_rank which of the
failed ranks only failed because they were waiting for someone else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import and_, eq, itemgetter, lt, not_
from typing import Any

from ..config import DetectorConfig
from ..view import columns
from ..view.cluster import ClusterView, FoldedRank
from . import flight_recorder_blame, silence
from .mismatch import find as find_mismatch
from .tick_memo import per_tick

OK, DEAD, FROZEN, LOST, EXITED = "ok", "dead", "frozen", "lost", "exited"
# Not part of the job as it runs now: a rank of an earlier world (present_world) that is
# gone, left in the view by a restart with another world size. No detector names it or
# counts it as a waiter: torchrun elastic's restart after a lost node leaves the old
# world's last ranks dead "inside" a collective whose number the new ranks reach again.
RETIRED = "retired"
FAULTY = (DEAD, FROZEN, LOST)
_LIVE = frozenset((OK, FROZEN))
NOT_LIVE = frozenset((DEAD, LOST, EXITED, RETIRED))
_MAY_WAIT = frozenset((OK, FROZEN, DEAD))  # a dead rank's last wait still counts (it "failed inside")
# Progress times are estimated from reports; this absorbs their jitter.
STALL_SLACK_S = 0.5
# A host silent this many of its report intervals (and not yet lost) is "quiet".
QUIET_INTERVALS = 2.0
# The Flight Recorder's view (flight_recorder_blame) is consulted once no live rank has made
# progress for this long: a per-tick cost at scale that a running job never pays.
FR_AFTER_S = 1.0


def host_silence_limit(view: ClusterView, host: str, cfg: DetectorConfig) -> float:
    hv = view.hosts[host]
    # Reports still queued in a coordinator that is behind are not silence.
    return cfg.host_silence_intervals * view.reporting_interval(hv) + view.behind_s


def host_lost(view: ClusterView, host: str, now: float, cfg: DetectorConfig) -> bool:
    return host in lost_hosts(view, now, cfg)


def quiet_hosts(view: ClusterView, now: float) -> set[str]:
    """Hosts that missed more than ``QUIET_INTERVALS`` of their reports (lost ones too):
    what their ranks last said is not what they are doing now."""
    return {
        h
        for h, hv in view.hosts.items()
        if now - hv.received_at > QUIET_INTERVALS * view.reporting_interval(hv) + view.behind_s
    }


@per_tick()
def lost_hosts(view: ClusterView, now: float, cfg: DetectorConfig) -> set[str]:
    """Silent hosts whose ranks the evidence says are gone (``silence.judge``): a
    silent agent alone is the monitor's blindness (``unobserved_hosts``), not a loss."""
    return {h for h, s in silences(view, now, cfg).items() if s.verdict == silence.LOST}


@per_tick()
def finished_hosts(view: ClusterView, now: float, cfg: DetectorConfig) -> set[str]:
    """Silent hosts whose launcher said it exited with status 0: their ranks exited with it."""
    return {h for h, s in silences(view, now, cfg).items() if s.verdict == silence.FINISHED}


def unobserved_hosts(view: ClusterView, now: float, cfg: DetectorConfig) -> dict[str, silence.Silence]:
    """Silent hosts with nothing against their ranks: alive as far as anyone can tell."""
    return {h: s for h, s in silences(view, now, cfg).items() if s.verdict == silence.UNOBSERVED}


@per_tick()
def silences(view: ClusterView, now: float, cfg: DetectorConfig) -> dict[str, silence.Silence]:
    """A verdict (analysis/silence.py) for each host silent past its silence limit with a rank
    last seen running. Memoized (read-only): the coordinator's host bookkeeping and
    every rank's health ask on each tick, a pass over the 2,048 hosts of a
    16,384-rank job each time."""
    limits = {
        h: cfg.host_silence_intervals * view.reporting_interval(hv) + view.behind_s for h, hv in view.hosts.items()
    }
    silent = {h: lim for h, lim in limits.items() if now - view.hosts[h].received_at > lim}
    return silence.judge(view, now, silent, waiting, cfg.hang_phase_allowance_s) if silent else {}


def classify(rv: FoldedRank, view: ClusterView, now: float, cfg: DetectorConfig, lost: set[str] | None = None) -> str:
    h = _classify(rv, view, now, cfg, lost)
    if h in _LIVE:
        return h
    world = present_world(view, now, cfg)
    return RETIRED if world is not None and rv.state.world_size != world else h


def _classify(rv: FoldedRank, view: ClusterView, now: float, cfg: DetectorConfig, lost: set[str] | None) -> str:
    """``classify`` of a rank as if the job had only one world."""
    s = rv.state
    if s.status == "exited" or rv.host in finished_hosts(view, now, cfg):
        return EXITED  # a clean exit (the hook saw the interpreter exit, or its launcher exited 0) is not a death
    if rv.host in (lost_hosts(view, now, cfg) if lost is None else lost):
        return LOST
    if not s.alive:
        return DEAD
    # The agent's own reading of the heartbeat, not one aged by a slow report:
    # a late report is a host problem, not a frozen rank. A hook that gave up
    # (disabled) stops beating without the process being frozen.
    if (
        s.status != "disabled"
        and rv.heartbeat_moved
        and s.heartbeat_age_s > cfg.frozen_after_s(s.proc_status, s.step == 0)
    ):
        return FROZEN
    return OK


@per_tick()
def classify_all(view: ClusterView, now: float, cfg: DetectorConfig) -> dict[int, str]:
    """Each rank's ``classify``, in the view's rank order (the columns' order: the
    hang analysis reads the values of this dict as a column). Read-only: memoized."""
    base = _classify_all(view, now, cfg)
    world = present_world(view, now, cfg)
    if world is None:
        return base  # one world (nearly always: one C-level scan found it)
    c = columns.of(view)
    retired = [r for r, h, w in zip(c.rank, base.values(), c.world_size) if w != world and h not in _LIVE]
    return {**base, **dict.fromkeys(retired, RETIRED)} if retired else base


@per_tick()
def present_world(view: ClusterView, now: float, cfg: DetectorConfig) -> int | None:
    """The world size of the job as it runs now, where the view holds ranks of more
    than one: the size every live rank reports. None when every rank reports one size,
    when no rank is live (a restart under way) or when live ranks disagree (mid-restart:
    nobody is retired until the new world stands)."""
    c = columns.of(view)
    if one_world(c):
        return None
    live = set(compress(c.world_size, map(_LIVE.__contains__, _classify_all(view, now, cfg).values())))
    return live.pop() if len(live) == 1 else None


def expected_world(view: ClusterView, now: float, cfg: DetectorConfig) -> int:
    """The ranks the job should have now: the configured world size, else the one
    every live rank reports after a restart changed it (``present_world``: a job
    that shrank to 2 ranks expects 2, not the 4 it had), else the largest reported."""
    if view.world_size_fixed:
        return view.world_size
    return present_world(view, now, cfg) or view.world_size


def one_world(c: columns.RankColumns) -> bool:
    """Every rank, live or not, reports one world size (or there is none): no restart
    changed it. One C-level count (a typed array's min and max were 2.5x as long)."""
    sizes = c.world_size
    return not sizes or sizes.count(sizes[0]) == len(sizes)


@per_tick()
def _classify_all(view: ClusterView, now: float, cfg: DetectorConfig) -> dict[int, str]:
    """``_classify`` of every rank."""
    lost, done = lost_hosts(view, now, cfg), finished_hosts(view, now, cfg)
    frozen_s, stopped_s = cfg.frozen_after_s("", False), cfg.frozen_after_s("stopped", False)  # inlined per rank below
    starting_s = cfg.frozen_after_s("", True)
    c = columns.of(view)
    rank = c.rank
    # A rank that has not exited, is alive, not on a lost host and has a heartbeat
    # younger than the shorter frozen limit is OK: nearly every rank on every tick.
    # The others are found with C-level scans of the columns, and only they are
    # classified one by one (``classify`` inlined; at 16,384 ranks a Python pass
    # over every rank was ~8 ms a tick). The same answers: tests/test_coord_tick_equiv.py.
    rows = range(len(rank))
    odd = set(compress(rows, map(lt, repeat(stopped_s), c.heartbeat_age_s)))
    if "exited" in c.status:
        odd.update(compress(rows, map(eq, repeat("exited"), c.status)))
    if not all(c.alive):
        odd.update(compress(rows, map(not_, c.alive)))
    if lost:
        odd.update(compress(rows, map(lost.__contains__, c.host)))
    if done:
        odd.update(compress(rows, map(done.__contains__, c.host)))
    out = dict.fromkeys(rank, OK)
    status, host, alive, moved, hb_age, proc, step = (
        c.status,
        c.host,
        c.alive,
        c.heartbeat_moved,
        c.heartbeat_age_s,
        c.proc_status,
        c.step,
    )
    for i in odd:
        if status[i] == "exited" or (done and host[i] in done):
            out[rank[i]] = EXITED
        elif lost and host[i] in lost:
            out[rank[i]] = LOST
        elif not alive[i]:
            out[rank[i]] = DEAD
        elif (
            status[i] != "disabled"
            and moved[i]
            and hb_age[i] > (stopped_s if proc[i] == "stopped" else frozen_s if step[i] else starting_s)
        ):
            out[rank[i]] = FROZEN
    return out


def waiting(rv: FoldedRank) -> bool:
    """Inside a collective and no step completed since entering it: a rank whose
    'outstanding' count leaked while it keeps stepping is not waiting."""
    s = rv.state
    c = s.coll
    # rv.step_start() <= rv.coll_enter() + slack, inlined (the same floats): called for every rank each tick
    return c.outstanding > 0 and rv.received_at - s.step_age_s <= rv.received_at - c.since_s + STALL_SLACK_S


@dataclass(frozen=True)
class Blame:
    group: int
    seq: int  # the first collective on ``group`` the waiters have not completed
    op: str
    waiters: tuple[int, ...]  # waiting in it
    culprits: tuple[int, ...]  # have not entered it (or failed inside it); () if unknown
    elsewhere: tuple[int, ...]  # waiting in a collective on another group
    waiting_since: float  # earliest enter among the waiters
    latest_enter: float
    # "missing", "behind", "mismatched", "failed_inside", "other_group" or "unknown"; from the
    # Flight Recorder also "not_started" (entered on CPU, not started on GPU) and "unproven"
    # (someone is behind, but no reading made since the wait began says who: nobody named); from
    # the marks "unheard" (the only ranks not in it are on quiet hosts, not heard from since the
    # last waiter entered: nobody named until they report or their host is lost)
    how: str
    source: str = "marks"  # "marks": the hook's own collective marks; "flight_recorder": flight_recorder_blame
    unread: tuple[int, ...] = ()  # behind with no Flight Recorder reading, or unheard, since the wait began
    detail: tuple[tuple[int, str], ...] = ()  # (culprit, where it is stuck), when known


def analyze(view: ClusterView, now: float, cfg: DetectorConfig, health: dict[int, str] | None = None) -> Blame | None:
    """The collective most ranks wait in, and who holds it up. None if no rank waits.
    ``health`` is ``classify_all(view, now, cfg)``; passing it is only an optimisation."""
    return _analyze(view, now, cfg)


@per_tick()
def _analyze(view: ClusterView, now: float, cfg: DetectorConfig) -> Blame | None:
    # Column by column (view/columns.py): at 16,384 ranks, in a hang, every rank waits and the
    # passes over the rank objects this took were ~200 ms a tick. The same answers as the
    # plain code it replaced, kept as the reference in tests/test_coord_hang_equiv.py.
    health = classify_all(view, now, cfg)
    c = columns.of(view)
    hs = tuple(health.values())  # classify_all's order is the columns' order
    rank = c.rank
    quiet = quiet_hosts(view, now)
    slack = STALL_SLACK_S
    is_wait = _is_wait(c, hs, quiet)
    wait = list(compress(range(len(rank)), is_wait))  # rows
    if not wait:
        return _fr_blame(view, now, health)
    coll_seq = c.coll_seq
    group, on = _on_group(c, wait)
    seq = min(_take(c.coll_done_seq, on)) + 1
    front = max(_take(coll_seq, on))
    ops = _count(_take(c.coll_op, on))
    enters = _take(c.coll_enter, on)
    latest_enter = max(enters)
    on_ranks = _take(rank, on)
    wait_ranks = on_ranks if on is wait else _take(rank, wait)
    elsewhere = () if on is wait else tuple(sorted(set(wait_ranks) - set(on_ranks)))

    # 1. Ranks not in any collective: failed, exited, or stuck in their own code
    #    since before the others started waiting (a rank still making progress
    #    elsewhere is not what they wait for). A rank last heard from before the
    #    last waiter entered may have entered since: it is "unheard", never a
    #    culprit on that alone, whether its host missed its reports (quiet) or they
    #    still sit in the buffers of a coordinator that is behind.
    missing: list[int] = []
    unheard: list[int] = []
    stalled_by = latest_enter + slack  # FoldedRank.progress_at <= this: stalled
    failed_like = FAULTY + (EXITED,)
    progress_at, received_at = c.progress_at, c.received_at
    for i in compress(range(len(rank)), map(not_, is_wait)):  # in a hang, nearly every rank waits
        r, h = rank[i], hs[i]
        if h in failed_like:
            missing.append(r)
        elif h != RETIRED and progress_at[i] <= stalled_by:
            (unheard if received_at[i] <= latest_enter else missing).append(r)
    fr_memo: list[flight_recorder_blame.FrFront | None] = []  # _fr_front at most once: it is pure

    def fr_front() -> flight_recorder_blame.FrFront | None:
        if not fr_memo:
            fr_memo.append(_fr_front(view, now, health))
        return fr_memo[0]

    fr = fr_front() if missing else None
    if fr is not None:  # the Flight Recorder shows more than the marks: these wait in the same collective
        held = set(fr.waiters) | set(fr.earlier)
        missing = [r for r in missing if r not in held]
    # 2. Waiting, but on an earlier collective than the others entered (a rank
    #    killed half-way through its gradient buckets).
    seqs = _take(coll_seq, on)
    level = min(seqs) == front  # nearly always: then nobody is behind
    behind = [] if level else [r for r, q in zip(on_ranks, seqs) if q < front]
    # 3. In the same collective by number but a different one in fact (another op
    #    or size than most: a desync); the minority is the odd one out.
    at_front = on if level else [i for i, q in zip(on, seqs) if q == front]
    op, nbytes = c.coll_op, c.coll_bytes
    front_ops, front_bytes = _take(op, at_front), _take(nbytes, at_front)
    if _same(front_ops) and _same(front_bytes):  # nearly always: one shape
        shapes = Counter({(front_ops[0], front_bytes[0]): len(at_front)})
    else:
        shapes = Counter(zip(front_ops, front_bytes))
    mismatched = []
    if len(shapes) > 1:
        (top, n_top), (_, n_next) = shapes.most_common(2)
        if n_top > n_next:
            mismatched = [rank[i] for i in at_front if (op[i], nbytes[i]) != top]
    # 4. Failed while inside the collective itself.
    inside = list(compress(wait_ranks, map(FAULTY.__contains__, _take(hs, wait))))
    # 0. A mismatch the recorded shapes show (Flight Recorder or hook marks) came
    #    first: the ranks waiting now wait because of it, whoever looks "behind".
    recorded = find_mismatch(view)
    recorded_odd = [r for r in recorded.odd if r in view.ranks] if recorded is not None else []
    how, culprits = "unknown", list[int]()
    # The first non-empty (how, culprits) pair is the blame: the loop variables are the result.
    for how, culprits in (  # noqa: B007
        ("mismatched", recorded_odd),
        ("missing", missing),
        ("behind", behind),
        ("mismatched", mismatched),
        ("failed_inside", inside),
        ("other_group", list(elsewhere)),
    ):
        if culprits:
            break
    else:
        how = "unknown"
        found = _as_blame(fr_front())
        if found is not None and found.culprits:
            return found  # every visible waiter in, but the Flight Recorder names who holds them
        if unheard:
            how = "unheard"  # nobody named until they report again or their host is lost
    blamed = set(culprits)  # a set: at 16k ranks a list made this O(waiters x culprits)
    waiters = tuple(sorted(set(on_ranks).difference(blamed) if blamed else on_ranks))
    return Blame(
        group=group,
        seq=seq,
        op=ops.most_common(1)[0][0],
        waiters=waiters,
        culprits=tuple(sorted(culprits)),
        elsewhere=tuple(r for r in elsewhere if r not in blamed),
        waiting_since=min(enters),
        latest_enter=latest_enter,
        how=how,
        unread=tuple(sorted(unheard)) if how == "unheard" else (),
    )


def _is_wait(c: columns.RankColumns, hs: tuple, quiet: set[str]) -> list[bool]:
    """``waiting`` per row, from the same floats (step_start and coll_enter are the
    columns'). A lost host's ranks are not waiting "now": their last state is as old
    as the host's silence, so counting them as waiters would have the live ranks
    blamed for a wait seen on stale data. Nor are those of a ``quiet`` host, one that
    missed a few reports but is not lost yet (10 s at a 2 s advised interval, past the
    5 s hang floor): its ranks' wait is as old as its silence too. Nor, of course,
    are ranks that exited or were retired."""
    slack, may_wait = STALL_SLACK_S, _MAY_WAIT
    if quiet:
        is_wait = [
            out > 0 and start <= enter + slack and h in may_wait and host not in quiet
            for out, start, enter, h, host in zip(c.coll_outstanding, c.step_start, c.coll_enter, hs, c.host)
        ]
    else:
        is_wait = [
            out > 0 and start <= enter + slack and h in may_wait
            for out, start, enter, h in zip(c.coll_outstanding, c.step_start, c.coll_enter, hs)
        ]
    return _not_overtaken(c, hs, is_wait) if any(is_wait) else is_wait


def _not_overtaken(c: columns.RankColumns, hs: tuple, is_wait: list[bool]) -> list[bool]:
    """``is_wait`` without the waits another rank has already seen the end of: a
    rank in collective #q of a group is not waiting now if a live rank outside any
    collective has completed #q (or a later one) on that group. Its report is older
    than that rank's: a coordinator that is behind folds reports that sat seconds
    in its socket buffers next to fresh ones (at 16,384 ranks on a starved core,
    ranks shown waiting in all_reduce #53 beside ranks done with #105), and taking
    such a view for one moment named 13,196 ranks, every one of them ahead of the
    "waiters", as never having entered #53. A collective still in progress is not
    one another rank has left (gloo completes for all; an NCCL call returns when
    queued, and a rank that queued #q has entered it: not missing from it)."""
    group, done = c.coll_group, c.coll_done_seq
    free_live = list(map(and_, map(not_, is_wait), map(_LIVE.__contains__, hs)))  # C-level, per rank
    if not any(free_live):
        return is_wait  # in a hang nearly every rank waits: nobody to have overtaken them
    groups = set(compress(group, is_wait))
    if len(groups) == 1:
        (g,) = groups
        tops = {g: max(compress(done, map(and_, free_live, map(g.__eq__, group))), default=-1)}
    else:
        tops = dict.fromkeys(groups, -1)
        for g, d in compress(zip(group, done), free_live):
            if g in tops and d > tops[g]:
                tops[g] = d
    seq = c.coll_seq
    if all(q > tops[g] for q, g in compress(zip(seq, group), is_wait)):
        return is_wait  # nearly always: nobody has left a collective another is in
    return [w and q > tops[g] for w, q, g in zip(is_wait, seq, group)]


def _on_group(c: columns.RankColumns, wait: list[int]) -> tuple[int, list[int]]:
    """The group most waiters wait on (the lowest on a tie), and the rows of the
    waiters on it."""
    coll_group = c.coll_group
    groups = _count(_take(coll_group, wait))
    group = min(groups, key=lambda g: (-groups[g], g))
    on = wait if len(groups) == 1 else [i for i in wait if coll_group[i] == group]
    return group, on


def waiting_since(view: ClusterView, now: float, cfg: DetectorConfig) -> float | None:
    """``analyze(view, now, cfg).waiting_since`` (None where it returns None), without
    the rest of the analysis where the hook's marks alone decide it: when no rank's
    Flight Recorder showed anything, the blame is the marks' (none when no rank
    waits), waiting since the earliest enter of the waiters on its group, whoever is
    blamed. The hang's age needs only this on every tick; the culprits (~13,000
    ranks at 16,384 ranks reporting every 3 s, sorted and set apart each tick) only
    when the hang is called. With Flight Recorder readings, the analysis itself."""
    c = columns.of(view)
    if any(c.fr_held):
        blame = analyze(view, now, cfg)
        return None if blame is None else blame.waiting_since
    is_wait = _is_wait(c, tuple(classify_all(view, now, cfg).values()), quiet_hosts(view, now))
    wait = list(compress(range(len(c.rank)), is_wait))
    if not wait:
        return None  # _fr_blame: None without Flight Recorder readings
    return min(_take(c.coll_enter, _on_group(c, wait)[1]))


def _same(values: tuple) -> bool:
    """All equal (one C-level count; ``values`` is not empty)."""
    return values.count(values[0]) == len(values)


def _count(values: tuple) -> Counter:
    """``Counter(values)``; one count when all are the same value (nearly always: a
    single group, a single op), ~10x cheaper than counting 16,384 values one by one."""
    return Counter({values[0]: len(values)}) if _same(values) else Counter(values)


def _take(col: Sequence[Any], rows: list[int]) -> tuple:
    """``col``'s values at ``rows`` (one C call: ``itemgetter`` of one row gives a bare value)."""
    return itemgetter(*rows)(col) if len(rows) > 1 else tuple(col[i] for i in rows)


def _fr_front(view: ClusterView, now: float, health: dict[int, str]) -> flight_recorder_blame.FrFront | None:
    c = columns.of(view)
    if not any(c.fr_held):
        return None  # what flight_recorder_blame.find says when no rank's Flight Recorder showed anything
    is_ok = list(map(eq, repeat(OK), health.values()))  # classify_all's order is the columns'
    latest = max(compress(c.progress_at, is_ok), default=None)
    if latest is None or now - latest < FR_AFTER_S:
        return None
    ok = set(compress(health.keys(), is_ok))
    failed = set(compress(health.keys(), map((FAULTY + (EXITED,)).__contains__, health.values())))
    return flight_recorder_blame.find(view, ok, failed)


def _fr_blame(view: ClusterView, now: float, health: dict[int, str]) -> Blame | None:
    return _as_blame(_fr_front(view, now, health))


def _as_blame(f: flight_recorder_blame.FrFront | None) -> Blame | None:
    if f is None:
        return None
    return Blame(
        group=f.group,
        seq=f.seq,
        op=f.op,
        waiters=f.waiters,
        culprits=f.culprits,
        elsewhere=(),
        waiting_since=f.waiting_since,
        latest_enter=f.latest_enter,
        how=f.how,
        source="flight_recorder",
        unread=f.unread,
        detail=tuple(sorted(f.detail.items())),
    )


def victims(
    view: ClusterView, now: float, cfg: DetectorConfig, health: dict[int, str], blame: Blame | None
) -> set[int]:
    """Failed ranks that were waiting for someone else when they failed: they are
    not the root cause and get no finding of their own."""
    if blame is None or not blame.culprits or blame.how in ("failed_inside", "unknown", "unproven"):
        return set()
    # The few failed ranks, met with the (many) waiters in C rather than a lookup per waiter.
    failed = set(compress(health.keys(), map(FAULTY.__contains__, health.values())))
    if not failed:
        return failed
    return failed.intersection(blame.waiters) | failed.intersection(blame.elsewhere)
