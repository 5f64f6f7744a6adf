"""Goodput on simulated jobs (time as numbers): the categories add up to the
wall time ticked, each kind of loss lands in its own category, and a restart's
downtime and redone steps are counted as such."""

from __future__ import annotations

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.performance import goodput as G
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.testing import SimJob


def _run(tmp_path, until=40.0, setup=None, **kw):
    path = str(tmp_path / "j.jsonl")
    c = Coordinator(Config(journal=path, job="job", world_size=8, tick_s=0.5), Journal(path, lambda: (1.7e9, 0.0)))
    sim = SimJob(jitter=0.05, seed=5, **kw)
    if setup:
        setup(sim)
    sim.run_until(until, coordinator=c, tick_s=0.5)
    return c, sim


def test_categories_add_up_to_wall_time_and_match_the_counters(tmp_path):
    c, _sim = _run(tmp_path)
    g = c.goodput
    ticked = 40.0 - 0.5  # the first tick starts the clock
    assert g.total() + g.pending == pytest.approx(ticked, rel=1e-9)
    assert g.pending < 1.0
    exported = sum(
        c.registry.get_sample_value("watchdog_coordinator_goodput_seconds_total", {"category": cat}) or 0
        for cat in G.CATEGORIES
    )
    assert exported == pytest.approx(g.total(), rel=1e-9)
    s = g.summary()
    assert s["seconds"][G.STARTUP] == pytest.approx(2.0, abs=1.5)  # init, then the warm-up steps
    # Healthy: compute (0.1 s) and the job's own all-reduce (0.01 s) are productive.
    assert s["goodput"] > 0.85
    assert 0.10 < s["profile"]["step_s"] < 0.13


@pytest.mark.parametrize(
    "name,setup,kw,category,share",
    [
        ("slow loader on every rank", None, {"data_s": 0.05}, G.DATA_WAIT, (0.25, 0.4)),
        ("one rank at 1.5x compute", lambda s: s.slow(3, 1.5), {}, G.STRAGGLER, (0.25, 0.4)),
        ("one rank's loader", lambda s: s.starve(3, 0.05), {}, G.STRAGGLER, (0.25, 0.4)),
    ],
)
def test_each_loss_in_its_category(tmp_path, name, setup, kw, category, share):
    c, _ = _run(tmp_path, setup=setup, **kw)
    s = c.goodput.summary()
    steps_time = sum(v for k, v in s["seconds"].items() if k != G.STARTUP)
    assert share[0] < s["seconds"][category] / steps_time < share[1], s
    assert max(s["seconds"], key=lambda k: s["seconds"][k] if k != G.PRODUCTIVE else -1) == category


def test_collective_wait_beyond_the_baseline(tmp_path):
    # The all-reduce grows 10x half-way: the job's own baseline stays the early one.
    c, sim = _run(tmp_path, until=20.0)
    before = c.goodput.seconds[G.COLLECTIVE_WAIT]
    sim.comm_s = 0.1
    sim.run_until(40.0, coordinator=c, tick_s=0.5)
    lost = c.goodput.seconds[G.COLLECTIVE_WAIT] - before
    assert lost > 5.0, c.goodput.summary()


def test_checkpoint_phase_is_not_productive(tmp_path):
    c, _ = _run(tmp_path, until=60.0, checkpoint_every=100, checkpoint_s=5.0)
    assert c.goodput.seconds[G.CHECKPOINT_EVAL] > 3.0, c.goodput.summary()


def _ranks(step0, n, pid_base, world=2, alive=True, step_s=0.1):
    return [
        t.rank(
            r,
            world_size=world,
            pid=pid_base + r,
            step=step0 + n,
            alive=alive,
            recent_steps=t.steps(step0 + 1, n, step_s=step_s, coll_s=0.01),
        )
        for r in range(world)
    ]


def test_restart_downtime_and_redone_steps():
    led = G.Ledger()
    v = t.view(_ranks(0, 20, 100), now=10.0, ranks_per_host=2)
    led.tick(0.0, v)
    led.tick(10.0, v)  # 20 steps done (2 warm-up steps dropped in the view): started
    v = t.view(_ranks(20, 30, 100), now=13.0, ranks_per_host=2, base=v, seq=2)
    led.tick(13.0, v)
    assert led.max_step == 50
    v = t.view(_ranks(50, 0, 100, alive=False), now=14.0, ranks_per_host=2, base=v, seq=3)
    led.tick(14.0, v)  # the ranks died
    assert led.restarting
    led.tick(20.0, v)
    # The new incarnation resumed from the checkpoint at step 40: steps 41-50 are redone.
    v = t.view(_ranks(40, 5, 200), now=23.0, ranks_per_host=2, base=v, seq=4)
    led.tick(23.0, v)
    assert not led.restarting
    v = t.view(_ranks(45, 15, 200), now=24.5, ranks_per_host=2, base=v, seq=5)
    led.tick(24.5, v)  # steps 46-60: 46-50 again, then new ones
    v = t.view(_ranks(60, 5, 200), now=25.0, ranks_per_host=2, base=v, seq=6)
    led.tick(25.0, v)
    s = led.summary()
    assert s["seconds"][G.RESTART] >= 9.0 - 1e-9  # 14 -> 23: dead, then the restarted group's first steps
    assert s["seconds"][G.REDONE] == pytest.approx(1.5 * 5 / 15)  # 5 of the 15 steps in 23 -> 24.5
    assert led.total() + led.pending == pytest.approx(25.0)


def test_goodput_records_in_the_journal(tmp_path):
    c, _ = _run(tmp_path, until=80.0)
    recs = [r for r in journal.read(c.journal.path) if r["event"] == je.GOODPUT]
    assert len(recs) >= 1 and not recs[-1]["final"]
    assert recs[-1]["summary"].startswith("goodput ")
    final = c.goodput_record(final=True)
    assert final["final"] and final["verdict"] == "compute"
    assert abs(sum(final["seconds"].values()) - final["total_s"]) < 0.01


def test_the_clock_stops_when_every_rank_exited():
    led = G.Ledger()
    v = t.view(_ranks(0, 20, 100), now=10.0, ranks_per_host=2)
    led.tick(0.0, v)
    led.tick(10.0, v)
    v = t.view(_ranks(20, 30, 100), now=13.0, ranks_per_host=2, base=v, seq=2)
    led.tick(13.0, v)
    done = [
        t.rank(r, world_size=2, pid=100 + r, step=55, status="exited", recent_steps=t.steps(51, 5, coll_s=0.01))
        for r in range(2)
    ]
    v = t.view(done, now=14.0, ranks_per_host=2, base=v, seq=3)
    led.tick(14.0, v)
    assert led.ended and led.pending == 0.0
    assert led.total() == pytest.approx(14.0)
    led.tick(30.0, v)  # the coordinator lingers: not the job's time
    assert led.total() == pytest.approx(14.0)
    assert led.seconds[G.PRODUCTIVE] > 0.85 * (14.0 - led.seconds[G.STARTUP])


def _job_in_batches(batch_s: int, batched: bool, seconds: int = 40) -> G.Ledger:
    """8 ranks on 4 hosts, 4 steps a second, rank 5 computing longer (the others
    wait for it in the all-reduce); each host sends its ranks' step samples every
    ``batch_s`` seconds, at a phase of its own, and their step in every report."""
    led, v = G.Ledger(), None
    sent = dict.fromkeys(range(4), 0)  # host -> steps its samples went up to
    for sec in range(1, seconds + 1):
        k = 4 * sec
        due = {h: (sec + h) % batch_s == 0 for h in range(4)}
        ranks = [
            t.rank(
                r,
                world_size=8,
                pid=100 + r,
                step=k,
                recent_steps=t.steps(sent[r // 2] + 1, k - sent[r // 2], step_s=0.25, coll_s=0.01 if r == 5 else 0.06)
                if due[r // 2]
                else (),
            )
            for r in range(8)
        ]
        sent.update((h, k) for h in range(4) if due[h])
        v = t.view(ranks, now=float(sec), ranks_per_host=2, base=v, seq=sec)
        led.tick(float(sec), v, batched=batched)
    return led


def test_step_samples_sent_in_batches_split_as_when_sent_every_report():
    # Agents asked for their samples every 4 s (backpressure.STEPS_INTERVAL_S) send them
    # at phases of their own: a host's steps arrive up to 16 steps after another's.
    every = _job_in_batches(1, batched=False)
    batches = _job_in_batches(4, batched=True)
    assert batches.seconds[G.REDONE] == 0.0
    assert batches.steps >= every.steps - 16  # the last batch may still be on its way
    # The same split of the time after the first step (which the batches show up to 3 s later:
    # startup takes that much longer to end, the one cost of the batches here).
    assert 0 < batches.seconds[G.STARTUP] - every.seconds[G.STARTUP] <= 3.0
    for cat in set(G.CATEGORIES) - {G.STARTUP}:
        share = every.seconds[cat] / (every.total() - every.seconds[G.STARTUP])
        assert batches.seconds[cat] / (batches.total() - batches.seconds[G.STARTUP]) == pytest.approx(share, abs=1e-9)
    assert every.seconds[G.STRAGGLER] > 0.1 * every.total()  # the split has something to get right
    # Without waiting for the lag the steps were split without the late hosts' ranks, then again as redone.
    assert _job_in_batches(4, batched=False).seconds[G.REDONE] > 0
