"""loss_anomaly: the training itself went wrong, on one rank or on all.

Only for scripts that pass their loss (``mon.step(loss=loss.item())``); ranks
that report none are neither judged nor witnesses.

- **Non-finite**: a rank's first NaN/inf loss (the hook keeps the first such
  step, so one between two reads is not missed). In data parallelism a NaN
  spreads to every rank through the next gradient all-reduce, so the root cause
  is the earliest bad step: the ranks whose first bad step is the earliest are
  the culprits *if* some other rank is a witness, i.e. reported a finite loss
  at that step or later. Then the fault is the culprits' own (their data, or
  their hardware: silent data corruption), and the finding names their hosts
  (``evidence.host_attributable``). Every rank bad at the same step: the model
  diverged; a finding with no culprit. A rank whose loss has not reached that
  step yet is waited for: blaming a rank a later report clears is worse than
  a late finding.
- **Spike**: a loss above a robust bound of the same rank's earlier losses
  (median + SPIKE_MADS x 1.4826 x MAD, and at least SPIKE_RATIO x the median),
  within the last SPIKE_RECENT samples (one per report: a spike stays visible
  for several ticks, long enough for the policy). On some ranks only: those are
  named, no host blamed (a bad batch is the likelier cause); on every rank
  reporting: a job-wide spike, no culprit.

The action for it is the policy's (``rollback_restart`` restarts from the last
checkpoint before the anomaly: actions/rollback_restart.py).
"""

from __future__ import annotations

import statistics

from ...contracts.finding import Finding, ranks_phrase
from ..config import DetectorConfig
from ..view import columns
from ..view.cluster import ClusterView, FoldedRank
from ..view.loss_screen import SPIKE_MADS, SPIKE_MIN_HISTORY, SPIKE_RATIO, SPIKE_RECENT


class LossAnomaly:
    name = "loss_anomaly"

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        # The view's columns first: at 16,384 ranks a pass over the ranks' objects (and
        # their histories) every tick is what this must not cost when nothing is wrong.
        c = columns.of(view)
        if not any(c.loss_step):
            return []  # no rank reports a loss (a job without a loss hook)
        unsettled = any(c.loss_bad_step) or not all(
            calm for calm, step in zip(c.loss_calm, c.loss_step) if step > 0
        )  # a non-finite loss, or a rank whose recent losses could hold a spike (view/loss_screen.py)
        if not unsettled:
            return []
        reporting = {r: view.ranks[r] for r, step in zip(c.rank, c.loss_step) if step > 0}
        found = self._nonfinite(now, reporting)
        return found if found else self._spikes(now, reporting)

    def _nonfinite(self, now: float, ranks: dict[int, FoldedRank]) -> list[Finding]:
        bad = {r: rv.state.loss_bad_step for r, rv in ranks.items() if rv.state.loss_bad_step > 0}
        if not bad:
            return []
        first = min(bad.values())
        culprits = tuple(sorted(r for r, s in bad.items() if s == first))
        others = [rv for r, rv in ranks.items() if r not in culprits]
        if any(rv.state.loss_step < first and rv.state.loss_bad_step == 0 for rv in others):
            return []  # a possible witness has not reached that step yet: wait for it
        witnesses = sorted(rv.rank for rv in others if rv.state.loss_bad_step == 0 or rv.state.loss_bad_step > first)
        rvs = [ranks[r] for r in culprits]
        onset = min(rv.received_at for rv in rvs)
        if not witnesses:
            return [
                Finding(
                    kind=self.name,
                    ranks=(),
                    hosts=(),
                    onset_mono=onset,
                    detected_mono=now,
                    reason=f"every rank reporting a loss got a NaN/inf loss at step {first}: the training "
                    f"diverged (no rank to blame)",
                    evidence={
                        "cause": "nonfinite",
                        "step": first,
                        "host_attributable": False,
                        "ranks_reporting": len(ranks),
                    },
                )
            ]
        hosts = tuple(sorted({rv.host for rv in rvs}))
        return [
            Finding(
                kind=self.name,
                ranks=culprits,
                hosts=hosts,
                onset_mono=onset,
                detected_mono=now,
                reason=f"{ranks_phrase(culprits)} on {', '.join(hosts)} got a NaN/inf loss at step {first} "
                f"while {ranks_phrase(witnesses)} had finite losses there: suspect silent data "
                f"corruption on {'that host' if len(hosts) == 1 else 'those hosts'}",
                evidence={
                    "cause": "nonfinite",
                    "step": first,
                    "host_attributable": True,
                    "witnesses": witnesses[:64],
                    "bad_count": {str(r): ranks[r].state.loss_bad_count for r in culprits[:16]},
                },
            )
        ]

    def _spikes(self, now: float, ranks: dict[int, FoldedRank]) -> list[Finding]:
        spiked: dict[int, tuple[int, float, float]] = {}
        judged = 0
        for r, rv in ranks.items():
            values = rv.loss_values
            n = len(values)
            if n < SPIKE_MIN_HISTORY + 1:
                continue
            judged += 1
            if rv.loss_calm:
                continue  # no sample here can pass its bound (view/loss_screen.py)
            for i in range(max(SPIKE_MIN_HISTORY, n - SPIKE_RECENT), n):
                base = values[:i]
                med = statistics.median(base)
                mad = statistics.median(abs(v - med) for v in base) * 1.4826
                bound = max(med + SPIKE_MADS * mad, med * SPIKE_RATIO if med > 0 else med + SPIKE_MADS * mad)
                if values[i] > bound:
                    spiked[r] = (rv.loss_steps[i], values[i], bound)
                    break
        if not spiked:
            return []
        culprits = tuple(sorted(spiked))
        first = min(s for s, _, _ in spiked.values())
        detail = "; ".join(
            f"rank {r} {v:.4g} at step {s} (bound {b:.4g})" for r, (s, v, b) in sorted(spiked.items())[:4]
        )
        evidence = {
            "cause": "spike",
            "step": first,
            "host_attributable": False,
            "spikes": {str(r): {"step": s, "loss": v, "bound": b} for r, (s, v, b) in sorted(spiked.items())[:16]},
        }
        onset = min(ranks[r].received_at for r in culprits)
        if (len(culprits) == judged and judged > 1) or len(ranks) == 1:
            return [
                Finding(
                    kind=self.name,
                    ranks=(),
                    hosts=(),
                    onset_mono=onset,
                    detected_mono=now,
                    evidence=evidence,
                    reason=f"loss spike on every rank from step {first}: {detail}",
                )
            ]
        return [
            Finding(
                kind=self.name,
                ranks=culprits,
                hosts=(),
                onset_mono=onset,
                detected_mono=now,
                evidence=evidence,
                reason=f"loss spike on {ranks_phrase(culprits)} only: {detail}",
            )
        ]
