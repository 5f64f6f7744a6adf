"""The tick's faster passes give the answers of the plain code they replaced,
kept here as the reference: rank health without a call per rank, the verdict's
summaries and measure column by column, the hook's mismatch marks built only
where ranks differ. Random views, compared value for value."""

from __future__ import annotations

import math
import random
from collections import Counter

from watchdog.coordinator import testing as t
from watchdog.coordinator.analysis import health, mismatch
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.performance import verdict as V
from watchdog.report import StepSample
from watchdog.stepstats import stats


def test_classify_all_is_classify_for_every_rank():
    cfg = DetectorConfig()
    rng = random.Random(11)
    kinds: Counter[str] = Counter()
    for trial in range(60):
        states = [
            t.rank(
                r,
                world_size=12,
                step=rng.choice((0, 5, 100)),
                status=rng.choice(("running", "running", "exited", "disabled", "failed")),
                alive=rng.random() > 0.15,
                heartbeat_age_s=rng.choice((0.2, 4.0, 12.0, 40.0)),
                proc_status=rng.choice(("running", "sleeping", "stopped")),
                # a lost host takes evidence (analysis/silence.py): ranks failed inside the collective it left
                collective=t.coll(seq=101, outstanding=1, since_s=2.0) if trial % 3 == 0 else None,
                step_age_s=3.0 if trial % 3 == 0 else 0.05,  # (0.05: t.rank's own)
            )
            for r in range(12)
        ]
        silent = {"host1": 0.0} if trial % 3 == 0 else None  # a lost host: the general path
        view = t.view(states, now=100.0, received=silent)
        got = health.classify_all.uncached(view, 100.5, cfg)
        lost = health.lost_hosts(view, 100.5, cfg)
        assert got == {r: health.classify(rv, view, 100.5, cfg, lost) for r, rv in view.ranks.items()}, trial
        assert list(got) == list(view.ranks)
        kinds.update(got.values())
    assert {health.OK, health.DEAD, health.FROZEN, health.EXITED, health.LOST} <= set(kinds)


def reference_summarize(history):
    xs = [x for x in history if x.phase == "train"][-V.WINDOW_STEPS :]
    n = len(xs)
    if n < V.MIN_STEPS:
        return None
    step = [x.step_s for x in xs]
    data = [x.data_s for x in xs]
    coll = [x.coll_s for x in xs]
    compute = [max(0.0, s - d - c) for s, d, c in zip(step, data, coll)]
    own = [c + d for c, d in zip(compute, data)]
    split = [x for x in xs if x.forward_s or x.backward_s or x.optimizer_s or x.h2d_s]
    finer = tuple(sum(getattr(x, k) for x in split) / len(split) for k in V.FINER) if split else None
    return V.Summary(
        sum(step) / n,
        sum(data) / n,
        sum(coll) / n,
        sum(compute) / n,
        stats.clipped_mean(own),
        stats.clipped_stdev(own) / math.sqrt(n),
        sum(x.coll_bytes for x in xs) / n,
        finer,
    )


def _history(rng: random.Random, n: int) -> tuple[StepSample, ...]:
    out = []
    phases = rng.choice((("train",), ("train", "train", "train", "eval"), ("train", "checkpoint")))
    split = rng.random() < 0.3
    for k in range(n):
        step_s = rng.choice((0.1, 0.1, 0.1, 2.0)) if rng.random() < 0.1 else rng.uniform(0.09, 0.11)
        coll = rng.uniform(0.0, 0.12)  # sometimes more than the step: compute clamps at 0
        fine = {"forward_s": 0.02, "backward_s": 0.04} if split and rng.random() < 0.5 else {}
        out.append(
            StepSample(
                k, step_s, rng.uniform(0, 0.01), coll, rng.choice(phases), coll_bytes=rng.randrange(0, 9), **fine
            )
        )
    return tuple(out)


def test_summarize_is_the_plain_summary():
    rng = random.Random(5)
    seen: Counter[tuple[bool, bool]] = Counter()
    for trial in range(400):
        hist = _history(rng, rng.choice((0, 10, 25, 50, 60, 120, 256)))
        got, want = V.summarize(hist), reference_summarize(hist)
        assert got == want, trial
        seen[got is None, got is not None and got.finer is not None] += 1
    assert len(seen) == 3  # none, plain and with the finer split all compared


def reference_measure(view, now, cfg):
    """verdict.measure before it went column by column (a summary of every live rank)."""
    hl = health.classify_all.uncached(view, now, cfg)
    live = [r for r in view.ranks if hl[r] == health.OK]
    got = {r: reference_summarize(view.ranks[r].history) for r in live}
    per_rank, own, noise, sent, finer = {}, {}, {}, {}, {}
    for r in live:
        sm = got[r]
        if sm is None:
            continue
        per_rank[r] = (sm.step, sm.data, sm.coll, sm.compute)
        own[r], noise[r], sent[r] = sm.own, sm.noise, sm.bytes_per_step
        if sm.finer is not None:
            finer[r] = sm.finer
    ready = len(per_rank) == len(live)
    if not per_rank:
        return ready, None
    med = stats.median
    step = med([v[0] for v in per_rank.values()])
    computes = {r: v[3] for r, v in per_rank.items()}
    med_compute = med(list(computes.values()))
    slow = max(own, key=lambda r: own[r])
    extra = own[slow] - med(list(own.values()))
    return ready, {
        "step_s": round(step, 6),
        "compute_s": round(med_compute, 6),
        "data_s": round(med([v[1] for v in per_rank.values()]), 6),
        "coll_s": round(med([v[2] for v in per_rank.values()]), 6),
        "data_share": round(med([v[1] / v[0] for v in per_rank.values() if v[0] > 0]), 4),
        "coll_share": round(min(v[2] / v[0] for v in per_rank.values()), 4),
        "straggler_share": round(extra / step, 4) if extra > V.NOISE_SIGMAS * noise[slow] else 0.0,
        "slowest_rank": slow,
        "slowest_compute_s": round(computes[slow], 6),
        "bytes_per_step": int(med(list(sent.values()))),
        "split": {k: round(med([v[i] for v in finer.values()]), 6) for i, k in enumerate(V.FINER)} if finer else None,
    }


def test_measure_is_the_plain_measure_on_simulated_jobs():
    cfg = DetectorConfig()
    compared = 0
    for seed, slow in ((1, 1.3), (2, 1.0), (3, 1.1)):
        sim = t.SimJob(world_size=12, jitter=0.1, seed=seed, coll_bytes=1000, cfg=cfg)
        if slow > 1:
            sim.slow(5, slow)
        sim.kill(9, at_step=200)
        for now in (5.0, 12.0, 20.0, 30.0, 40.0):
            view = sim.run_until(now)
            m = V.measure(now, view, cfg)
            ready, want = reference_measure(view, now, cfg)
            assert m.ready == ready
            if want is None:
                continue
            got = {k: m.evidence.get(k) for k in want}
            assert got == want, (seed, now)
            compared += 1
    assert compared >= 10


def reference_hook(view):
    out: dict[tuple[int, int], dict[int, tuple]] = {}
    for r, rv in view.ranks.items():
        c = rv.state.coll
        if c.seq <= 0:
            continue
        sig = (c.op,) if c.op in mismatch._SIZE_FREE else (c.op, c.bytes)
        out.setdefault((c.group, c.seq), {})[r] = (sig, f"{c.op} of {c.bytes} bytes", rv.coll_enter())
    return out


def test_hook_mismatches_are_judged_as_before():
    rng = random.Random(9)
    found = 0
    for trial in range(200):
        world = rng.choice((3, 5, 8))
        states = []
        for r in range(world):
            seq = rng.choice((0, 7, 7, 7, 8))
            op = "all_reduce" if rng.random() > 0.2 else rng.choice(("broadcast", "all_to_all"))
            nbytes = 4096 if rng.random() > 0.2 else 2048
            coll = t.coll(
                seq=seq, outstanding=1 if seq else 0, since_s=1.0, op=op, nbytes=nbytes, group=rng.choice((0, 0, 3))
            )
            states.append(t.rank(r, world_size=world, collective=coll))
        view = t.view(states, now=100.0)
        keys = list(reference_hook(view).items())
        sizes = mismatch._group_sizes(view, keys)
        want = [m for key, at in keys if (m := mismatch._judge(key, at, "hook", sizes[key[0]])) is not None]
        want_best = min(want, key=lambda m: (not m.odd, m.onset, m.source != "fr", m.seq, m.group)) if want else None
        assert mismatch.judge(view) == want_best, trial
        found += want_best is not None
    assert found > 20


def test_goodput_buffers_every_new_step_once_whatever_the_gaps():
    """The ledger's new steps per rank (found without a search when steps are
    consecutive, by bisection otherwise) are what a walk over the whole history finds."""
    from watchdog.coordinator.performance import goodput

    rng = random.Random(17)
    ledger = goodput.Ledger()
    want: dict[int, dict[int, tuple]] = {}
    last: dict[int, int] = {}
    view = None
    step = dict.fromkeys(range(6), 0)
    for tick in range(40):
        states = []
        for r in range(6):
            new = []
            for _ in range(rng.choice((0, 1, 3, 5))):
                step[r] += rng.choice((1, 1, 1, 2, 4))  # gaps: a report's steps need not be consecutive
                new.append(StepSample(step[r], 0.1, 0.0, 0.02))
            states.append(t.rank(r, world_size=6, step=step[r] + 1, recent_steps=new))
        view = t.view(states, now=100.0 + tick, base=view, seq=tick + 1)
        live = list(view.ranks)
        ledger._scan(view)
        for r in live:
            for x in view.ranks[r].history:
                if x.step > last.get(r, -1):
                    want.setdefault(x.step, {})[r] = (x.step_s, x.data_s, x.step_s - x.data_s - x.coll_s, 0.0)
            if view.ranks[r].history:
                last[r] = view.ranks[r].history[-1].step
        assert {k: v.rows() for k, v in ledger.buffer.items()} == want, tick
    assert sum(map(len, want.values())) > 200


def test_detector_gauges_export_what_the_detector_handed_out_as_it_changes():
    """The exporter skips a mapping it already exported and sets only the series
    that moved: what Prometheus sees is still exactly the last mapping."""
    from prometheus_client import CollectorRegistry

    from watchdog.coordinator.metrics import STRAGGLER_SCORE, CoordinatorMetrics

    reg = CollectorRegistry()
    m = CoordinatorMetrics(reg, ("straggler",))

    def exported() -> dict[str, float]:
        return {s.labels["rank"]: s.value for fam in reg.collect() if fam.name == STRAGGLER_SCORE for s in fam.samples}

    first = {"1": 1.0, "2": 1.2, "3": 0.9}
    m.set_detector_gauges({STRAGGLER_SCORE: first})
    assert exported() == first
    m.set_detector_gauges({STRAGGLER_SCORE: first})  # the kept answer, handed out again
    assert exported() == first
    later = {"2": 1.25, "3": 0.9, "4": 1.0}  # rank 1 no longer scored, 2 moved, 4 new
    m.set_detector_gauges({STRAGGLER_SCORE: later})
    assert exported() == later
    m.set_detector_gauges({STRAGGLER_SCORE: dict(first)})  # back: an equal mapping, another object
    assert exported() == first


def test_never_joined_overdue_ranks_are_the_plain_passes():
    """never_joined reads columns: the same ranks, in the same order, as the pass
    over the rank objects it replaced (steps, collectives, health, deadline)."""
    from watchdog.coordinator.detectors import never_joined

    cfg = DetectorConfig()
    rng = random.Random(23)
    found = 0
    for trial in range(80):
        n = rng.randrange(1, 24)
        states = [
            t.rank(
                r,
                world_size=n,
                step=rng.choice((0, 0, 3)),
                collective=t.coll(seq=rng.choice((0, 0, 2))),
                pg_state=rng.choice(("none", "initializing", "joined")),
                status=rng.choice(("running", "running", "exited")),
                alive=rng.random() > 0.1,
            )
            for r in range(n)
        ]
        first = t.view(states[: rng.randrange(n + 1)], now=100.0)  # some registered early, the rest later
        view = t.view(states, now=180.0, base=first, seq=2, received={"host0": 150.0} if trial % 4 == 0 else None)
        now = 181.0
        limit = rng.choice((10.0, 60.0, 120.0))
        h = health.classify_all(view, now, cfg)
        want = [
            rv
            for r, rv in view.ranks.items()
            if rv.state.step == 0
            and rv.state.coll.seq == 0
            and h[r] not in (health.DEAD, health.LOST, health.EXITED)
            and now - rv.registered_at > limit
        ]
        assert never_joined._overdue(view, now, limit, h) == want, trial
        found += bool(want)
    assert found > 10
