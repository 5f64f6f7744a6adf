"""Intermittent stragglers: a rank that stalls now and then while the others wait.

The straggler windows (``steps._close_windows``) summarise each rank's compute
by a trimmed mean, and the loader's data share leaves out the slowest tenth of
steps, on purpose: one GC pause or one slow first batch is no fault. But a rank
that stalls for a second every 25 steps (its own synchronous save or eval, a
periodic job on its host, a shard its loader opens from cold storage) costs
the job as much as a rank twice as slow, and every one of its windows looks
normal once the stall is trimmed. The goodput ledger sees it (the time goes to
its ``straggler`` category); this names the rank: the straggler detector when
the stalls are its compute, loader_starvation when they are its data wait.

For every train step the ledger splits (all live ranks reported it) it notes
the rank with the most work of its own (compute and data wait: what the others
wait for), how far over the median rank's that ran, and how much of that was
data wait (``Stalls.add``). A step is a stall when the excess is at least
``EVENT_SHARE`` of the step's wall time: the others spent a large part of the
step waiting for one rank. A rank is stalling (``stalling``) when, over the
last ``STALL_STEPS`` steps noted:

- at least ``MIN_EVENTS`` stalls were its own, in at least as many straggler
  windows (``straggler_window_steps``) as the windows detector compares: spread
  out, not one burst of contention on its host;
- its stalls cost at least ``MIN_SHARE`` of the wall time of those steps;
- they are intermittent: at most half the steps from its first stall on (a
  rank slow on most steps is the windows' straggler, named by its slowdown);
- it had most of the stalls (``MAJORITY``), and more than chance explains: were
  every stall on a rank drawn at random among the ranks of the job, the odds
  that some rank would get as many are below ``SIGNIFICANCE`` (the binomial
  tail, times the ranks). Two ranks that take turns in stalling, or pauses all
  over the job, name nobody (in a simulated job pausing on 2% of each rank's
  steps, chance once gave one rank of eight 16 of 46 pauses in 256 steps).

Pure: ``stalling`` is a function of the steps noted; ``Stalls`` is what the
ledger (itself a pure function of the views it is given) keeps of them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from ...contracts.finding import Finding
from .periodic import FREEZE_WHERE, Occurrence, Pattern, frame_key, frame_line, patterns

if TYPE_CHECKING:
    from ..config import DetectorConfig
    from ..view.cluster import ClusterView, FoldedRank

STALL_STEPS = 512  # steps noted (the newest)
EVENT_SHARE = 0.25  # a stall: the rank's own work over the median's is this share of the step's wall time
MIN_EVENTS = 3
MIN_SHARE = 0.05  # of the steps' wall time lost to the rank's stalls
SIGNIFICANCE = 1e-4
MAJORITY = 0.5  # of all the stalls in the steps noted
INTERMITTENT = 0.5  # stalls on at most this share of the steps from a rank's first
PAUSES_KEPT = 64  # steps in which a minority of ranks was in a checkpoint or eval phase
PAUSE_WHERE = "a checkpoint or eval phase"
FRAMES_KEPT = 1024  # (rank, step) -> the frames its hook sampled in that step
FRAMES_PER_STEP = 16  # distinct frames kept of one step, newest
# A stall is where one was seen before when its frame is in the same function and within
# this many lines of the lines sampled there before: a loop's body samples at a few lines
# (nanoGPT's estimate_loss: 222, 224, 225), another stall in a big ``main`` is elsewhere.
LINE_SLACK = 2
# A running rank's heartbeat stale this long, then beating again, ended a freeze by itself
# (its agent's reading; a third of the default frozen_rank threshold: a beat every 0.5 s).
FREEZE_MIN_S = 1.0
# A stall where one was seen before on the rank, in the same frame, is expected to last
# as long again: the hang deadline allows the longest seen so far times this, plus this.
EXPECTED_FACTOR = 1.25
EXPECTED_MARGIN_S = 2.0


class SplitStep(NamedTuple):
    """One train step split by the goodput ledger: its number, wall time (the
    slowest rank's), the rank with the most work of its own (compute + data
    wait), that work over the median rank's compute and data wait, its data wait
    over the median's (the part of the excess that was its loader), and how many
    ranks reported the step."""

    step: int
    step_s: float
    rank: int
    excess_s: float
    data_s: float
    ranks: int


class Stalls:
    """The newest ``STALL_STEPS`` steps, as the ledger split them."""

    def __init__(self) -> None:
        self.steps: deque[SplitStep] = deque(maxlen=STALL_STEPS)
        # Steps that some ranks (not all) spent in a checkpoint or eval phase while the
        # others trained (the ledger does not split them): their own periodic pattern.
        self.pauses: deque[Occurrence] = deque(maxlen=PAUSES_KEPT)
        # Unmarked stalls whose rank's hook sampled its frame during the step (hook/frames.py):
        # where the rank held the job, so a recurrence in the same place is recognised.
        self.framed: deque[Occurrence] = deque(maxlen=PAUSES_KEPT)
        self.frames: dict[tuple[int, int], tuple[str, ...]] = {}  # (rank, step) -> frames, oldest first
        # Heartbeat freezes of a running rank that ended by themselves (a call holding the
        # GIL: its heartbeat and frame sampler cannot run), and the ones still open.
        self.froze: deque[Occurrence] = deque(maxlen=PAUSES_KEPT)
        self.freezing: dict[int, _Freezing] = {}

    def saw_frame(self, rank: int, step: int, frame: str) -> None:
        """Rank ``rank``'s hook sampled ``frame`` during step ``step``."""
        key = (rank, step)
        seen = self.frames.pop(key, ())
        self.frames[key] = (*(f for f in seen if f != frame), frame)[-FRAMES_PER_STEP:]
        if len(self.frames) > FRAMES_KEPT:
            del self.frames[next(iter(self.frames))]

    def beat(self, rank: int, step: int, last_beat: float, age_s: float, stopped: bool) -> None:
        """A reading of rank ``rank``'s heartbeat while it was or is stale (``age_s``
        over ``FREEZE_MIN_S``, as its agent read it; ``last_beat``: when it last beat),
        in step ``step`` (the one in progress), ``stopped`` by a signal or not. A freeze
        that ends with the rank never seen stopped is an occurrence (``froze``): how
        long the heartbeat was stale, where its hook sampled that step if it did."""
        open_ = self.freezing.get(rank)
        if age_s > FREEZE_MIN_S:
            if open_ is None or last_beat > open_.last_beat + FREEZE_MIN_S:  # (a new freeze: the old one ended unseen)
                self.freezing[rank] = _Freezing(step, last_beat, stopped)
            elif stopped and not open_.stopped:
                self.freezing[rank] = open_._replace(stopped=True)
            return
        if open_ is None:
            return
        del self.freezing[rank]
        if not open_.stopped and last_beat > open_.last_beat:
            self.froze.append(Occurrence(rank, open_.step, last_beat - open_.last_beat, FREEZE_WHERE))

    def lost(self, rank: int) -> None:
        """Rank ``rank`` died or exited: a freeze it was in did not end by itself."""
        self.freezing.pop(rank, None)

    def add(self, step: SplitStep, cost_s: float | None = None) -> None:
        """``cost_s``: the job's wall time the step took beyond a typical one (the
        others' wait: what a periodic stall costs; its excess_s when not given)."""
        self.steps.append(step)
        own = step.data_s <= 0.5 * step.excess_s  # its own work, not its loader (Stalling.on_data)
        if own and step.excess_s > 0.0 and step.excess_s >= EVENT_SHARE * step.step_s:
            frames = self.frames.get((step.rank, step.step))
            if frames:
                cost = step.excess_s if cost_s is None else cost_s
                self.framed.append(_occurrence(step.rank, step.step, cost, frames))

    def pause(self, step: int, cost_s: float, ranks: Sequence[int]) -> None:
        """Step ``step`` held the job ``cost_s`` beyond a train step while ``ranks``
        (not all of them) were in a checkpoint or eval phase."""
        for r in ranks:
            self.pauses.append(Occurrence(r, step, cost_s, PAUSE_WHERE))

    def clear(self) -> None:
        """A restart: the steps of the job before it say nothing of the new ranks."""
        self.steps.clear()
        self.pauses.clear()
        self.framed.clear()
        self.frames.clear()
        self.froze.clear()
        self.freezing.clear()


class _Freezing(NamedTuple):
    step: int
    last_beat: float
    stopped: bool


def _occurrence(rank: int, step: int, cost_s: float, frames: Sequence[str]) -> Occurrence:
    """An unmarked stall whose step's hook sampled ``frames`` (oldest first): where the
    most of them were (the newest such on a tie), with the lines sampled there."""
    keys = [frame_key(f) for f in frames]
    where = max(reversed(keys), key=keys.count)  # max keeps the first of equals: the newest
    mine = [f for f, k in zip(frames, keys) if k == where]
    lines = sorted({line for f in mine if (line := frame_line(f)) is not None})
    return Occurrence(rank, step, cost_s, where, mine[-1], tuple(lines))


def stall_events(steps: Sequence[SplitStep]) -> list[SplitStep]:
    """The steps in which one rank's own work held the others a large part of the step."""
    return [s for s in steps if s.excess_s > 0.0 and s.excess_s >= EVENT_SHARE * s.step_s]


def periodic(stalls: Stalls) -> list[Pattern]:
    """The periodic patterns of the pauses noted (a rank in a checkpoint or eval
    phase alone, marked or opened by the hook from its eval forwards), of the
    unmarked stalls whose frame the rank's hook sampled (a metrics upload, a log
    flush), and of the heartbeat freezes that ended by themselves (a call holding
    the GIL), on a schedule. An unmarked stall without a frame stays the
    straggler's evidence even when regular: without where the rank was, nothing
    says it is its own work rather than a neighbour's cron job. A freeze's step
    is the freeze's pattern, not also a frame's (its frame, sampled after the
    GIL came back, says where that step was)."""
    froze = _froze(stalls)
    steps = {(o.rank, o.step) for o in froze}
    framed = [o for o in stalls.framed if (o.rank, o.step) not in steps]
    return patterns(stalls.pauses) + patterns(framed) + patterns(froze)


def _froze(stalls: Stalls) -> list[Occurrence]:
    """The freezes, each with the newest frame its step's hook sampled (after the freeze, if at all)."""
    return [replace(o, frame=stalls.frames.get((o.rank, o.step), ("",))[-1]) for o in stalls.froze]


def expected_steps(stalls: Stalls) -> frozenset[tuple[int, int]]:
    """(rank, step) of the unmarked stalls and freezes that are a periodic
    pattern's: the periodic_stall advisory's, no straggler's evidence."""
    out: set[tuple[int, int]] = set()
    for seen in (stalls.framed, stalls.froze):
        found = {(p.rank, p.where) for p in patterns(seen)}
        out.update((o.rank, o.step) for o in seen if (o.rank, o.where) in found)
    return frozenset(out)


def expected_s(stalls: Stalls, rank: int, frame: str) -> float | None:
    """How long a stall of ``rank`` in ``frame`` may last before it is more than
    the ones seen there before (the longest, with a margin), or None: none seen.
    There means the same function, at a line within ``LINE_SLACK`` of the lines
    sampled in it during those stalls: a stall elsewhere in a big function (a
    script's ``main``) is not the one seen before. One occurrence is enough: the
    first may be named (nothing was known yet), a recurrence that lasts no longer
    is expected."""
    key, line = frame_key(frame), frame_line(frame)
    seen = [o for o in stalls.framed if o.rank == rank and o.where == key]
    lines = [x for o in seen for x in o.lines]
    if line is not None and lines and not min(lines) - LINE_SLACK <= line <= max(lines) + LINE_SLACK:
        return None
    return EXPECTED_FACTOR * max(o.cost_s for o in seen) + EXPECTED_MARGIN_S if seen else None


def expected_freeze_s(stalls: Stalls, rank: int) -> float | None:
    """How long a heartbeat freeze of running ``rank`` may last before it is more
    than the ones it ended by itself before (the longest, with a margin), or None:
    none seen. By rank, not by place: its hook cannot sample where it is while
    its heartbeat is frozen."""
    seen = [o.cost_s for o in stalls.froze if o.rank == rank]
    return EXPECTED_FACTOR * max(seen) + EXPECTED_MARGIN_S if seen else None


@dataclass(frozen=True)
class Stalling:
    """A rank that stalls; ``on_data``: mostly waiting on its loader (else its compute)."""

    rank: int
    events: tuple[int, ...]  # the step numbers of its stalls
    excess_s: float  # their work over the median, summed
    data_s: float  # of which its data wait over the median's
    share: float  # excess_s over the wall time of the steps noted
    stalls: int  # stalls of any rank in the steps noted
    first_step: int  # the steps noted
    last_step: int
    wall_s: float  # their wall time
    odds: float  # the chance the ranks' stalls would give some rank as many

    @property
    def on_data(self) -> bool:
        return self.data_s > 0.5 * self.excess_s

    @property
    def every(self) -> float:
        """Steps from one stall to the next, on average."""
        return (self.events[-1] - self.events[0]) / (len(self.events) - 1) if len(self.events) > 1 else 0.0

    def onset(self, now: float) -> float:
        """When its first stall noted began, about (the steps' wall time since)."""
        return now - self.wall_s * (self.last_step - self.events[0] + 1) / (self.last_step - self.first_step + 1)


def stalling(steps: Sequence[SplitStep], window_steps: int, windows: int) -> list[Stalling]:
    """The ranks stalling over ``steps`` (see the module), in rank order."""
    if not steps:
        return []
    wall = sum(s.step_s for s in steps)
    events = stall_events(steps)
    if len(events) < MIN_EVENTS or wall <= 0.0:
        return []
    by_rank: dict[int, list[SplitStep]] = {}
    for s in events:
        by_rank.setdefault(s.rank, []).append(s)
    ranks = max(2, min(s.ranks for s in steps))  # the fewest that shared the steps: the least significant
    out = []
    for rank, own in sorted(by_rank.items()):
        if len(own) < MIN_EVENTS or len({s.step // window_steps for s in own}) < max(MIN_EVENTS, windows):
            continue
        since = own[0].step
        if len(own) > INTERMITTENT * sum(1 for s in steps if s.step >= since):
            continue
        excess = sum(s.excess_s for s in own)
        if excess < MIN_SHARE * wall:
            continue
        odds = min(1.0, ranks * _tail(len(events), len(own), 1.0 / ranks))
        if len(own) < MAJORITY * len(events) or odds > SIGNIFICANCE:
            continue
        out.append(
            Stalling(
                rank=rank,
                events=tuple(s.step for s in own),
                excess_s=excess,
                data_s=sum(s.data_s for s in own),
                share=excess / wall,
                stalls=len(events),
                first_step=steps[0].step,
                last_step=steps[-1].step,
                wall_s=wall,
                odds=odds,
            )
        )
    return out


def findings(
    kind: str,
    stalls: Stalls | None,
    now: float,
    view: ClusterView,
    cfg: DetectorConfig,
    on_data: bool,
    named: set[int],
    reason: Callable[[Stalling, FoldedRank], str],
) -> list[Finding]:
    """Findings of ``kind`` (``reason`` says why) for the stalling ranks live and
    training now, not ``named`` already, whose stalls are mostly data wait
    (``on_data``: loader_starvation's) or mostly compute (the straggler
    detector's). A rank gone since is another detector's."""
    if stalls is None:
        return []
    steps: Sequence[SplitStep] = stalls.steps
    expected = expected_steps(stalls) if stalls.framed or stalls.froze else frozenset()
    if expected:
        steps = [s for s in steps if (s.rank, s.step) not in expected]
    out = []
    for st in stalling(steps, cfg.straggler_window_steps, cfg.straggler_windows):
        rv = view.ranks.get(st.rank)
        if st.on_data != on_data or st.rank in named or rv is None:
            continue
        if rv.state.alive and rv.state.status == "running":
            out.append(
                Finding(
                    kind=kind,
                    ranks=(st.rank,),
                    hosts=(rv.host,),
                    detected_mono=now,
                    onset_mono=st.onset(now),
                    reason=reason(st, rv),
                    evidence={
                        "scope": "stalls",
                        "stall_steps": list(st.events),
                        "stall_excess_s": round(st.excess_s, 6),
                        "stall_data_s": round(st.data_s, 6),
                        "cost_share": round(st.share, 4),
                        "stalls_all_ranks": st.stalls,
                        "chance": st.odds,
                        "first_step": st.first_step,
                        "last_step": st.last_step,
                        "cpu_percent": rv.state.cpu_percent,
                    },
                )
            )
    return out


def _tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return math.fsum(math.comb(n, i) * p**i * (1.0 - p) ** (n - i) for i in range(k, n + 1))
