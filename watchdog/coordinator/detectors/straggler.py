"""straggler: a rank whose compute is consistently slower than the others'.

In synchronous training every rank's wall step time is the same (the fast ones
wait in the all-reduce), so only compute time (step - data wait - collective
wait) can tell the slow rank. Each rank's compute is summarised per window of
``straggler_window_steps`` train steps (trimmed mean, robust to a GC pause) when
the view folds reports; here each rank's last ``straggler_windows`` windows are
compared with the median of the other ranks' same windows. It fires when the slowdown over
all those windows passes a threshold and every single window is slower than
the others (``straggler_window_factor``: sustained, not one burst).

The threshold adapts to the job's noise: 1 + ``straggler_sigmas`` x the larger of
estimates of the score's noise, and never below ``straggler_factor``: the
per-step spread scaled to K windows (what independent jitter gives), and the
window-to-window spread of the factor / sqrt(K), the median over ranks and the
rank's own (what bursts of contention on a shared host give: they hit a rank
for a window or two, never every window alike as a straggler is slow), and the
rank's own per-step spread (pauses that struck it more than others by chance). With 8
ranks and +-10% iid jitter the 80-step score wanders with sigma ~0.007, giving
a threshold ~1.034: healthy ranks stay ~4.7 sigma below it (none fired in 40
simulated 10k-step runs), a 1.05x rank is ~2 sigma above it and is found in
80-90 steps. Fewer ranks or noisier steps raise the threshold instead of firing.
The score is tested again on every window close, so over a long job its tail
counts, and a mean of steps that pause at random has a heavier one than its
estimated sigma says: at 4 sigmas, healthy jobs of 5,000 steps whose ranks
paused at random had a rank named (benchmarks/straggler_false.py); the default
is 4.5, at which stragglers of 1.05-1.2x were named at the same median step.
The cost it reports is the share of job time lost: the job runs at the slowest
rank, so (slow - median) / step time.

A slow rank is reported only when it costs enough (``slowcause.costs_enough``: a
millisecond a step and 2% of the job's time), and rank 0 slower while its host
leaves it its CPU is work it does alone, the ``extra_work`` advisory's
(``slowcause.lone_work``). Compute cannot tell the slow rank where the hook sees
no collective wait (DDP's reducer issues its all-reduce from C++, a framework's
process group it missed): every rank's step is then equal. A rank whose host
takes its CPU (run-queue contention, ``slowcause.starved``) is named from that,
by the agents' schedstat reads, whatever its steps say. Where the other ranks
themselves wait for a CPU two-thirds as long as they run, neither names anyone
(``slowcause.cannot_tell``): the host's load, not the rank, decides who is slower;
unless the slow rank barely waits for a CPU itself (a sleep, a GPU, not the host).

At scale the scores are brought up to date over a few ticks (``Scorer.advance``:
~40 ms of the work a tick, none on the verdict's turn), so a finding can come a
few ticks later; it only ever names a rank that is live on the tick it is made.
"""

from __future__ import annotations

import heapq
import weakref
from collections.abc import Callable

from ...contracts.finding import Finding, seconds
from ..analysis import intermittent_stalls as stalls
from ..analysis import slowcause
from ..analysis.health import quiet_hosts
from ..analysis.intermittent_stalls import Stalling, Stalls
from ..analysis.slowcause import Contention, Contentions
from ..config import DetectorConfig
from ..metrics import STRAGGLER_SCORE, GaugeValues
from ..view.cluster import ClusterView, FoldedRank
from .phrases import who
from .straggler_scores import TICK_BUDGET_S, Scorer, Scores

GAUGE_RANKS = 64  # straggler-score series exported: the slowest ranks (and every rank named)


class Straggler:
    name = "straggler"

    def __init__(
        self,
        cfg: DetectorConfig,
        tick_budget_s: float | None = TICK_BUDGET_S,
        stalls: Stalls | None = None,
        hold: Callable[[int], bool] | None = None,
    ) -> None:
        self.cfg = cfg
        # Derived from one scores answer, which stays the answer between window
        # closings (most ticks): at 16,384 ranks sorting and filtering every rank's
        # score, and the gauge's 16,384 labels, cost ~0.4 s a tick under cProfile.
        # One entry each, keyed on the answer object (held, so its id is not reused).
        self._flagged: tuple[Scores, list[int]] | None = None
        self._gauge: tuple[Scores, GaugeValues] | None = None
        self.scorer = Scorer(cfg, tick_budget_s)
        # Whether a tick of a job of so many ranks is another heavy part's (the verdict's turn,
        # cadence.py; the coordinator's): the scores stay the last answer and no rescoring step runs on it.
        self.hold = hold
        # check and gauges ask for one tick's. The view is held by a weak reference: the
        # last holder of the previous tick's view pays for freeing it (~0.1 s of
        # deallocation at 16,384 ranks), which is not this detector's work.
        self._last: tuple[weakref.ref[ClusterView], float, Scores] | None = None
        # The train steps the goodput ledger split, for the ranks that stall now and then
        # (analysis/intermittent_stalls.py): the coordinator gives its ledger's; None (a detector alone) names none.
        self.stalls = stalls
        self._contention: tuple[weakref.ref[ClusterView], Contentions] | None = None

    def scores(self, now: float, view: ClusterView) -> Scores:
        """The scores as of this tick: a rescoring is spread over ticks at scale
        (``Scorer.advance``), so they can be a few ticks behind the view."""
        if self._last is None or self._last[0]() is not view or self._last[1] != now:
            self._last = (weakref.ref(view), now, self.scorer.scores(view, now, hold=self._held(view)))
        return self._last[2]

    def _held(self, view: ClusterView) -> bool:
        return self.hold is not None and self.hold(len(view.ranks))

    def gauges(self, now: float, view: ClusterView) -> GaugeValues:
        """The slowdown factor of the ``GAUGE_RANKS`` slowest scored ranks (and of
        every rank named), by rank label; the same mapping object while the scores
        are (the exporter skips an unchanged one). One series per rank of a
        16,384-rank job was most of the coordinator's /metrics, and its dashboard
        panel shows the top 10."""
        sc = self.scores(now, view)
        if self._gauge is None or self._gauge[0] is not sc:
            factors = sc.factors
            top = heapq.nlargest(GAUGE_RANKS, factors, key=factors.__getitem__)
            shown = sorted({*top, *self.flagged(sc)})
            self._gauge = (sc, {STRAGGLER_SCORE: {str(r): round(factors[r], 4) for r in shown}})
        return self._gauge[1]

    def flagged(self, sc: Scores) -> list[int]:
        """The ranks over their threshold and slower in every window, in rank order."""
        if self._flagged is None or self._flagged[0] is not sc:
            limit, floor = self.cfg.straggler_window_factor, self.cfg.straggler_factor
            # A threshold is never below straggler_factor (max(straggler_factor, ...)): only
            # the ranks with a factor at or above it need their dict built.
            ranks = sorted(
                r
                for r, f in sc.factors.items()
                if f >= floor and f >= (s := sc[r])["threshold"] and min(s["window_factors"]) > limit
            )
            self._flagged = (sc, ranks)
        return self._flagged[1]

    def slow(self, now: float, view: ClusterView) -> list[tuple[int, dict, float]]:
        """The ranks over their threshold, live, and costing enough to report: (rank,
        its scores, the share of the job's time it costs), in rank order. Both the
        findings and the ``extra_work`` advisory are drawn from these."""
        out = []
        all_scores = self.scores(now, view)
        live = self.scorer.live  # (scores a few ticks old: a rank may have died since)
        flagged = [r for r in self.flagged(all_scores) if r in live]
        cont = self.contention(view) if flagged else None
        for r in flagged:
            sc = all_scores[r]
            extra = max(0.0, sc["compute_s"] - sc["baseline_s"])
            cost = extra / sc["step_s"] if sc["step_s"] > 0 else 0.0
            if slowcause.costs_enough(extra, cost, slowcause.noise_floor_s(cont.get(r) if cont is not None else None)):
                out.append((r, sc, cost))
        return out

    def contention(self, view: ClusterView) -> Contentions:
        """``slowcause.contention`` of this view, worked out once for the detectors that ask."""
        if self._contention is None or self._contention[0]() is not view:
            self._contention = (weakref.ref(view), slowcause.contention(view))
        return self._contention[1]

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        out = []
        slow = self.slow(now, view)
        as_of = self.scorer.as_of  # of the scores just brought up to date
        cont = self.contention(view)
        for r, sc, cost in slow:
            c, rv = cont.get(r), view.ranks[r]
            if slowcause.lone_work(r, c) or cont.cannot_tell(r, cost, rv.state.cpu_percent / 100):
                continue  # the extra_work advisory's; or the host's load, which compute cannot tell from it
            steps = sc["last_step"] - sc["first_step"] + 1
            host = f"; it {c.describe()}: its host takes its CPU" if c is not None and c.starved else ""
            out.append(
                Finding(
                    kind=self.name,
                    ranks=(r,),
                    hosts=(rv.host,),
                    detected_mono=now,
                    onset_mono=now - steps * sc["step_s"],
                    reason=(
                        f"{who(rv)} computes {sc['factor']:.2f}x slower than the median of the other ranks over steps "
                        f"{sc['first_step']}-{sc['last_step']} ({seconds(sc['compute_s'])} vs {seconds(sc['baseline_s'])} "
                        f"per step); the job runs at its pace, costing {cost:.0%} of step time{host}"
                    ),
                    evidence={
                        "factor": round(sc["factor"], 4),
                        "threshold": round(sc["threshold"], 4),
                        "sigma_steps": round(sc["sigma_steps"], 5),
                        "sigma_windows": round(sc["sigma_windows"], 5),
                        "window_factors": [round(x, 4) for x in sc["window_factors"]],
                        "compute_s": sc["compute_s"],
                        "baseline_s": sc["baseline_s"],
                        "step_s": sc["step_s"],
                        "cost_share": round(cost, 4),
                        "cpu_percent": rv.state.cpu_percent,
                        "clock": rv.split_clock,
                        "first_step": sc["first_step"],
                        "last_step": sc["last_step"],
                        # how old the windows behind the scores were (a rescoring spans ticks at scale)
                        "scores_age_s": round(now - as_of, 3) if as_of is not None else 0.0,
                        **(c.evidence() if c is not None else {}),
                    },
                )
            )
        named = {f.ranks[0] for f in out}
        starved = [c for c in cont.starved() if c.rank not in named]
        if starved:
            # A wait for a CPU is a reading of now: on a host that missed its reports it is
            # what the rank was doing then, and the monitor cannot see it now.
            quiet = quiet_hosts(view, now)
            out += [self._starved(now, view, c) for c in starved if view.ranks[c.rank].host not in quiet]
        return out + self._stalling(now, view, {f.ranks[0] for f in out})

    def _starved(self, now: float, view: ClusterView, c: Contention) -> Finding:
        """A rank whose host takes its CPU: its compute need not look slower (all
        ranks' steps are equal where the hook sees no collective wait)."""
        rv = view.ranks[c.rank]
        return Finding(
            kind=self.name,
            ranks=(c.rank,),
            hosts=(rv.host,),
            detected_mono=now,
            onset_mono=now,
            reason=(
                f"{who(rv)} {c.describe()}: other processes on its core or host take its CPU, and the job waits "
                f"for it, up to {c.excess_s * 60:.0f} s a minute (run-queue wait, /proc schedstat)"
            ),
            evidence={**c.evidence(), "cpu_percent": rv.state.cpu_percent, "oncpu_share": rv.state.oncpu_share},
        )

    def _stalling(self, now: float, view: ClusterView, named: set[int]) -> list[Finding]:
        """The ranks whose compute stalls now and then (analysis/intermittent_stalls.py), not ``named`` already;
        rank 0's own stalls (its host leaving it its CPU) are the ``extra_work`` advisory's."""
        found = self.stalling(self.name, now, view, named, _stall_reason)
        cont = self.contention(view) if found else None
        return [
            f
            for f in found
            if cont is None
            or not (slowcause.lone_work(f.ranks[0], cont.get(f.ranks[0])) or cont.cannot_tell(f.ranks[0]))
        ]

    def stalling(
        self, kind: str, now: float, view: ClusterView, named: set[int], reason: Callable[[Stalling, FoldedRank], str]
    ) -> list[Finding]:
        """Findings of ``kind`` for the ranks whose compute stalls now and then
        (analysis/intermittent_stalls.py), not ``named``, by more each stall than the scheduler's noise
        (``slowcause.noise_floor_s``)."""
        found = stalls.findings(kind, self.stalls, now, view, self.cfg, False, named, reason)
        if not found:
            return found
        cont = self.contention(view)
        return [
            f
            for f in found
            if f.evidence["stall_excess_s"] / len(f.evidence["stall_steps"])
            >= slowcause.noise_floor_s(cont.get(f.ranks[0]))
        ]


def _stall_reason(st: Stalling, rv: FoldedRank) -> str:
    return (
        f"{who(rv)} stalls: {len(st.events)} times over steps {st.first_step}-{st.last_step} (about every "
        f"{st.every:.0f} steps) its compute ran {seconds(st.excess_s / len(st.events))} over the median rank's "
        f"while the others waited, costing {st.share:.0%} of the job's time (a save, eval or log on this rank "
        "alone, a periodic job or neighbour on its host, a long garbage collection: its stack during a stall "
        "shows which)"
    )
