"""The verdict's cadence (performance/cadence.py): every tick on small jobs, every few
ticks on large ones, never on a finding's tick; the verdict on the cadence still
names the cause, and goodput stays what a ledger ticked every tick keeps on the
same views."""

from __future__ import annotations

from watchdog.coordinator.config import Config
from watchdog.coordinator.detectors.straggler import Straggler
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.performance import goodput as G
from watchdog.coordinator.performance import verdict as V
from watchdog.coordinator.performance.cadence import Cadence, period
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.testing import SimJob


def test_period_grows_with_the_job():
    assert [period(n, 4096) for n in (8, 4096, 4097, 8192, 16384)] == [1, 1, 2, 2, 4]


def test_small_jobs_run_the_verdict_every_tick_even_on_a_findings_tick():
    c = Cadence(4096)
    assert [c.due(4096, busy=b) for b in (False, True, False)] == [True, True, True]


def test_large_jobs_run_it_once_a_period_from_the_first_tick():
    c = Cadence(4096)
    assert [c.due(16384, busy=False) for _ in range(8)] == [True, False, False, False] * 2


def test_a_findings_tick_defers_it_to_the_next_tick():
    c = Cadence(4096)
    assert [c.due(16384, busy=False) for _ in range(4)] == [True, False, False, False]
    assert c.due(16384, busy=True) is False  # its turn: the finding's tick pays for its evidence instead
    assert c.due(16384, busy=False) is True


class _Both:
    """Feeds the coordinator on the cadence and, on the very same views, a
    ledger ticked every tick (what every tick used to do)."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord, self.ref = coord, G.Ledger()

    def accept(self, rep, at):
        return self.coord.accept(rep, at)

    def tick(self, now, wall):
        view = self.coord.view_at(now)
        self.ref.tick(now, view, False)
        return self.coord.tick(now, wall)

    @property
    def view(self):
        return self.coord.view


def _coordinator(tmp_path, ranks_per_tick: int) -> Coordinator:
    path = str(tmp_path / "j.jsonl")
    cfg = Config(journal=path, job="job", world_size=8, tick_s=0.5, performance_ranks_per_tick=ranks_per_tick)
    return Coordinator(cfg, Journal(path, lambda: (1.7e9, 0.0)))


def test_goodput_is_not_on_the_cadence(tmp_path):
    c = _coordinator(tmp_path, 2)  # the verdict every 4th tick
    both = _Both(c)
    sim = SimJob(jitter=0.1, seed=7)
    sim.slow(5, 1.4)  # a straggler, so more than one category moves
    sim.run_until(40.0, coordinator=both, tick_s=0.5)
    assert period(len(c.view.ranks), 2) == 4
    ref, got = both.ref, c.goodput
    assert got.last_tick == ref.last_tick == 40.0
    assert got.seconds == ref.seconds and got.pending == ref.pending and got.steps == ref.steps
    assert got.seconds[G.STRAGGLER] > 3.0


def test_the_verdict_on_the_cadence_names_the_straggler(tmp_path):
    c = _coordinator(tmp_path, 2)
    sim = SimJob(jitter=0.1, seed=3)
    sim.slow(5, 1.5)
    sim.run_until(40.0, coordinator=c, tick_s=0.5)
    assert c.verdict.verdict == V.STRAGGLER
    assert c.verdict.evidence["slowest_rank"] == 5


def test_the_straggler_rescoring_takes_no_step_on_the_verdicts_turn(tmp_path, monkeypatch):
    """At 16,384 ranks a rescoring (~0.13 s when ranks close windows, spread over
    ticks) and a verdict (60-90 ms) on one tick were the tick's p99: the rescoring
    keeps off the verdict's ticks, and the verdict still runs on its cadence."""
    c = _coordinator(tmp_path, 2)  # the verdict every 4th tick
    ran: list[float] = []
    stepped: list[float] = []
    at = [0.0]
    straggler = next(d for d in c.detectors if isinstance(d, Straggler))
    verdict, scores, scorer = c.performance._verdict, straggler.scores, straggler.scorer
    rescoring = scorer._rescoring

    def _verdict(view, now):
        ran.append(now)
        verdict(view, now)

    def _scores(now, view):
        at[0] = now
        return scores(now, view)

    def _rescoring(wins_of, chunk):  # each step of a rescoring, on the tick it runs
        steps = rescoring(wins_of, chunk)
        cost = next(steps)
        while True:
            yield cost
            stepped.append(at[0])
            try:
                cost = steps.send(None)
            except StopIteration as done:
                return done.value

    monkeypatch.setattr(c.performance, "_verdict", _verdict)
    monkeypatch.setattr(straggler, "scores", _scores)
    monkeypatch.setattr(scorer, "_rescoring", _rescoring)
    sim = SimJob(jitter=0.1, seed=3)
    sim.slow(5, 1.5)
    sim.run_until(40.0, coordinator=c, tick_s=0.5)
    assert len(set(stepped)) >= 5 and len(ran) >= 15
    assert not set(ran) & set(stepped)
    assert c.verdict.verdict == V.STRAGGLER  # still named, a tick later at most
