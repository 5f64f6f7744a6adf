"""periodic_stall: one rank holds the job up at a regular step interval (advisory).

Real scripts evaluate, checkpoint, upload metrics or flush logs on one rank
every N steps while the others wait: a pause (a phase the script marked, the
hook's ``torch.save`` phase, or the eval phase the hook opens from eval-mode
forwards), or an unmarked stall in a frame of the script the rank's hook
sampled (hook/frames.py). Once it has recurred at the same interval it is
expected, and a page for it would be noise. This says it once, naming the rank,
the period, the cost and where it was ("rank 0 holds the job ~6 s every 1,000
steps in estimate_loss (train.py:41): mark it or raise the allowance").
Advisory: the policy never acts on it and no alert pages for it. Its unmarked
stalls are no straggler's evidence; unmarked stalls without a frame stay the
straggler detector's (analysis/intermittent_stalls.py says why).

The occurrences come from the goodput ledger (the coordinator hands its
``Stalls`` over, as to the straggler detector); a detector alone names none.
"""

from __future__ import annotations

from ...contracts.finding import Finding
from ..analysis.intermittent_stalls import Stalls, periodic
from ..config import DetectorConfig
from ..view.cluster import ClusterView


class PeriodicStall:
    name = "periodic_stall"

    def __init__(self, cfg: DetectorConfig, stalls: Stalls | None = None) -> None:
        self.cfg = cfg
        self.stalls = stalls

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        if self.stalls is None:
            return []
        out = []
        for p in periodic(self.stalls):
            rv = view.ranks.get(p.rank)
            if rv is None:
                continue
            out.append(
                Finding(
                    kind=self.name,
                    ranks=(p.rank,),
                    hosts=(rv.host,),
                    reason=p.describe(),
                    onset_mono=now,
                    detected_mono=now,
                    evidence={
                        "period_steps": p.period,
                        "cost_s": round(p.cost_s, 3),
                        "where": p.where,
                        "frame": p.frame,
                        "occurrences": p.occurrences,
                        "first_step": p.first_step,
                        "last_step": p.last_step,
                    },
                )
            )
        return out
