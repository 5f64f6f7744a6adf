"""batch_changed and loader_starvation read the view's columns (and return early
when no rank could fire) and give the findings of the plain code they replaced,
kept here as the reference (their ``check`` as it was, on the ranks' objects):
random views with restarts, dead, frozen and exited ranks, lost hosts and
starving loaders, compared finding for finding."""

from __future__ import annotations

import random
from collections import Counter

from watchdog.contracts.finding import Finding
from watchdog.coordinator import testing as t
from watchdog.coordinator.analysis.health import OK, classify_all
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors.batch_changed import BatchChanged, _per_rank
from watchdog.coordinator.detectors.loader_starvation import LoaderStarvation
from watchdog.coordinator.view.cluster import ClusterView
from watchdog.report import StepSample


class ReferenceBatchChanged(BatchChanged):
    """BatchChanged.check before it read columns."""

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        health = classify_all.uncached(view, now, self.cfg)
        live = [rv for r, rv in view.ranks.items() if health[r] == OK]
        if not live:
            return []
        states = [rv.state for rv in live]
        sizes = {s.world_size for s in states}
        if len(sizes) != 1:
            return []  # mid-restart: wait until the live ranks agree
        new = sizes.pop()
        if len(live) < new:
            return []  # (checked before the largest size ever reported: the cheap test first)
        old = max(rv.state.world_size for rv in view.ranks.values())
        if old == new:
            return []
        since = min(rv.registered_at for rv in live if rv.state.world_size == new)
        # The old group's per-rank batch from its ranks still in the view (those
        # beyond the new size); the new one from the live ranks. 0: not known.
        old_batch = _per_rank([rv.state.batch_per_rank for rv in view.ranks.values() if rv.state.world_size == old])
        new_batches = [rv.state.batch_per_rank for rv in live]
        new_batch = _per_rank(new_batches)
        old_global = old_batch * old if old_batch else 0
        new_global = sum(new_batches) if all(new_batches) else 0
        if old_global and new_global:
            ratio = new_global / old_global
            if old_global == new_global:
                return []  # the script rescaled its per-rank batch: the global batch, and its learning rate, hold
            reason = (
                f"the job restarted with {new} ranks instead of {old}: the global batch is {new_global} samples "
                f"instead of {old_global} ({new_batch} per rank, was {old_batch}), {ratio:.2g}x what it was, so a "
                f"learning rate tuned for the old batch may no longer fit (linear scaling would use {ratio:.2g}x "
                f"the learning rate, or keep the global batch with {old_global / new_global * new_batch:.0f} "
                "per rank or gradient accumulation)"
            )
        else:
            ratio = new / old
            reason = (
                f"the job restarted with {new} ranks instead of {old}: with the same per-rank batch the global "
                f"batch is {ratio:.2g}x what it was, so a learning rate tuned for the old batch may no longer fit "
                f"(linear scaling would use {ratio:.2g}x the learning rate, or keep the global batch with "
                f"{old / new:.2g}x the per-rank batch or gradient accumulation)"
            )
        evidence = {
            "old_world_size": old,
            "new_world_size": new,
            "global_batch_ratio": round(ratio, 4),
            "old_per_rank_batch": old_batch or None,  # None: the hook was not told (older hook, no wrapped loader)
            "per_rank_batch": new_batch or None,
            "old_global_batch": old_global or None,
            "new_global_batch": new_global or None,
        }
        return [
            Finding(
                kind=self.name,
                ranks=(),
                hosts=tuple(sorted({rv.host for rv in live})),
                reason=reason,
                onset_mono=since,
                detected_mono=now,
                evidence=evidence,
            )
        ]


class ReferenceLoaderStarvation(LoaderStarvation):
    """LoaderStarvation.check before it read columns: the shares from the ranks' objects
    (the judgement that follows is the detector's own ``judge``)."""

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        cfg = self.cfg
        health = classify_all.uncached(view, now, cfg)
        # (rv.step_stats read directly, not through the rank's properties: a pass over every rank each tick)
        least = cfg.starvation_min_steps
        shares = {
            r: st.data_share
            for r, st in ((r, rv.step_stats) for r, rv in view.ranks.items() if health[r] == OK)
            if st.train_steps >= least
        }
        if any(h == OK and r not in shares for r, h in health.items()):
            return []  # judge "one loader or all" only once every live rank has enough steps
        return self.judge(now, view, shares)


def _restarted_view(rng: random.Random) -> ClusterView:
    """A job of ``old`` ranks, some of which came back as a job of ``new``."""
    old = rng.choice((4, 8, 12))
    new = rng.choice((old, old // 2, old - 1))
    batch = rng.choice((0, 16, 32))
    states = [
        t.rank(r, world_size=old, alive=rng.random() < 0.5, batch_per_rank=batch if rng.random() < 0.9 else 0)
        for r in range(old)
    ]
    first = t.view(states, now=10.0)
    fault = rng.choice(("none", "none", "none", "mid-restart", "frozen", "exited", "lost host"))
    odd = rng.randrange(new)
    again = [
        t.rank(
            r,
            world_size=old if fault == "mid-restart" and r == odd else new,
            pid=5000 + r,
            proc_start_us=1_800_000_000_000_000,
            batch_per_rank=rng.choice((batch, batch, 2 * batch, 0)) if rng.random() < 0.3 else batch,
            heartbeat_age_s=40.0 if fault == "frozen" and r == odd else 0.2,
            status="exited" if fault == "exited" and r == odd else "running",
        )
        for r in range(new)
    ]
    silent = {"host0": 0.0} if fault == "lost host" else None  # its ranks are not live
    return t.view(again, now=20.0, base=first, seq=2, received=silent)


def test_batch_changed_finds_what_the_plain_code_found():
    cfg = DetectorConfig()
    det, ref = BatchChanged(cfg), ReferenceBatchChanged(cfg)
    rng = random.Random(21)
    seen: Counter = Counter()
    for trial in range(400):
        view = _restarted_view(rng)
        got = det.check(20.5, view)
        assert got == ref.check(20.5, view), trial
        seen[len(got), bool(got and got[0].evidence["new_global_batch"])] += 1
    assert seen[0, False] > 20 and seen[1, True] > 10 and seen[1, False] > 10  # not vacuous


def _loader_view(rng: random.Random) -> ClusterView:
    world = rng.choice((3, 6, 10))
    slow = set(rng.sample(range(world), rng.choice((0, 1, 2, world))))  # none, some, or every loader starves
    states = []
    for r in range(world):
        n = rng.choice((10, 60, 60, 60))  # too few steps on some rank: no judgement yet
        data = 0.05 if r in slow else rng.choice((0.0, 0.01))
        samples = [
            StepSample(k, 0.1 + data, data * rng.uniform(0.8, 1.2), 0.01, "train" if rng.random() < 0.9 else "eval")
            for k in range(1, n + 1)
        ]
        states.append(
            t.rank(
                r,
                world_size=world,
                step=n + 1,
                recent_steps=samples,
                alive=rng.random() > 0.1,
                heartbeat_age_s=rng.choice((0.2, 0.2, 40.0)),
                status=rng.choice(("running",) * 9 + ("exited",)),
            )
        )
    silent = {"host1": 0.0} if rng.random() < 0.2 else None
    return t.view(states, now=100.0, received=silent)


def test_loader_starvation_finds_what_the_plain_code_found():
    cfg = DetectorConfig()
    det, ref = LoaderStarvation(cfg), ReferenceLoaderStarvation(cfg)
    rng = random.Random(31)
    seen: Counter = Counter()
    for trial in range(300):
        view = _loader_view(rng)
        got = det.check(100.5, view)
        assert got == ref.check(100.5, view), trial
        seen[got[0].evidence["scope"] if got else "none"] += 1
    assert seen["none"] > 20 and seen["ranks"] > 10 and seen["all"] > 10  # not vacuous


def test_the_verdicts_clock_is_the_summarised_ranks_split_clock():
    """verdict.measure reads the ranks' histories and split clocks from the view's
    columns: the clock it names is the one the summarised ranks' objects give
    (gpu, cpu or mixed), with dead ranks of another clock left out."""
    from watchdog.coordinator.performance import verdict

    cfg = DetectorConfig()
    rng = random.Random(41)
    seen: Counter = Counter()
    for trial in range(60):
        world = rng.choice((2, 5, 9))
        states = []
        for r in range(world):
            gpu = rng.random() < (0.5, 0.0, 1.0)[trial % 3]
            states.append(
                t.rank(
                    r,
                    world_size=world,
                    step=61,
                    recent_steps=t.steps(1, 60, step_s=0.1, data_s=0.01 * (r % 3)),
                    recent_gpu=t.gpu_steps(1, 60, step_s=0.1) if gpu else (),
                    alive=rng.random() > 0.15,
                )
            )
        view = t.view(states, now=100.0)
        m = verdict.measure(100.5, view, cfg)
        hl = classify_all.uncached(view, 100.5, cfg)
        clocks = {rv.split_clock for r, rv in view.ranks.items() if hl[r] == OK}
        want = clocks.pop() if len(clocks) == 1 else "mixed"
        if m.evidence["ranks"]:
            assert m.evidence["clock"] == want, trial
            seen[want] += 1
    assert seen["gpu"] and seen["cpu"] and seen["mixed"]  # not vacuous
