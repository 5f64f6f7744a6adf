"""Per-rank and per-job metric families from the tracker's views: a pure function
of (views, host, now), wrapped in a one-method collector."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import Metric

from watchdog import wire
from watchdog.agent import metrics as m
from watchdog.agent import track
from watchdog.agent.slots import LocalRank


def step_split_s(h: wire.SlotHeader, step: int, data: int, coll: int) -> tuple[float, float, float]:
    """(data, collective, compute) seconds from header words holding ns: compute is
    what is left, clamped at 0, so the three always add up to max(step, data+coll)."""
    d, c = h[data] / 1e9, h[coll] / 1e9
    return d, c, max(0.0, h[step] / 1e9 - d - c)


def rank_families(views: Sequence[LocalRank], host: str, now_ns: int) -> list[Metric]:
    fams = {s: s.family() for s in (*m.RANK_SPECS, *m.OPTIONAL_SPECS)}
    world = m.JOB_WORLD_SIZE.family()
    seen_jobs: set[str] = set()
    for v in views:
        h, ident = v.header, v.identity
        lab = [ident.job, str(ident.rank), str(ident.local_rank), host]

        def put(spec: m.Spec, value: float, *extra: str, lab: list[str] = lab) -> None:
            fams[spec].add_metric(lab + list(extra), value)

        put(m.RANK_ALIVE, float(v.proc.alive))
        put(m.RANK_STOPPED, float(v.proc.stopped))
        put(m.RANK_EXITED, float(v.state == track.EXITED))
        put(m.RANK_HEARTBEAT_AGE, track.age_s(now_ns, v.heartbeat_ns))
        put(m.RANK_STEPS, h[wire.H_STEP])
        put(m.RANK_STEP, h[wire.H_STEP])
        put(m.RANK_STEP_AGE, track.age_s(now_ns, h[wire.H_STEP_START_NS]))
        put(m.RANK_LAST_STEP, h[wire.H_LAST_STEP_NS] / 1e9)
        put(m.RANK_WINDOW_STEP, track.window_mean_s(v.step_records))
        last = step_split_s(h, wire.H_LAST_STEP_NS, wire.H_LAST_DATA_NS, wire.H_LAST_COLL_NS)
        total = step_split_s(h, wire.H_TOTAL_STEP_NS, wire.H_TOTAL_DATA_NS, wire.H_TOTAL_COLL_NS)
        for part, lv, tv in zip(m.PARTS, last, total):
            put(m.RANK_LAST_PART, lv, part)
            put(m.RANK_PART_TOTAL, tv, part)
        phase = track.label(wire.Phase, h[wire.H_PHASE], "other")
        for p in m.PHASES:
            put(m.RANK_PHASE, float(p == phase), p)
        put(m.RANK_IN_DATA, float(h.in_data_wait))
        put(m.RANK_IN_COLL, float(h.in_collective))
        put(m.RANK_COLL_SEQ, h[wire.H_COLL_SEQ])
        put(m.RANK_COLL_AGE, track.age_s(now_ns, h[wire.H_COLL_ENTER_NS]) if h.in_collective else 0.0)
        put(m.RANK_PG_JOINED, float(h[wire.H_PG_STATE] == wire.PgState.JOINED))
        put(m.RANK_COLL_BYTES, h[wire.H_TOTAL_COLL_BYTES])
        if h[wire.H_BATCH_PER_RANK] > 0:
            put(m.RANK_BATCH, h[wire.H_BATCH_PER_RANK])
        for part, word in zip(m.MODEL_PARTS, wire.SPLIT_WORDS):
            if h[word] > 0:  # measured: an older hook, or no watch_model, leaves it 0
                put(m.RANK_MODEL_PART, h[word] / 1e9, part)
        put(m.RANK_HOOK_ERRORS, h[wire.H_HOOK_ERRORS])
        put(m.RANK_CPU, v.proc.cpu_seconds)
        put(m.RANK_RSS, v.proc.rss_bytes)
        if ident.job not in seen_jobs:
            seen_jobs.add(ident.job)
            world.add_metric([ident.job, host], ident.world_size)
    return [*fams.values(), world]


class RanksCollector:
    name = "ranks"

    def __init__(
        self, views: Callable[[], Iterable[LocalRank]], host: str, clock: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self._views, self._host, self._clock = views, host, clock

    def collect(self) -> list[Metric]:
        return rank_families(tuple(self._views()), self._host, self._clock())
