"""The goodput ledger reading the view's columns and buffering flat values
gives the answers of the ledger that walked the rank objects, kept here as the
reference: seconds per category, pending, steps, profile, last proportions, on
random jobs with restarts (redone steps), deaths, exits, checkpoint and eval
phases, stale ranks, gaps and out-of-order steps, and on simulated jobs."""

from __future__ import annotations

import random
from bisect import bisect_right
from dataclasses import dataclass, field
from operator import add, attrgetter, sub

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.performance import goodput as G
from watchdog.report import StepSample
from watchdog.stepstats import median as selection
from watchdog.stepstats.stats import median, quantile

_STEP, _DATA, _COLL, _NUMBER, _PHASE = (attrgetter(k) for k in ("step_s", "data_s", "coll_s", "step", "phase"))


@dataclass
class ReferenceLedger(G.Ledger):
    """The ledger before it read columns: a pass over the rank objects, the
    samples themselves buffered and read attribute by attribute in the split."""

    # step -> its samples themselves, by rank (the ledger keeps columns there)
    buffer: dict[int, dict[int, StepSample]] = field(default_factory=dict)  # type: ignore[assignment]

    def tick(self, now, view, restarting=False, batched=False):  # batched: the reference never batches
        dt = 0.0 if self.last_tick is None else max(0.0, now - self.last_tick)
        self.last_tick = now
        over = bool(view.ranks) and all(rv.state.status == "exited" for rv in view.ranks.values())
        if over and self.ended:
            return
        self.ended = False
        live, changed, pausing = self._scan(view, track=not restarting)
        if restarting or changed:
            self.restarting = True
        ready = self._ready_steps(live)
        if not self.started:
            self.seconds[G.STARTUP] += dt
            self.started = bool(ready)
        elif self.restarting:
            self.seconds[G.RESTART] += dt + self.pending
            self.pending = 0.0
            self.restarting = not ready
        elif pausing:
            self.seconds[G.CHECKPOINT_EVAL] += dt
        else:
            self.pending += dt
        if ready:
            self._split(ready)
        if over and self.started:
            self._allocate(self.last_parts or {G.PRODUCTIVE: 1.0})
            self.ended = True

    def _scan(self, view, track=True, batched=False):
        live = []
        changed = pausing = False
        incarnations, seen, buffer, started = self.incarnations, self.seen, self.buffer, self.started
        for r, rv in view.ranks.items():
            s = rv.state
            if track:
                inc = (s.pid, s.proc_start_us)
                old = incarnations.get(r)
                if old != inc:
                    if old is not None:
                        changed = True
                        seen.pop(r, None)
                    incarnations[r] = inc
                if not s.alive and started and s.status != "exited":
                    changed = True
            if not s.alive or s.status == "exited":
                continue
            live.append(r)
            self.world_sizes.add(s.world_size)
            if s.phase in G.PAUSE_PHASES:
                pausing = True
            hist = rv.step_stats.history
            last = seen.get(r)
            if not hist or (last is not None and hist[-1].step <= last):
                continue
            if last is None:
                new = 0
            else:
                new = len(hist) - (hist[-1].step - last)
                if not (0 < new <= len(hist) and hist[new - 1].step == last):
                    new = bisect_right(hist, last, key=_NUMBER)
            for x in hist[new:]:
                buffer.setdefault(x.step, {})[r] = x
            seen[r] = hist[-1].step
        return live, changed, pausing

    def _ready_steps(self, live):
        if not self.buffer:
            return []
        newest = max(self.buffer)
        want = set(live)
        out = []
        for step in sorted(self.buffer):
            got = self.buffer[step]
            if (len(got) >= len(want) and want <= got.keys()) or step + G.STALE_STEPS <= newest:
                out.append(self.buffer.pop(step))
        return out

    def _split(self, steps):
        parts = dict.fromkeys(G.CATEGORIES, 0.0)
        for got in steps:
            xs = list(got.values())
            number = xs[0].step
            step_times = list(map(_STEP, xs))
            step_s = max(step_times)
            if number <= self.max_step:
                parts[G.REDONE] += step_s
                continue
            self.max_step = number
            if not frozenset(G.PAUSE_PHASES).isdisjoint(map(_PHASE, xs)):
                parts[G.CHECKPOINT_EVAL] += step_s
                continue
            datas = list(map(_DATA, xs))
            computes = list(map(sub, map(sub, step_times, datas), map(_COLL, xs)))
            if min(computes) < 0.0:
                computes = [max(0.0, c) for c in computes]
            data = median(datas)
            compute = median(computes)
            slow = max(0.0, max(map(add, computes, datas)) - compute - data)
            coll = max(0.0, step_s - data - compute - slow)
            self.coll_history = (self.coll_history + [coll])[-G.BASELINE_SAMPLES :]
            base = min(coll, quantile(self.coll_history, G.BASELINE_QUANTILE))
            parts[G.PRODUCTIVE] += compute + base
            parts[G.DATA_WAIT] += data
            parts[G.STRAGGLER] += slow
            parts[G.COLLECTIVE_WAIT] += coll - base
            n = self.steps + 1
            for key, val in (("step_s", step_s), ("compute_s", compute), ("coll_s", coll), ("data_s", data)):
                self.profile[key] += (val - self.profile[key]) / n
            self.steps = n
        if sum(parts.values()) > 0:
            self.last_parts = parts
        self._allocate(parts)


def _rows(buffer):
    """The reference's buffered samples as the ledger's columns hold them."""
    return {
        k: {
            r: (x.step_s, x.data_s, x.step_s - x.data_s - x.coll_s, float(x.phase in G.PAUSE_PHASES))
            for r, x in got.items()
        }
        for k, got in buffer.items()
    }


def _same(got: G.Ledger, want: ReferenceLedger, where) -> None:
    fields = ("seconds", "pending", "steps", "profile", "last_parts", "max_step", "coll_history", "restarting")
    assert {k: getattr(got, k) for k in fields} == {k: getattr(want, k) for k in fields}, where
    assert (got.started, got.ended, got.world_sizes, got.seen, got.incarnations) == (
        want.started,
        want.ended,
        want.world_sizes,
        want.seen,
        want.incarnations,
    ), where
    assert {k: v.rows() for k, v in got.buffer.items()} == _rows(want.buffer), where
    assert got.summary() == want.summary(), where


def _random_job(rng: random.Random, ticks: int, world: int):
    """Views of a job whose ranks step, stall, die, exit, restart from an
    earlier step, pause for checkpoints and evals, and report steps with gaps
    or out of order."""
    step = dict.fromkeys(range(world), 0)
    pid = {r: 1000 + r for r in range(world)}
    alive, status = dict.fromkeys(range(world), True), dict.fromkeys(range(world), "running")
    view = None
    for tick in range(ticks):
        restart_all = rng.random() < 0.04
        states = []
        for r in range(world):
            new = []
            if restart_all or (rng.random() < 0.02):
                pid[r] += 100  # a new incarnation, resuming from an earlier step: redone steps
                step[r] = max(0, step[r] - rng.randrange(0, 12))
                alive[r], status[r] = True, "running"
            elif rng.random() < 0.02:
                alive[r] = False  # died
            elif rng.random() < 0.01:
                status[r] = "exited"
            stalled = rng.random() < 0.1  # a stale rank: nothing new this tick
            if alive[r] and status[r] == "running" and not stalled:
                phase = rng.choice(("train",) * 8 + ("checkpoint", "eval"))
                for _ in range(rng.choice((0, 1, 3, 4, 4, 5))):
                    step[r] += rng.choice((1, 1, 1, 1, 2, 4))  # gaps: a report's steps need not be consecutive
                    s = rng.choice((0.1, 0.1, 0.25, 0.0))
                    new.append(StepSample(step[r], s, rng.choice((0.0, 0.01, 0.3)), rng.uniform(0.0, 0.15), phase))
                if len(new) > 2 and rng.random() < 0.05:
                    new[0], new[1] = new[1], new[0]  # out of order
            states.append(
                t.rank(
                    r,
                    world_size=world,
                    pid=pid[r],
                    step=step[r] + 1,
                    alive=alive[r],
                    status=status[r],
                    phase=rng.choice(("train",) * 12 + ("checkpoint", "eval")),
                    recent_steps=new,
                )
            )
        view = t.view(states, now=100.0 + tick, base=view, seq=tick + 1)
        yield tick, view, rng.random() < 0.05  # restarting (the policy's restart in progress)


@pytest.mark.parametrize("small", [selection.SMALL, 3])  # 3: the selection median even at a few ranks
def test_the_ledger_is_the_reference_on_random_jobs(monkeypatch, small):
    monkeypatch.setattr(selection, "SMALL", small)
    rng = random.Random(3)
    compared = redone = paused = restarted = 0
    for trial in range(40):
        got, want = G.Ledger(), ReferenceLedger()
        for tick, view, restarting in _random_job(rng, 60, rng.choice((1, 3, 6, 9))):
            now = 100.0 + tick + rng.choice((0.0, 0.5))
            want.tick(now, view, restarting)
            got.tick(now, view, restarting)
            _same(got, want, (trial, tick))
            compared += 1
        redone += want.seconds[G.REDONE] > 0
        paused += want.seconds[G.CHECKPOINT_EVAL] > 0
        restarted += want.seconds[G.RESTART] > 0
    assert compared == 40 * 60 and min(redone, paused, restarted) >= 10, (redone, paused, restarted)


def test_the_ledger_is_the_reference_on_simulated_jobs():
    compared = 0
    for seed, fault in enumerate(("slow", "kill", "hang", "exit", "checkpoint")):
        sim = t.SimJob(
            world_size=12,
            jitter=0.1,
            seed=seed,
            data_s=0.01,
            checkpoint_every=40 * (fault == "checkpoint"),
            checkpoint_s=2.0,
        )
        if fault == "slow":
            sim.slow(5, 1.3)
        elif fault == "kill":
            sim.kill(9, at_step=100)
        elif fault == "hang":
            sim.hang(2, at_step=150)
        elif fault == "exit":
            for r in range(12):
                sim.exit_early(r, at_step=180)
        got, want = G.Ledger(), ReferenceLedger()
        for k in range(60):
            now = 0.5 * (k + 1)
            view = sim.run_until(now)
            want.tick(now, view)
            got.tick(now, view)
            _same(got, want, (fault, now))
            compared += 1
        assert want.steps > 50, fault
    assert compared == 300


def test_the_ledger_is_the_reference_when_step_numbers_pass_2_to_the_53():
    """Beyond 2^53 a step number is not exact as a double: those steps are read
    from the history, the other ranks' as usual; also when a rank that took such
    steps restarts from small ones while the ledger is told a restart is under
    way (it does not follow incarnations then, so its last step stays huge)."""
    got, want = G.Ledger(), ReferenceLedger()
    view = None
    big = (1 << 53) - 6
    first = {0: big, 1: 10, 2: 10}
    pid = dict.fromkeys(range(3), 100)
    for tick in range(16):
        if tick == 8:
            first[0], pid[0] = 0, 200  # rank 0 restarted, from step 0
        states = [
            t.rank(r, world_size=3, pid=pid[r], step=first[r] + 4, recent_steps=t.steps(first[r], 4, coll_s=0.01 * r))
            for r in range(3)
        ]
        for r in first:
            first[r] += 4
        view = t.view(states, now=100.0 + tick, base=view, seq=tick + 1)
        restarting = tick in (8, 9)
        want.tick(100.0 + tick, view, restarting)
        got.tick(100.0 + tick, view, restarting)
        _same(got, want, tick)
    assert want.steps > 20 and want.seconds[G.RESTART] > 0
