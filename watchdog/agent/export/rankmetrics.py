"""Per-rank, per-host and per-job metric families from the tracker's views: a pure
function of (views, host, now, detail), wrapped in a one-method collector.

At ``summary`` detail (``--metrics.rank-detail``) a host exports the per-rank
series of only the ranks worth a look: every rank that is not alive and running
(dead, stopped, exited: what the rank alerts fire on), every rank whose heartbeat
went stale (frozen with its process running), and the ``slowest`` ranks by their
last step's compute (where a straggler shows). A 16,384-rank job on
2,048 hosts is ~504,000 per-rank and host series at full detail (29 a rank, 14
a host); at summary with the slowest one per host and every rank healthy,
~88,000 (docs/benchmarks.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import Metric

from watchdog.agent.export import metrics as m
from watchdog.agent.slotfiles import slot_states
from watchdog.agent.slotfiles.local_rank import LocalRank
from watchdog.contracts import slot as wire


def step_split_s(h: wire.SlotHeader, step: int, data: int, coll: int) -> tuple[float, float, float]:
    """(data, collective, compute) seconds from header words holding ns: compute is
    what is left, clamped at 0, so the three always add up to max(step, data+coll)."""
    d, c = h[data] / 1e9, h[coll] / 1e9
    return d, c, max(0.0, h[step] / 1e9 - d - c)


FULL, SUMMARY = "full", "summary"
DETAILS = (FULL, SUMMARY)


def _compute_s(v: LocalRank) -> float:
    return step_split_s(v.header, wire.H_LAST_STEP_NS, wire.H_LAST_DATA_NS, wire.H_LAST_COLL_NS)[2]


def _running(v: LocalRank) -> bool:
    return v.state == slot_states.ALIVE and v.proc.alive and not v.proc.stopped


# A heartbeat older than this keeps the rank's series at summary detail: the hook
# beats every 0.5 s, and RankWatchdogRankFrozen (30 s) needs the series to exist
# long before it fires for a rank frozen with its process running (a native call
# holding the GIL), which is neither stopped nor, often, the host's slowest.
STALE_HEARTBEAT_S = 5.0


def shown(views: Sequence[LocalRank], detail: str = FULL, slowest: int = 1, now_ns: int = 0) -> list[LocalRank]:
    """The ranks whose per-rank series are exported, in their order."""
    if detail == FULL:
        return list(views)
    running = [v for v in views if _running(v)]
    keep = {id(v) for v in sorted(running, key=_compute_s, reverse=True)[:slowest]}
    keep |= {id(v) for v in running if slot_states.age_s(now_ns, v.heartbeat_ns) > STALE_HEARTBEAT_S}
    return [v for v in views if id(v) in keep or not _running(v)]


def host_families(views: Sequence[LocalRank], host: str, now_ns: int) -> list[Metric]:
    """Per job on this host: rank counts by state, summed step counters, and the
    extremes a dashboard or an alert looks for (least/most advanced step, oldest
    heartbeat, longest collective wait, slowest compute)."""
    fams = {s: s.family() for s in m.HOST_SPECS}
    by_job: dict[str, list[LocalRank]] = {}
    for v in views:
        by_job.setdefault(v.identity.job, []).append(v)
    for job, vs in by_job.items():
        lab = [job, host]
        states = dict.fromkeys(m.HOST_RANK_STATES, 0)
        for v in vs:
            if v.state == slot_states.EXITED:
                states["exited"] += 1
            elif not v.proc.alive:
                states["dead"] += 1
            elif v.proc.stopped:
                states["stopped"] += 1
            else:
                states["alive"] += 1
        for state, n in states.items():
            fams[m.HOST_RANKS].add_metric(lab + [state], n)
        fams[m.HOST_STEPS].add_metric(lab, sum(v.header[wire.H_STEP] for v in vs))
        totals = [step_split_s(v.header, wire.H_TOTAL_STEP_NS, wire.H_TOTAL_DATA_NS, wire.H_TOTAL_COLL_NS) for v in vs]
        for i, part in enumerate(m.PARTS):
            fams[m.HOST_PART_TOTAL].add_metric(lab + [part], sum(t[i] for t in totals))
        steps = [v.header[wire.H_STEP] for v in vs]
        fams[m.HOST_STEP_MIN].add_metric(lab, min(steps))
        fams[m.HOST_STEP_MAX].add_metric(lab, max(steps))
        live = [v for v in vs if v.proc.alive and v.state != slot_states.EXITED]
        hb = max((slot_states.age_s(now_ns, v.heartbeat_ns) for v in live), default=0.0)
        fams[m.HOST_HEARTBEAT_AGE_MAX].add_metric(lab, hb)
        coll = [slot_states.age_s(now_ns, v.header[wire.H_COLL_ENTER_NS]) for v in vs if v.header.in_collective]
        fams[m.HOST_COLL_AGE_MAX].add_metric(lab, max(coll, default=0.0))
        fams[m.HOST_LAST_COMPUTE_MAX].add_metric(lab, max((_compute_s(v) for v in vs), default=0.0))
    return list(fams.values())


def declared_world(views: Sequence[LocalRank]) -> dict[str, int]:
    """Per job on this host, the world size its newest incarnation declares: the
    newest slot of a rank whose process lives (stopped too), else the newest slot.
    After an elastic resize the retired ranks' slots (exited, or killed by the
    launcher) stay until they expire, still declaring the old size."""
    newest: dict[str, tuple[bool, int, int]] = {}
    for v in views:
        key = (v.state == slot_states.ALIVE and v.proc.alive, v.header.created_wall_ns, v.identity.world_size)
        job = v.identity.job
        if job not in newest or key > newest[job]:
            newest[job] = key
    return {job: size for job, (_, _, size) in newest.items()}


def rank_families(
    views: Sequence[LocalRank], host: str, now_ns: int, detail: str = FULL, slowest: int = 1
) -> list[Metric]:
    fams = {s: s.family() for s in (*m.RANK_SPECS, *m.OPTIONAL_SPECS)}
    world = m.JOB_WORLD_SIZE.family()
    for job, size in declared_world(views).items():
        world.add_metric([job, host], size)
    for v in shown(views, detail, slowest, now_ns):
        h, ident = v.header, v.identity
        lab = [ident.job, str(ident.rank), str(ident.local_rank), host]

        def put(spec: m.Spec, value: float, *extra: str, lab: list[str] = lab) -> None:
            fams[spec].add_metric(lab + list(extra), value)

        put(m.RANK_ALIVE, float(v.proc.alive))
        put(m.RANK_STOPPED, float(v.proc.stopped))
        put(m.RANK_EXITED, float(v.state == slot_states.EXITED))
        put(m.RANK_HEARTBEAT_AGE, slot_states.age_s(now_ns, v.heartbeat_ns))
        put(m.RANK_STEPS, h[wire.H_STEP])
        put(m.RANK_STEP, h[wire.H_STEP])
        put(m.RANK_STEP_AGE, slot_states.age_s(now_ns, h[wire.H_STEP_START_NS]))
        put(m.RANK_LAST_STEP, h[wire.H_LAST_STEP_NS] / 1e9)
        put(m.RANK_WINDOW_STEP, slot_states.window_mean_s(v.step_records))
        last = step_split_s(h, wire.H_LAST_STEP_NS, wire.H_LAST_DATA_NS, wire.H_LAST_COLL_NS)
        total = step_split_s(h, wire.H_TOTAL_STEP_NS, wire.H_TOTAL_DATA_NS, wire.H_TOTAL_COLL_NS)
        for part, lv, tv in zip(m.PARTS, last, total):
            put(m.RANK_LAST_PART, lv, part)
            put(m.RANK_PART_TOTAL, tv, part)
        phase = slot_states.label(wire.Phase, h[wire.H_PHASE], "other")
        for p in m.PHASES:
            put(m.RANK_PHASE, float(p == phase), p)
        put(m.RANK_IN_DATA, float(h.in_data_wait))
        put(m.RANK_IN_COLL, float(h.in_collective))
        put(m.RANK_COLL_SEQ, h[wire.H_COLL_SEQ])
        put(m.RANK_COLL_AGE, slot_states.age_s(now_ns, h[wire.H_COLL_ENTER_NS]) if h.in_collective else 0.0)
        put(m.RANK_PG_JOINED, float(h[wire.H_PG_STATE] == wire.PgState.JOINED))
        put(m.RANK_COLL_BYTES, h[wire.H_TOTAL_COLL_BYTES])
        if h[wire.H_BATCH_PER_RANK] > 0:
            put(m.RANK_BATCH, h[wire.H_BATCH_PER_RANK])
        for part, word in zip(m.MODEL_PARTS, wire.SPLIT_WORDS):
            if h[word] > 0:  # measured: an older hook, or no watch_model, leaves it 0
                put(m.RANK_MODEL_PART, h[word] / 1e9, part)
        if v.gpu_clock:  # a completion source split steps on the accelerator's clock
            step_ns, data_ns, coll_ns = v.gpu_totals_ns
            gpu = (data_ns / 1e9, coll_ns / 1e9, max(0, step_ns - data_ns - coll_ns) / 1e9)
            for part, value in zip(m.PARTS, gpu):
                put(m.RANK_GPU_PART_TOTAL, value, v.gpu_clock, part)
        put(m.RANK_HOOK_ERRORS, h[wire.H_HOOK_ERRORS])
        put(m.RANK_CPU, v.proc.cpu_seconds)
        put(m.RANK_RSS, v.proc.rss_bytes)
    return [*fams.values(), world, *host_families(views, host, now_ns)]


class RanksCollector:
    name = "ranks"

    def __init__(
        self,
        views: Callable[[], Iterable[LocalRank]],
        host: str,
        clock: Callable[[], int] = time.monotonic_ns,
        *,
        detail: str = FULL,
        slowest: int = 1,
    ) -> None:
        if detail not in DETAILS:
            raise ValueError(f"rank detail must be one of {DETAILS}, not {detail!r}")
        self._views, self._host, self._clock = views, host, clock
        self._detail, self._slowest = detail, slowest

    def collect(self) -> list[Metric]:
        return rank_families(tuple(self._views()), self._host, self._clock(), self._detail, self._slowest)
