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
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from ...contracts.finding import Finding
from .periodic import Occurrence, Pattern, frame_key, patterns

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
FRAMES_KEPT = 1024  # (rank, step) -> the frame its hook sampled in that step, newest
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
        self.frames: dict[tuple[int, int], str] = {}  # (rank, step) -> frame, insertion ordered

    def saw_frame(self, rank: int, step: int, frame: str) -> None:
        """Rank ``rank``'s hook sampled ``frame`` during step ``step`` (the newest sample wins)."""
        key = (rank, step)
        self.frames.pop(key, None)
        self.frames[key] = frame
        if len(self.frames) > FRAMES_KEPT:
            del self.frames[next(iter(self.frames))]

    def add(self, step: SplitStep, cost_s: float | None = None) -> None:
        """``cost_s``: the job's wall time the step took beyond a typical one (the
        others' wait: what a periodic stall costs; its excess_s when not given)."""
        self.steps.append(step)
        own = step.data_s <= 0.5 * step.excess_s  # its own work, not its loader (Stalling.on_data)
        if own and step.excess_s > 0.0 and step.excess_s >= EVENT_SHARE * step.step_s:
            frame = self.frames.get((step.rank, step.step))
            if frame:
                cost = step.excess_s if cost_s is None else cost_s
                self.framed.append(Occurrence(step.rank, step.step, cost, frame_key(frame), frame))

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


def stall_events(steps: Sequence[SplitStep]) -> list[SplitStep]:
    """The steps in which one rank's own work held the others a large part of the step."""
    return [s for s in steps if s.excess_s > 0.0 and s.excess_s >= EVENT_SHARE * s.step_s]


def periodic(stalls: Stalls) -> list[Pattern]:
    """The periodic patterns of the pauses noted (a rank in a checkpoint or eval
    phase alone, marked or opened by the hook from its eval forwards) and of the
    unmarked stalls whose frame the rank's hook sampled (a metrics upload, a log
    flush), on a schedule. An unmarked stall without a frame stays the
    straggler's evidence even when regular: without where the rank was, nothing
    says it is its own work rather than a neighbour's cron job."""
    return patterns(stalls.pauses) + patterns(stalls.framed)


def expected_steps(stalls: Stalls) -> frozenset[tuple[int, int]]:
    """(rank, step) of the unmarked stalls that are a periodic pattern's: the
    periodic_stall advisory's, no straggler's evidence."""
    found = {(p.rank, p.where) for p in patterns(stalls.framed)}
    return frozenset((o.rank, o.step) for o in stalls.framed if (o.rank, o.where) in found)


def expected_s(stalls: Stalls, rank: int, frame: str) -> float | None:
    """How long a stall of ``rank`` in ``frame`` may last before it is more than
    the ones seen there before (the longest, with a margin), or None: none seen.
    One occurrence is enough: the first may be named (nothing was known yet), a
    recurrence that lasts no longer is expected."""
    key = frame_key(frame)
    seen = [o.cost_s for o in stalls.framed if o.rank == rank and o.where == key]
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
    expected = expected_steps(stalls) if stalls.framed else frozenset()
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
