"""The job's bottleneck, live: what limits each step, with the numbers behind it.

Distributed training relieves a memory constraint or a time constraint; before
adding workers a team should know which one it hits and where each step goes.
The hook already splits every step into data wait, collective wait and compute;
this turns the split into one verdict per job:

- ``data``: the ranks wait on their loaders a large share of each step. More
  workers multiply the starvation: fix the input pipeline.
- ``communication``: the least-waiting rank still spends a large share of its
  step in collectives (that rank's wait is communication itself, not waiting for
  a slower peer).
- ``straggler``: one rank's own work (compute, or its loader's wait) is well
  above the median, and the job runs at its pace: (slowest - median) / step
  time is what it costs.
- ``memory``: accelerator memory near full (shard, checkpoint activations).
- ``compute``: none of the above: the job spends its time computing (healthy).

Pure: ``measure(now, view)`` reads the view, ``decide(state, m, now)`` applies
hysteresis (a cause must lead for ``CONFIRM`` evaluations before the verdict
is given or changes, and the current one holds until its share falls below ``EXIT`` of its
threshold), so the verdict moves only when the evidence does. Never a finding:
it explains performance, it does not page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import add, attrgetter, itemgetter, sub
from typing import Any, NamedTuple

from ...contracts.finding import seconds
from ...stepstats import stats
from ...stepstats.stats import median
from ..analysis.health import OK, classify_all
from ..config import DetectorConfig
from ..view import columns
from ..view.cluster import ClusterView, StepSample
from ..vocabularies import VERDICTS

# One name per verdict, in the vocabulary's order (the metrics label by the same values).
DATA, COMMUNICATION, STRAGGLER, MEMORY, COMPUTE, UNKNOWN = VERDICTS
CAUSES = (DATA, COMMUNICATION, STRAGGLER)  # time lost per step, as a share of step time

# Shares of step time (memory: share of accelerator memory) at which a cause is the verdict.
THRESHOLDS = {DATA: 0.20, COMMUNICATION: 0.30, STRAGGLER: 0.08, MEMORY: 0.90}  # one per VERDICT_SHARES
EXIT = 0.75  # the current verdict holds until its share falls below 75% of its threshold
CONFIRM = 3  # evaluations a new leader must lead before the verdict changes
WINDOW_STEPS = 50  # recent train steps per rank the shares are measured over
MIN_STEPS = 20  # fewer than this on some live rank: "unknown" (as loader_starvation; 10 steps of jitter misled)
NOISE_SIGMAS = 3.0  # a straggler's extra work must stand this many standard errors above its own jitter
_DEFAULTS = DetectorConfig()
FINER = ("forward_s", "backward_s", "optimizer_s", "h2d_s")  # StepSample's finer split of compute


@dataclass(frozen=True)
class Measure:
    """What the recent steps say: shares of step time, and the evidence."""

    shares: dict[str, float]  # cause -> share (memory: used / total of the fullest accelerator)
    evidence: dict[str, Any]
    ready: bool  # every live rank has MIN_STEPS steps


@dataclass(frozen=True)
class Verdict:
    verdict: str = UNKNOWN
    since: float = 0.0
    reason: str = "not enough steps yet"
    evidence: dict[str, Any] = field(default_factory=dict, compare=False)
    leader: str = UNKNOWN  # a challenger, and for how many evaluations in a row it could have replaced the verdict
    leading: int = 0


class Summary(NamedTuple):
    """One rank's recent train steps: mean seconds of step, data, collective and
    compute, the clipped mean of its own work (compute + data) and that mean's
    standard error, mean collective bytes per step, and the mean forward,
    backward, optimizer and host-to-device seconds over the steps that measured
    them (None when none did)."""

    step: float
    data: float
    coll: float
    compute: float
    own: float
    noise: float
    bytes_per_step: float
    finer: tuple[float, ...] | None


_STEP, _DATA, _COLL, _BYTES = (attrgetter(k) for k in ("step_s", "data_s", "coll_s", "coll_bytes"))
_FINER = attrgetter(*FINER)
_FINER_EACH = tuple(attrgetter(k) for k in FINER)
_PHASE = attrgetter("phase")


def summarize(history: tuple[StepSample, ...]) -> Summary | None:
    """One rank's recent train steps, summarised; None under MIN_STEPS of them.

    Field by field through C-level ``map``: at 16,384 ranks this runs for up to
    2,048 ranks a tick (``Summaries``); the arithmetic, and so every float, is
    the one the plain loops gave (tests/test_coord_verdict_summaries.py)."""
    tail = history[-WINDOW_STEPS:]
    xs: Sequence[StepSample]
    if list(map(_PHASE, tail)).count("train") == WINDOW_STEPS:
        xs = tail  # the usual case: the last WINDOW_STEPS steps all trained
    else:
        tail = history[-2 * WINDOW_STEPS :]  # the last WINDOW_STEPS train steps are here unless phases interleave
        xs = [x for x in tail if x.phase == "train"]
        if len(xs) < WINDOW_STEPS and len(tail) < len(history):
            xs = [x for x in history if x.phase == "train"]
        xs = xs[-WINDOW_STEPS:]
    n = len(xs)
    if n < MIN_STEPS:
        return None
    step = list(map(_STEP, xs))
    data = list(map(_DATA, xs))
    coll = list(map(_COLL, xs))
    compute = list(map(sub, map(sub, step, data), coll))  # StepSample.compute_s: s - d - c, not below 0
    if min(compute) < 0.0:
        compute = [max(0.0, c) for c in compute]
    # One-off spikes (a GC pause, a first-iteration rebuild) are clipped: a straggler is slow every step.
    own, spread = stats.clipped_mean_stdev(list(map(add, compute, data)))
    finer = None
    if any(any(map(get, xs)) for get in _FINER_EACH):  # most jobs measure no finer split: 4 C-level scans
        split = [f for f in map(_FINER, xs) if any(f)]
        finer = tuple(sum(col) / len(split) for col in zip(*split))
    return Summary(
        sum(step) / n,
        sum(data) / n,
        sum(coll) / n,
        sum(compute) / n,
        own,
        spread / math.sqrt(n),
        sum(map(_BYTES, xs)) / n,
        finer,
    )


class Summaries:
    """Each rank's ``summarize``, kept between ticks. A rank's history changes with
    every report that carries a step, so at 16,384 ranks summarising every rank
    every tick was the tick's largest cost (5 s per tick measured in-process);
    this refreshes at most ``budget`` changed ranks a run, the longest-waiting
    first, and keeps the others' last summary: at 16,384 ranks each summary is at
    most 16 runs old (the verdict runs every 4th tick there, ``cadence.py``:
    ~64 s). The verdict is advisory and has hysteresis, so this lag is all it
    costs; up to ``exact_up_to`` ranks it is exact. (1,024:
    a summary costs ~30 us, so ~30 ms of a tick; 2,048 was ~60-100 ms of the
    100 ms a tick may take at 16,384 ranks, docs/benchmarks.md.)

    Above ``exact_up_to`` ranks a run refreshes at most one ``spread``-th of them
    (within ``budget``), so each changed rank's summary is at most ``spread`` runs
    old: from 1,024 to 4,096 ranks the verdict runs every tick (``cadence.py``)
    and refreshing every rank on each was ~80% of the tick (1,024 ranks: 167 ms
    p50 on one VM). A rank never summarised is summarised at once (within
    ``budget``): a verdict waits for every rank."""

    def __init__(self, budget: int = 1024, exact_up_to: int = 128, spread: int = 8) -> None:
        self.budget = budget
        self.exact_up_to = exact_up_to
        self.spread = spread
        self._cache: dict[int, tuple[tuple[StepSample, ...], Summary | None, int]] = {}
        self._tick = 0
        self._cursor = 0  # where the round robin over the ranks goes on next tick

    def get(self, view: ClusterView, ranks: list[int]) -> dict[int, Summary | None]:
        self._tick += 1
        cache, left = self._cache, self.budget
        c = columns.of(view)
        history = dict(zip(c.rank, c.history))  # each rank's (split clock's) history, without its objects
        # Never summarised first (a dict probe each, no rank object read), then round
        # robin from where the last tick stopped: the longest-waiting first when every
        # rank changes every tick (16,384 ranks reporting once a second), without
        # reading all 16,384 ranks' histories to find the stale ones and sorting them.
        for r in [r for r in ranks if r not in cache][:left]:
            hist = history[r]
            cache[r] = (hist, summarize(hist), self._tick)
            left -= 1
        n = len(ranks)
        if n > self.exact_up_to:
            left = min(left, max(self.exact_up_to, -(-n // self.spread)))
        if left > 0 and n:
            start, i = self._cursor % n, 0
            while i < n and left > 0:
                r = ranks[(start + i) % n]
                i += 1
                hist = history[r]
                hit = cache.get(r)
                if hit is None or hit[0] is not hist:
                    cache[r] = (hist, summarize(hist), self._tick)
                    left -= 1
            self._cursor = start + i
        if len(cache) > 2 * len(view.ranks) + 64:  # ranks gone from the view (never the ones asked for)
            for r in [r for r in cache if r not in view.ranks]:
                del cache[r]
        return {r: cache[r][1] if r in cache else None for r in ranks}  # None: not summarised yet


def measure(
    now: float, view: ClusterView, cfg: DetectorConfig = _DEFAULTS, summaries: Summaries | None = None
) -> Measure:
    """``summaries``: the coordinator's ``Summaries`` (kept between ticks); without
    one, every live rank is summarised now."""
    health = classify_all(view, now, cfg)
    live = [r for r, h in health.items() if h == OK]  # health is in the view's rank order
    got = summaries.get(view, live) if summaries is not None else {r: summarize(view.ranks[r].history) for r in live}
    # Column by column (C-level map over the summaries): at 16,384 ranks a loop
    # filling five dicts a rank cost more than the medians.
    per_rank = {r: sm for r, sm in got.items() if sm is not None}  # rank -> its summary
    ready = len(per_rank) == len(live)
    mem = _memory(view)
    shares = {DATA: 0.0, COMMUNICATION: 0.0, STRAGGLER: 0.0, MEMORY: mem[0]}
    evidence: dict[str, Any] = {"ranks": len(per_rank), "world_size": view.world_size}
    if mem[0] > 0:
        evidence.update(memory_share=round(mem[0], 4), memory_host=mem[1])
    if not per_rank:
        return Measure(shares, evidence, False)
    vals = list(per_rank.values())
    steps, datas, colls, computes, owns, noises, sent = (list(map(itemgetter(i), vals)) for i in range(7))
    finer = [f for f in map(itemgetter(7), vals) if f is not None]  # mean forward, backward, optimizer, h2d
    step = median(steps)
    med_compute = median(computes)
    med_data = median(datas)
    # The rank the others wait for: its own work (compute, and its loader's wait) is
    # the longest (the first such rank, as ``max`` over the ranks in order).
    i = owns.index(max(owns))
    slow = list(per_rank)[i]
    extra_data = max(0.0, datas[i] - med_data)
    # A rank that computes longer makes the others wait in the all-reduce; the rank
    # that waits least there shows what communication itself costs.
    coll_shares = [c / s for s, c in zip(steps, colls) if s > 0]
    if step > 0:
        shares[DATA] = median([d / s for s, d in zip(steps, datas) if s > 0])
        shares[COMMUNICATION] = min(coll_shares) if coll_shares else 0.0
        extra = owns[i] - median(owns)
        if len(per_rank) > 1 and extra > NOISE_SIGMAS * noises[i]:  # jitter's luck is not a straggler
            shares[STRAGGLER] = extra / step
    per_step_bytes = median(sent)
    evidence.update(
        step_s=round(step, 6),
        compute_s=round(med_compute, 6),
        data_s=round(med_data, 6),
        coll_s=round(median(colls), 6),
        data_share=round(shares[DATA], 4),
        coll_share=round(shares[COMMUNICATION], 4),
        straggler_share=round(shares[STRAGGLER], 4),
        slowest_rank=slow,
        slowest_compute_s=round(computes[i], 6),
        slowest_factor=round(computes[i] / med_compute, 4) if med_compute > 0 else None,
        slowest_extra_data_s=round(extra_data, 6),
        # Bytes per step against compute per step: what the communication costs
        # for the work it synchronises (the last collective alone says little:
        # a step may issue many, of any size).
        bytes_per_step=int(per_step_bytes),
        bytes_per_compute_s=int(per_step_bytes / med_compute) if med_compute > 0 else None,
    )
    c = columns.of(view)
    clocks = set(c.split_clock)  # every rank's: one clock is then every summarised rank's clock too
    if len(clocks) > 1:
        clock = dict(zip(c.rank, c.split_clock))
        clocks = set(map(clock.__getitem__, per_rank))
    evidence["clock"] = clocks.pop() if len(clocks) == 1 else "mixed"  # the clock the split came from
    if finer:  # the finer split (mon.watch_model), median over the ranks that measure it
        evidence["split"] = {k: round(median([v[j] for v in finer]), 6) for j, k in enumerate(FINER)}
        evidence["split_ranks"] = len(finer)
    return Measure(shares, evidence, ready)


def split_line(evidence: dict[str, Any]) -> str:
    """The finer split of a step's compute in words ("" when no rank measures it)."""
    split = evidence.get("split")
    if not isinstance(split, dict):
        return ""
    f, b, o, h = (_fine(float(split.get(k) or 0.0)) for k in FINER)
    return (
        f"model split per step: forward {f}, backward {b} (from forward's end to the optimizer step: the loss, "
        f"backward and any collective wait there), optimizer {o}, host-to-device {h} "
        f"(median of {evidence.get('split_ranks', '?')} ranks)"
    )


def _fine(s: float) -> str:
    """Seconds, with the sub-millisecond parts a forward or a copy often takes."""
    return f"{s * 1000:.2f} ms" if s < 0.01 else seconds(s)


def megabytes(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _memory(view: ClusterView) -> tuple[float, str]:
    best, where = 0.0, ""
    for host, hv in view.hosts.items():
        for acc in hv.accelerators:
            used, total = acc.get("mem_used_bytes"), acc.get("mem_total_bytes")
            if isinstance(used, (int, float)) and isinstance(total, (int, float)) and total > 0 and used / total > best:
                best, where = used / total, host
    return best, where


def leader(m: Measure) -> str:
    """The cause with the largest share over its threshold; memory when no time
    is lost; compute when nothing stands out."""
    if not m.ready:
        return UNKNOWN
    over = {c: m.shares[c] for c in CAUSES if m.shares[c] >= THRESHOLDS[c]}
    if over:
        return max(over, key=lambda c: over[c] / THRESHOLDS[c])
    return MEMORY if m.shares[MEMORY] >= THRESHOLDS[MEMORY] else COMPUTE


def decide(state: Verdict, m: Measure, now: float) -> Verdict:
    """Hysteresis: the verdict changes once another leader has been ready to
    replace it for CONFIRM evaluations in a row; the current one holds while its
    own share stays above EXIT of its threshold (unless the leader's is larger)."""
    new = leader(m)
    cur = state.verdict
    # Too few steps to judge (the job ended, ranks restarting) is no evidence against the verdict.
    keep = cur == new or new == UNKNOWN
    if not keep and cur in THRESHOLDS and m.ready:
        still = m.shares[cur] >= EXIT * THRESHOLDS[cur]
        stronger = new in THRESHOLDS and m.shares[new] / THRESHOLDS[new] > m.shares[cur] / THRESHOLDS[cur]
        keep = still and not stronger
    if keep:
        return Verdict(cur, state.since, reason(cur, m) if m.ready else state.reason, m.evidence, cur, 0)
    leading = state.leading + 1 if new == state.leader else 1
    if leading < CONFIRM:
        return Verdict(cur, state.since, reason(cur, m) if m.ready else state.reason, m.evidence, new, leading)
    return Verdict(new, now, reason(new, m), m.evidence, new, 0)


def reason(verdict: str, m: Measure) -> str:
    text = _reason(verdict, m)
    clock = m.evidence.get("clock")
    if verdict in (COMMUNICATION, STRAGGLER, COMPUTE) and clock in ("gpu", "mixed"):
        # Which clock the split came from: the accelerator's completions, not the hook's CPU marks.
        text += " (split on the GPU clock" + (" for some ranks only)" if clock == "mixed" else ")")
    return text


def _reason(verdict: str, m: Measure) -> str:
    e, s = m.evidence, m.shares
    step = seconds(e.get("step_s", 0.0))
    if verdict == DATA:
        return (
            f"data-bound: {s[DATA]:.0%} of each {step} step waits on the loader; more workers multiply the "
            "starvation: fix the input pipeline (loader workers, prefetch, storage)"
        )
    if verdict == COMMUNICATION:
        per_step = e.get("bytes_per_step", 0)
        rate = e.get("bytes_per_compute_s")
        moved = (
            f"{megabytes(per_step)} per step against {seconds(e.get('compute_s', 0.0))} of compute"
            + (f" ({megabytes(rate)} per compute-second)" if rate else "")
            if per_step
            else f"{seconds(e.get('coll_s', 0.0))} in collectives vs {seconds(e.get('compute_s', 0.0))} compute"
        )
        return (
            f"communication-bound: {s[COMMUNICATION]:.0%} of each {step} step is spent in collectives even on the "
            f"rank that waits least; {moved}: fewer, larger buckets, overlap, gradient compression or a faster "
            "interconnect before more workers"
        )
    if verdict == STRAGGLER and e.get("slowest_extra_data_s", 0.0) > e.get("slowest_compute_s", 0.0) - e.get(
        "compute_s", 0.0
    ):
        return (
            f"straggler-bound: rank {e.get('slowest_rank')} waits {seconds(e.get('slowest_extra_data_s', 0.0))} longer "
            f"on its loader per step than the median rank, and every rank waits for it in the all-reduce, costing "
            f"{s[STRAGGLER]:.0%} of every step: that rank's loader or host (CPU, disk, num_workers)"
        )
    if verdict == STRAGGLER:
        return (
            f"straggler-bound: rank {e.get('slowest_rank')} computes {e.get('slowest_factor') or 0:.2f}x the median "
            f"({seconds(e.get('slowest_compute_s', 0.0))} vs {seconds(e.get('compute_s', 0.0))}); the job runs at its "
            f"pace, costing {s[STRAGGLER]:.0%} of every step"
        )
    if verdict == MEMORY:
        return (
            f"memory-bound: accelerator memory {s[MEMORY]:.0%} full on {e.get('memory_host')}: sharding "
            "(FSDP/ZeRO) or activation checkpointing before a larger batch or model"
        )
    if verdict == COMPUTE:
        return (
            f"compute-bound (healthy): data wait {s[DATA]:.0%}, collectives {s[COMMUNICATION]:.0%}, straggler "
            f"{s[STRAGGLER]:.0%} of a {step} step"
        )
    return "not enough steps yet"
