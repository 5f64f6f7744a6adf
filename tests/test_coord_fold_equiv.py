"""The fold of a report into the view was made cheaper (one FoldedRank built per
rank per report, the loader-share window kept as floats): these tests hold it
to the code it replaced, copied below as it was (main at 22a7c05), on random
report streams that join, restart (newer and older incarnations), die and come
back, repeat, reorder and skip steps, send NaN and infinite durations, losses
(finite or not, repeated, spiking), Flight Recorder signatures and GPU-clock
steps, under random detector configurations. Every field of every FoldedRank is
compared by ``repr`` (so -0.0 is not 0.0, and NaN equals NaN), the StepStats'
derived fields too (``windows_scanned``, ``flat``, which history ``flat_of``
is), the hosts, the events, and the Folder's columns against the reference
view's."""

from __future__ import annotations

import math
import random
from array import array
from bisect import bisect_left, insort
from collections import deque
from dataclasses import replace
from math import floor
from operator import attrgetter, itemgetter
from typing import Any, cast

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.view import columns, loss_screen
from watchdog.coordinator.view.cluster import (
    _FOLDED_FIELDS,
    COLL_HISTORY,
    LOSS_HISTORY,
    ClusterView,
    FoldedRank,
    Folder,
    HostView,
    _already_folded,
    comparable,
    empty,
    fold,
    gpu_samples,
)
from watchdog.report import CollSig, GpuStep, HostReport, RankState, StepSample
from watchdog.stepstats.steps import (
    FLAT_SAMPLES,
    P99_SAMPLES,
    Steps,
    StepStats,
    _close_windows,
    _flat,
    _recomputed,
)

# -- the code before (main at 22a7c05): steps.add_samples and its _Running ------------------

_first, _third = itemgetter(0), itemgetter(2)


def ref_add_samples(st: StepStats, samples: tuple[StepSample, ...], cfg: DetectorConfig) -> StepStats:
    # Since the step summaries: a warm-up sample sent again is not counted twice (StepStats.unkept_step).
    last = st.history[-1].step if st.history else (st.unkept_step if st.unkept_step >= 0 else None)
    fresh = [x for x in samples if last is None or x.step > last]
    if not fresh:
        return st
    seen = st.steps_seen
    skip = max(0, cfg.warmup_steps - seen)
    new = fresh[skip:]
    seq = st.history + tuple(new)
    history = seq[-cfg.history_steps :]
    if not history:
        return replace(
            st,
            steps_seen=seen + len(fresh),
            history=history,
            flat=array("d"),
            flat_of=history,
            unkept_step=fresh[-1].step,
        )
    run = cast("_RefRunning | None", st.running)  # the reference's: it made every StepStats it is given
    if run is None or run.tip is not st.history or not run.fits(cfg):
        run = _RefRunning.build(st.history, cfg)
    if run is None or not run.extend(seq, len(st.history)):
        return _recomputed(st, history, seen + len(fresh), cfg)
    run.tip = history
    train_steps, share = run.data_share()
    windows, scanned = _close_windows(st.windows, st.windows_scanned, history, cfg)
    return StepStats(
        steps_seen=seen + len(fresh),
        history=history,
        windows=windows,
        p99_step_s=run.p99(),
        train_steps=train_steps,
        data_share=share,
        windows_scanned=scanned,
        running=run,  # type: ignore[arg-type]
        flat=_flat(st, new, min(FLAT_SAMPLES, cfg.history_steps)),
        flat_of=history,
    )


class _RefRunning:
    __slots__ = ("_cfg", "_n", "_p_len", "_p_sorted", "_s_cap", "_s_fifo", "_s_len", "_s_sorted", "tip")

    def __init__(self, cfg: DetectorConfig) -> None:
        self.tip: Steps | None = ()
        self._cfg = (cfg.history_steps, cfg.starvation_window_steps)
        self._n = 0
        self._p_len = min(P99_SAMPLES, cfg.history_steps)
        self._p_sorted: list[float] = []
        self._s_len = min(2 * cfg.starvation_window_steps, cfg.history_steps)
        self._s_cap = cfg.starvation_window_steps
        self._s_fifo: deque[tuple[float, int, float]] = deque()
        self._s_sorted: list[tuple[float, int, float]] = []

    def fits(self, cfg: DetectorConfig) -> bool:
        return self._cfg == (cfg.history_steps, cfg.starvation_window_steps)

    @classmethod
    def build(cls, history: Steps, cfg: DetectorConfig) -> _RefRunning | None:
        run = cls(cfg)
        if not run.extend(history[-max(run._p_len, run._s_len, 1) :] if history else (), 0):
            return None
        run.tip = history
        return run

    def extend(self, seq: tuple[StepSample, ...], start: int) -> bool:
        i = self._n
        p_len, p_sorted = self._p_len, self._p_sorted
        s_len, s_cap, s_fifo = self._s_len, self._s_cap, self._s_fifo
        train = self._s_sorted
        for pos in range(start, len(seq)):
            x = seq[pos]
            step_s, data_s = x.step_s, x.data_s
            if step_s - step_s != 0.0 or data_s - data_s != 0.0:
                self.tip = None
                return False
            if p_len:
                insort(p_sorted, step_s)
                if pos >= p_len:
                    del p_sorted[bisect_left(p_sorted, seq[pos - p_len].step_s)]
            if s_cap and x.phase == "train":
                entry = (data_s, i, step_s)
                insort(train, entry)
                s_fifo.append(entry)
            while s_fifo and (s_fifo[0][1] <= i - s_len or len(s_fifo) > s_cap):
                del train[bisect_left(train, s_fifo.popleft())]
            i += 1
        self._n = i
        return True

    def p99(self) -> float:
        items = self._p_sorted
        if not items:
            return 0.0
        pos = (len(items) - 1) * 0.99
        lo = floor(pos)
        hi = min(lo + 1, len(items) - 1)
        return items[lo] + (items[hi] - items[lo]) * (pos - lo)

    def data_share(self) -> tuple[int, float]:
        train = self._s_sorted
        n = len(train)
        if not n:
            return 0, 0.0
        keep = n - max(1, n // 10) or n
        kept = train[:keep]
        step = sum(map(_third, kept))
        return n, (sum(map(_first, kept)) / step if step > 0 else 0.0)


# -- the code before (main at 22a7c05): view._fold_into, _fold_rank and their helpers ---------

Event = tuple[str, dict[str, Any]]


def ref_fold_into(
    hosts: dict[str, HostView],
    ranks: dict[int, FoldedRank],
    world: int,
    world_fixed: bool,
    report: HostReport,
    now: float,
    cfg: DetectorConfig,
    events: list[Event],
) -> int:
    prev_host = hosts.get(report.host)
    if prev_host is None or prev_host.agent_id != report.agent_id:
        events.append(
            (
                je.HOST_SEEN,
                {
                    "host": report.host,
                    "agent_id": report.agent_id,
                    "agent_restarted": prev_host is not None,
                    "previous_agent_id": prev_host.agent_id if prev_host else None,
                },
            )
        )
    hosts[report.host] = HostView(
        host=report.host,
        agent_id=report.agent_id,
        seq=report.seq,
        interval_s=report.interval_s,
        received_at=now,
        first_seen=prev_host.first_seen if prev_host else now,
        sent_wall=report.sent_wall,
        ranks=tuple(r.rank for r in report.ranks),
        reports=(prev_host.reports + 1) if prev_host else 1,
        accelerators=report.accelerators,
    )
    for state in report.ranks:
        rv = ref_fold_rank(ranks.get(state.rank), state, report.host, now, cfg, events)
        if rv is not None:
            ranks[state.rank] = rv
        if not world_fixed:
            world = max(world, state.world_size)
    return world


def ref_fold_rank(
    prev: FoldedRank | None, s: RankState, host: str, now: float, cfg: DetectorConfig, events: list[Event]
) -> FoldedRank | None:
    replaced_death = None  # the replaced incarnation's death, kept for dead_rank's ordering
    if prev is not None and (s.pid != prev.state.pid or s.proc_start_us != prev.state.proc_start_us):
        if s.proc_start_us < prev.state.proc_start_us:
            return None
        events.append(
            (
                je.RANK_RESTARTED,
                {**_ident(s, host), "old_pid": prev.state.pid, "old_host": prev.host, "old_step": prev.state.step},
            )
        )
        replaced_death = prev.died_at
        prev = None
    elif prev is None:
        events.append(
            (
                je.RANK_JOINED,
                {**_ident(s, host), "world_size": s.world_size, "status": s.status, "pg_state": s.pg_state},
            )
        )
    step_start = now - s.step_age_s
    if prev is None:
        rv = FoldedRank(
            state=s,
            host=host,
            received_at=now,
            registered_at=now,
            progress_at=step_start,
            last_alive_at=now if s.alive else now - s.heartbeat_age_s,
            heartbeat_moved=s.step > 0 or s.heartbeat_age_s + 0.05 < s.step_age_s,
            previous_died_at=replaced_death,
        )
    else:
        old = prev.state
        if s.alive != old.alive or s.status != old.status or s.pg_state != old.pg_state:
            _state_changes(old, s, _ident(s, host), events)
        progress = max(prev.progress_at, step_start)
        c, pc = s.coll, old.coll
        if c.group != pc.group or c.seq != pc.seq or c.done_seq != pc.done_seq:
            progress = max(progress, prev.received_at)
        moved = prev.heartbeat_moved or (now - s.heartbeat_age_s) > prev.last_heartbeat() + 0.05
        beat = now - s.heartbeat_age_s  # a heartbeat that came back after a stop (analysis/wedge.py)
        gap = (
            prev.heartbeat_moved
            and prev.state.heartbeat_age_s > cfg.frozen_after_s(prev.state.proc_status, prev.state.step == 0)
            and beat > prev.last_heartbeat() + 0.05
        )
        changes: dict[str, Any] = {
            "state": s,
            "host": host,
            "received_at": now,
            "progress_at": progress,
            "last_alive_at": now if s.alive else prev.last_alive_at,
            "heartbeat_moved": moved,
            "resumed": (prev.last_heartbeat(), beat) if gap else prev.resumed,
        }
        if s.recent_steps:
            changes["step_stats"] = ref_add_samples(prev.step_stats, s.recent_steps, cfg)
        changes.update(_loss_changes(prev, s))
        rv = _updated(prev, changes)
    if not s.alive or rv.died_at is not None:
        rv = _death(rv, s, now)
    loss = _loss_changes(rv, s)
    if loss:
        rv = _updated(rv, loss)
    if s.recent_colls:
        colls = _fold_colls(rv.colls, s.recent_colls, now)
        coll_keys = tuple(((c.group, c.seq), comparable(c), at) for c, at in colls)
        rv = _updated(rv, {"colls": colls, "coll_keys": coll_keys})
    if prev is None and s.recent_steps:
        rv = _updated(rv, {"step_stats": ref_add_samples(rv.step_stats, s.recent_steps, cfg)})
    if s.recent_gpu:
        gst = ref_add_samples(rv.gpu_stats, gpu_samples(s.recent_gpu, rv.step_stats.history), cfg)
        rv = _updated(rv, {"gpu_stats": gst, "gpu_last": s.recent_gpu[-1]})
    return rv


def _loss_changes(rv: FoldedRank, s: RankState) -> dict[str, Any]:
    if s.loss_step <= 0 or not s.loss_finite or (rv.loss_steps and rv.loss_steps[-1] == s.loss_step):
        return {}
    steps, values = rv.loss_steps[-(LOSS_HISTORY - 1) :], rv.loss_values[-(LOSS_HISTORY - 1) :]
    steps.append(s.loss_step)
    values.append(s.loss)
    return {"loss_steps": steps, "loss_values": values, "loss_calm": loss_screen.calm(values)}


def _ident(s: RankState, host: str) -> dict[str, Any]:
    return {"rank": s.rank, "host": host, "pid": s.pid, "local_rank": s.local_rank}


def _updated(rv: FoldedRank, changes: dict[str, Any]) -> FoldedRank:
    vals = list(_folded_values(rv))
    for name, val in changes.items():
        vals[_FOLDED_INDEX[name]] = val
    return FoldedRank(*vals)


_folded_values = attrgetter(*_FOLDED_FIELDS)
_FOLDED_INDEX = {name: i for i, name in enumerate(_FOLDED_FIELDS)}


def _fold_colls(
    old: tuple[tuple[CollSig, float], ...], new: tuple[CollSig, ...], now: float
) -> tuple[tuple[CollSig, float], ...]:
    by_key = {(c.group, c.seq): (c, at) for c, at in old}
    for c in new:
        by_key[(c.group, c.seq)] = (c, now - c.age_s)
    items = sorted(by_key.values(), key=lambda x: (x[0].seq, x[0].group))
    return tuple(items[-COLL_HISTORY:])


def _death(rv: FoldedRank, s: RankState, now: float) -> FoldedRank:
    if s.alive:
        return (
            _updated(rv, {"died_at": None, "died_precise": False, "dead_seen_at": None})
            if rv.died_at is not None
            else rv
        )
    if rv.died_at is not None:
        return rv
    if s.gone_age_s > 0:
        return _updated(rv, {"died_at": now - s.gone_age_s, "died_precise": True, "dead_seen_at": now})
    return _updated(rv, {"died_at": min(now, max(rv.last_heartbeat(), rv.last_alive_at)), "dead_seen_at": now})


def _state_changes(old: RankState, new: RankState, ident: dict, events: list[Event]) -> None:
    changed = {
        name: [getattr(old, name), getattr(new, name)]
        for name in ("alive", "status", "pg_state")
        if getattr(old, name) != getattr(new, name)
    }
    if changed:
        events.append((je.STATE, {**ident, "step": new.step, "changed": changed}))


# -- random streams -------------------------------------------------------------------------

# Few distinct durations, so ties (which the sorted windows must order as a stable sort does) are common.
DURATIONS = (0.0, -0.0, 0.01, 0.1, 0.1, 0.25, 0.3, 1.5, 0.1 + 0.2, 2.0)
PHASES = ("train", "train", "train", "eval", "checkpoint")


class Stream:
    """Random host reports about a few ranks, with their arrival times."""

    def __init__(self, rng: random.Random, hosts: int = 3, per_host: int = 3) -> None:
        self.rng, self.hosts, self.per_host = rng, hosts, per_host
        self.now = 100.0
        self.seqs = dict.fromkeys(range(hosts), 0)
        self.agents = dict.fromkeys(range(hosts), 0)
        n = hosts * per_host
        self.step = dict.fromkeys(range(n), 0)
        self.inc = dict.fromkeys(range(n), 0)  # incarnation
        self.loss_step = dict.fromkeys(range(n), 0)
        self.coll_seq = dict.fromkeys(range(n), 0)

    def duration(self) -> float:
        rng = self.rng
        x = rng.random()
        if x < 0.01:
            return math.nan
        if x < 0.015:
            return math.inf
        return rng.choice(DURATIONS) if x < 0.6 else rng.uniform(0.0, 3.0)

    def samples(self, r: int) -> tuple[StepSample, ...]:
        rng = self.rng
        if rng.random() < 0.15:
            return ()
        step = max(0, self.step[r] + rng.choice((-3, -1, 0, 0, 1, 1, 1, 2, 5)))  # repeats, gaps
        out = []
        for _ in range(rng.randrange(1, 9)):
            out.append(
                StepSample(
                    step=step,
                    step_s=self.duration(),
                    data_s=self.duration(),
                    coll_s=rng.choice(DURATIONS),
                    phase=rng.choice(PHASES),
                    coll_bytes=rng.choice((0, 1024)),
                    forward_s=rng.choice((0.0, 0.05)),
                )
            )
            step += rng.choice((1, 1, 1, 1, 0, 2, -1))  # now and then out of order or repeated
        self.step[r] = max(self.step[r], step)
        if rng.random() < 0.1:
            rng.shuffle(out)
        return tuple(out)

    def gpu(self, r: int) -> tuple[GpuStep, ...]:
        rng = self.rng
        if rng.random() < 0.5:
            return ()
        first = max(0, self.step[r] - rng.randrange(0, 80))
        return tuple(
            GpuStep(first + i, self.duration(), rng.choice(DURATIONS), rng.choice(DURATIONS), 0.01, rng.choice(PHASES))
            for i in range(rng.randrange(1, 6))
        )

    def colls(self, r: int) -> tuple[CollSig, ...]:
        rng = self.rng
        if rng.random() < 0.6:
            return ()
        out = []
        for _ in range(rng.randrange(1, 6)):
            self.coll_seq[r] += rng.choice((0, 1, 1, 2))
            out.append(
                t.sig(
                    max(0, self.coll_seq[r] - rng.randrange(0, 40)),
                    group=rng.randrange(2),
                    op=rng.choice(("all_reduce", "all_gather", "send", "all_to_all")),
                    elements=rng.choice((4, 8)),
                    age_s=rng.uniform(0.0, 3.0),
                    state=rng.choice(("scheduled", "started", "completed")),
                )
            )
        return tuple(out)

    def rank(self, r: int) -> RankState:
        rng = self.rng
        if rng.random() < 0.03:
            self.inc[r] += 1  # restarted
        inc = self.inc[r] - (1 if self.inc[r] and rng.random() < 0.05 else 0)  # an older one, still reported
        if rng.random() < 0.7:
            self.loss_step[r] += rng.choice((0, 1, 1, 3))
        alive = rng.random() > 0.15
        return t.rank(
            r,
            world_size=rng.choice((self.hosts * self.per_host, 2 * self.hosts * self.per_host)),
            pid=1000 + r + 100 * inc,
            proc_start_us=1_700_000_000_000_000 + inc,
            alive=alive,
            status=rng.choice(("running", "running", "stopped")),
            pg_state=rng.choice(("joined", "joined", "aborted")),
            step=self.step[r],
            step_age_s=rng.uniform(0.0, 3.0),
            heartbeat_age_s=rng.choice((0.0, 0.04, rng.uniform(0.0, 5.0))),
            gone_age_s=0.0 if alive or rng.random() < 0.5 else rng.uniform(0.0, 2.0),
            collective=t.coll(seq=self.step[r] + rng.randrange(2), outstanding=rng.randrange(2), since_s=0.5),
            recent_steps=self.samples(r),
            recent_gpu=self.gpu(r),
            recent_colls=self.colls(r),
            loss=rng.choice((1.0, 2.5, 0.0, -1.0, 40.0, rng.uniform(0.5, 3.0))),
            loss_finite=rng.random() > 0.1,
            loss_step=self.loss_step[r],
            fr_newest_seq=rng.choice((0, 5)),
        )

    def next(self) -> tuple[float, HostReport]:
        rng = self.rng
        self.now += rng.uniform(0.0, 0.6)
        h = rng.randrange(self.hosts)
        if rng.random() < 0.02:
            self.agents[h] += 1  # the agent restarted: its sequence starts over
            self.seqs[h] = 0
        self.seqs[h] += rng.choice((1, 1, 1, 1, 0, -1))  # some retried or reordered
        ranks = [self.rank(r) for r in range(h * self.per_host, (h + 1) * self.per_host) if rng.random() < 0.9]
        if rng.random() < 0.05 and ranks:
            ranks.append(self.rank(rng.randrange(self.hosts * self.per_host)))  # a rank seen on another host
        rep = t.report(f"host{h}", ranks, seq=self.seqs[h], agent_id=f"agent{h}-{self.agents[h]}")
        return self.now, rep


def random_config(rng: random.Random) -> DetectorConfig:
    return DetectorConfig(
        warmup_steps=rng.randrange(0, 4),
        history_steps=rng.choice((1, 3, 40, 99, 100, 150, 256)),
        starvation_window_steps=rng.choice((1, 2, 7, 50)),
        straggler_window_steps=rng.choice((1, 2, 5, 20)),
        straggler_windows=rng.choice((1, 4)),
    )


# -- comparison -----------------------------------------------------------------------------


def assert_same_rank(a: FoldedRank, b: FoldedRank) -> None:
    for name in _FOLDED_FIELDS:
        assert repr(getattr(a, name)) == repr(getattr(b, name)), name
    for x, y in ((a.step_stats, b.step_stats), (a.gpu_stats, b.gpu_stats)):
        assert x.windows_scanned == y.windows_scanned
        assert x.flat.tobytes() == y.flat.tobytes()
        assert (x.flat_of is x.history) == (y.flat_of is y.history)
    # what the detectors read through the rank's properties
    assert repr((a.split_clock, a.history, a.windows)) == repr((b.split_clock, b.history, b.windows))


def assert_same_ranks(ref: dict[int, FoldedRank], ranks) -> None:
    assert list(ref) == list(ranks)
    for r, rv in ref.items():
        assert_same_rank(rv, ranks[r])


def same_value(kept: Any, built: Any) -> bool:
    """A column value as the Folder keeps it (bools as 0/1 in typed arrays) and as built."""
    return kept == built if isinstance(built, bool) else repr(kept) == repr(built)


def ref_view(job: str, world: int, fixed: bool, hosts: dict, ranks: dict) -> ClusterView:
    return ClusterView(job=job, world_size=world, world_size_fixed=fixed, hosts=hosts, ranks=ranks)


def test_the_folder_folds_random_streams_as_the_code_before():
    for seed in range(24):
        rng = random.Random(seed)
        cfg = random_config(rng) if seed % 4 else DetectorConfig()
        world0 = rng.choice((0, 9))
        stream = Stream(rng)
        folder = Folder(empty("job", world0))
        hosts: dict[str, HostView] = {}
        ranks: dict[int, FoldedRank] = {}
        world = world0
        for n in range(100):
            now, rep = stream.next()
            ev_ref: list[Event] = []
            if not _already_folded(hosts, rep):
                world = ref_fold_into(hosts, ranks, world, world0 > 0, rep, now, cfg, ev_ref)
            assert t.lines(folder.fold(rep, now, cfg)) == ev_ref, (seed, n)
            snap = folder.snapshot()
            if n % 10 == 9:
                assert_same_ranks(ranks, snap.ranks)
            else:  # the report's ranks (the others did not change)
                assert list(ranks) == list(snap.ranks)
                for r in {s.rank for s in rep.ranks} & ranks.keys():
                    assert_same_rank(ranks[r], snap.ranks[r])
            assert {h: repr(v) for h, v in hosts.items()} == {h: repr(v) for h, v in snap.hosts.items()}
            assert snap.world_size == world
            if n % 10 == 9:
                kept = columns.cached(snap)
                assert kept is not None
                built = columns.build(ref_view("job", world, world0 > 0, hosts, ranks))
                for name in columns.NAMES:
                    assert list(map(same_value, getattr(kept, name), getattr(built, name))) == [True] * len(ranks), name


def test_the_pure_fold_into_older_views_matches_the_code_before():
    """``fold`` may fold into a view the Folder has moved on from: its step
    statistics' running windows no longer describe it (rebuilt from its history)."""
    for seed in range(12):
        rng = random.Random(1000 + seed)
        cfg = random_config(rng)
        stream = Stream(rng, hosts=2, per_host=3)
        past: list[tuple[ClusterView, dict, dict, int]] = []
        hosts: dict[str, HostView] = {}
        ranks: dict[int, FoldedRank] = {}
        view, world = empty("job", 0), 0
        for _ in range(60):
            now, rep = stream.next()
            if past and rng.random() < 0.2:  # a branch off an older view, not kept
                old_view, old_hosts, old_ranks, old_world = rng.choice(past)
                got, events = t.with_lines(fold(old_view, rep, now, cfg))
                h, r = dict(old_hosts), dict(old_ranks)
                ev: list[Event] = []
                if not _already_folded(h, rep):
                    w = ref_fold_into(h, r, old_world, False, rep, now, cfg, ev)
                    assert got.world_size == w
                assert events == ev
                assert_same_ranks(r, got.ranks)
            view, events = t.with_lines(fold(view, rep, now, cfg))
            ev = []
            if not _already_folded(hosts, rep):
                world = ref_fold_into(hosts, ranks, world, False, rep, now, cfg, ev)
            assert events == ev
            assert_same_ranks(ranks, view.ranks)
            past.append((view, dict(hosts), dict(ranks), world))
        # Histories share buffers (stephistory): no branch, nor the main line after
        # it, may have changed what an older view's ranks read.
        for old_view, _, old_ranks, _ in past:
            assert_same_ranks(old_ranks, old_view.ranks)


def test_the_streams_reach_what_they_are_meant_to():
    """The streams above are not vacuous: restarts, deaths, losses, NaN step
    times, colls, GPU steps and closed windows all happen."""
    rng = random.Random(7)
    stream = Stream(rng)
    folder = Folder(empty("job", 0))
    events: list[Event] = []
    nan = gpu = colls = loss = dead = windows = 0
    for _ in range(400):
        now, rep = stream.next()
        events += t.lines(folder.fold(rep, now, DetectorConfig(warmup_steps=0, straggler_window_steps=2)))
        for s in rep.ranks:
            nan += any(math.isnan(x.step_s) for x in s.recent_steps)
        for rv in folder.snapshot().ranks.values():
            gpu += rv.gpu_stats.steps_seen > 0
            colls += bool(rv.colls)
            loss += len(rv.loss_values) > 1
            dead += rv.died_at is not None
            windows += bool(rv.step_stats.windows)
    kinds = {name for name, _ in events}
    assert {je.RANK_JOINED, je.RANK_RESTARTED, je.STATE, je.HOST_SEEN} <= kinds
    assert nan and gpu and colls and loss and dead and windows
