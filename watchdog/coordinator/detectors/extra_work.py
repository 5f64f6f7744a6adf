"""extra_work: rank 0 slower than its peers by work it does alone (advisory).

Scripts log, print, sync a loss (``loss.item()``) or write metrics on rank 0
alone, every step; a Hugging Face ``Trainer`` logging every step to TensorBoard
has rank 0 compute 1.6x its peer's. It is real and it costs, but nothing is
broken: this says it once, with the cost, and never pages or acts. It is the
straggler detector's slow rank 0 (over its threshold, costing enough) whose host
leaves it its CPU (``slowcause.lone_work``), or whose compute stalls now and then
while the others wait (analysis/intermittent_stalls.py: a log flush, a metrics upload); rank 0 on a
starved core is a slow host, the straggler's finding.

The scores are the straggler detector's (the coordinator hands it over, as the
goodput ledger's stalls to the detectors that read them); a detector alone names none.
"""

from __future__ import annotations

from ...contracts.finding import Finding, seconds
from ..analysis import slowcause
from ..analysis.intermittent_stalls import Stalling
from ..config import DetectorConfig
from ..view.cluster import ClusterView, FoldedRank
from .phrases import who
from .straggler import Straggler


class ExtraWork:
    name = "extra_work"

    def __init__(self, cfg: DetectorConfig, straggler: Straggler | None = None) -> None:
        self.cfg = cfg
        self.straggler = straggler

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        if self.straggler is None:
            return []
        slow = [(r, sc, cost) for r, sc, cost in self.straggler.slow(now, view) if r == slowcause.LONE_WORKER]
        out = self._slow(now, view, slow) if slow else []
        if out or slowcause.LONE_WORKER not in view.ranks:
            return out
        others = set(view.ranks) - {slowcause.LONE_WORKER}
        stalling = self.straggler.stalling(self.name, now, view, others, _stall_reason)
        cont = self.straggler.contention(view) if stalling else None
        return [f for f in stalling if cont is not None and slowcause.lone_work(f.ranks[0], cont.get(f.ranks[0]))]

    def _slow(self, now: float, view: ClusterView, slow: list[tuple[int, dict, float]]) -> list[Finding]:
        cont = self.straggler.contention(view) if self.straggler is not None else None
        out = []
        for r, sc, cost in slow:
            c = cont.get(r) if cont is not None else None
            if not slowcause.lone_work(r, c):
                continue
            rv = view.ranks[r]
            extra = sc["compute_s"] - sc["baseline_s"]
            host = f"; it {c.describe()}, so it is not its host" if c is not None else ""
            out.append(
                Finding(
                    kind=self.name,
                    ranks=(r,),
                    hosts=(rv.host,),
                    detected_mono=now,
                    onset_mono=now - (sc["last_step"] - sc["first_step"] + 1) * sc["step_s"],
                    reason=(
                        f"{who(rv)} computes {sc['factor']:.2f}x the median of the other ranks over steps "
                        f"{sc['first_step']}-{sc['last_step']} ({seconds(extra)} more a step), costing {cost:.0%} of "
                        f"the job's time ({cost * 60:.0f} s a minute): work it does alone each step (logging, metrics, "
                        f"a loss.item() sync; its stack shows which){host}. Do it every N steps or off the step"
                    ),
                    evidence={
                        "factor": round(sc["factor"], 4),
                        "compute_s": sc["compute_s"],
                        "baseline_s": sc["baseline_s"],
                        "step_s": sc["step_s"],
                        "cost_share": round(cost, 4),
                        "cpu_percent": rv.state.cpu_percent,
                        "first_step": sc["first_step"],
                        "last_step": sc["last_step"],
                        **(c.evidence() if c is not None else {}),
                    },
                )
            )
        return out


def _stall_reason(st: Stalling, rv: FoldedRank) -> str:
    return (
        f"{who(rv)} stalls alone: {len(st.events)} times over steps {st.first_step}-{st.last_step} (about every "
        f"{st.every:.0f} steps) its compute ran {seconds(st.excess_s / len(st.events))} over the median rank's "
        f"while the others waited, costing {st.share:.0%} of the job's time: work it does alone now and then "
        "(a log flush, metrics, a save), not its host (its stack during a stall shows which)"
    )
