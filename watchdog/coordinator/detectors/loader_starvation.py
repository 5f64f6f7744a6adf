"""loader_starvation: ranks spending more than ``starvation_share`` of their step
time waiting on the data iterator, over the last ``starvation_window_steps``.

One rank (or a few) starving points at that rank's loader or host; (nearly) all
ranks starving means the input pipeline itself is the bottleneck, and adding
training workers will not help. The share leaves out the top 10% of steps by data
wait, so one slow first batch of an epoch (workers starting) is not starvation,
while a loader that stalls every few steps still is. A rank's first steps are not
in its history at all (view warm-up). A loader that stalls now and then (once
in 25 steps, for a second) is named from the goodput ledger's steps instead
(analysis/intermittent_stalls.py), as the straggler detector names a rank whose compute does.

A few ranks are named alone only when each waits at least ``ALONE_RATIO`` times as long as
the median other rank. Ranks whose loaders all wait (a tokenizing collate, workers sharing a
busy host's CPUs) wait a little more or less than each other: in a CI run a healthy Hugging
Face Trainer job's rank 1 waited 20% of its steps against rank 0's 13%, on a host whose CPUs
the test workers shared. That is the host or the pipeline, not one loader the others wait for.
The same job beside 3 and 6 busy processes on 2 cores: shares of 0.08-0.18 over 24-step
windows, one rank's at most 1.5x the other's. A starving loader waits several times what a
healthy one does (a loader that keeps up waits almost nothing).
"""

from __future__ import annotations

from ...contracts.finding import Finding, ranks_phrase, seconds
from ...stepstats.stats import median
from ..analysis import intermittent_stalls as stalls
from ..analysis.health import OK, classify_all
from ..analysis.intermittent_stalls import Stalling, Stalls
from ..config import DetectorConfig
from ..view import columns
from ..view.cluster import ClusterView, FoldedRank

ALL_RANKS_SHARE = 0.75  # this share of ranks starving = the pipeline, not one loader
ALONE_RATIO = 2.0  # a rank named alone waits on data at least this many times the median other rank


class LoaderStarvation:
    name = "loader_starvation"

    def __init__(self, cfg: DetectorConfig, stalls: Stalls | None = None) -> None:
        self.cfg = cfg
        # The train steps the goodput ledger split, for the ranks whose loader stalls now and
        # then (analysis/intermittent_stalls.py): the coordinator gives its ledger's; None (a detector alone) names none.
        self.stalls = stalls

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        found = self._starving(now, view)
        named = {r for f in found for r in f.ranks}
        return found + stalls.findings(self.name, self.stalls, now, view, self.cfg, True, named, _stall_reason)

    def _starving(self, now: float, view: ClusterView) -> list[Finding]:
        cfg = self.cfg
        # Shares are computed when reports are folded (view/cluster.py), not per tick; read as columns.
        c = columns.of(view)
        if not c.data_share or not max(c.data_share) > cfg.starvation_share:
            return []  # no rank, live or not, is over the share: nobody starves (one scan in C, most ticks)
        health = classify_all(view, now, cfg)
        least = cfg.starvation_min_steps
        shares = {
            r: share
            for r, steps, share in zip(c.rank, c.train_steps, c.data_share)
            if steps >= least and health[r] == OK
        }
        if any(h == OK and r not in shares for r, h in health.items()):
            return []  # judge "one loader or all" only once every live rank has enough steps
        return self.judge(now, view, shares)

    def judge(self, now: float, view: ClusterView, shares: dict[int, float]) -> list[Finding]:
        """The finding, from the data-wait share of every live rank with enough steps."""
        cfg = self.cfg
        starving = sorted(r for r, s in shares.items() if s > cfg.starvation_share)
        if not starving:
            return []
        named = set(starving)  # (a list here made an input-bound 16,384-rank job quadratic)
        rest = [s for r, s in shares.items() if r not in named]
        everyone = len(shares) >= 2 and len(starving) >= ALL_RANKS_SHARE * len(shares)
        if rest and not everyone:
            bar = ALONE_RATIO * median(rest)
            starving = [r for r in starving if shares[r] >= bar]
            if not starving:
                return []  # the over-threshold ranks wait about as the others do: no one loader to name
        rvs = [view.ranks[r] for r in starving]
        hosts = tuple(sorted({rv.host for rv in rvs}))
        share = median([shares[r] for r in starving])
        n = max(view.ranks[r].train_steps for r in starving)
        onset = now - max(sum(x.step_s for x in view.ranks[r].history[-n:]) for r in starving)
        evidence = {
            "shares": {str(r): round(shares[r], 4) for r in starving},
            "threshold": cfg.starvation_share,
            "window_steps": n,
            "others_median_share": round(median(rest), 4) if rest else None,
        }
        if everyone:
            reason = (
                f"{ranks_phrase(starving)} ({len(starving)} of {len(shares)}) wait on data {share:.0%} of step time "
                f"over the last {n} steps: the input pipeline is the bottleneck; more training workers will not "
                "help, fix the loader (decode cost, storage, worker count)"
            )
            evidence["scope"] = "all"
        else:
            rv = rvs[0]
            step = rv.history[-1].step_s if rv.history else 0.0
            others = f"others {median(rest):.0%}" if rest else "no other rank to compare"
            verb = "waits" if len(starving) == 1 else "wait"
            reason = (
                f"{ranks_phrase(starving)} on host {', '.join(hosts)} {verb} on data {share:.0%} of step time over "
                f"the last {n} steps ({others}; step {seconds(step)}): that loader or host is the bottleneck "
                "(check its CPU, disk and num_workers); the other ranks wait for it in the all-reduce"
            )
            evidence["scope"] = "ranks"
        return [
            Finding(
                kind=self.name,
                ranks=tuple(starving),
                hosts=hosts,
                onset_mono=onset,
                detected_mono=now,
                reason=reason,
                evidence=evidence,
            )
        ]


def _stall_reason(st: Stalling, rv: FoldedRank) -> str:
    return (
        f"rank {st.rank} on host {rv.host}: its loader stalls: {len(st.events)} times over steps "
        f"{st.first_step}-{st.last_step} (about every {st.every:.0f} steps) it waited "
        f"{seconds(st.data_s / len(st.events))} on data beyond the median rank's while the others waited for it, "
        f"costing {st.share:.0%} of the job's time (a shard opened from cold storage, a worker restarted "
        "or blocked: its loader's stack during a stall shows which)"
    )
