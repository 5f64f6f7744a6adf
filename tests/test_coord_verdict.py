"""The bottleneck verdict on simulated jobs (time as numbers, no sleeps): each
cause gives its verdict, a healthy job is compute-bound, and the verdict holds
through noise around a threshold (hysteresis)."""

from __future__ import annotations

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.performance import verdict as V
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.testing import SimJob
from watchdog.report import StepSample


def _coordinator(tmp_path, name="j.jsonl"):
    path = str(tmp_path / name)
    return Coordinator(Config(journal=path, job="job", world_size=8, tick_s=0.5), Journal(path, lambda: (1.7e9, 0.0)))


CASES = [
    ("healthy", {}, V.COMPUTE),
    ("slow input pipeline on every rank", {"data_s": 0.05}, V.DATA),
    ("large all-reduce on a small compute", {"compute_s": 0.03, "comm_s": 0.06}, V.COMMUNICATION),
    ("one rank at 1.5x compute", {"slow": (5, 1.5)}, V.STRAGGLER),
]


@pytest.mark.parametrize("name,kw,want", CASES, ids=[c[0] for c in CASES])
def test_each_cause_gives_its_verdict(tmp_path, name, kw, want):
    c = _coordinator(tmp_path)
    slow = kw.pop("slow", None)
    sim = SimJob(jitter=0.1, seed=3, **kw)
    if slow:
        sim.slow(*slow)
    sim.run_until(30.0, coordinator=c, tick_s=0.5)
    assert c.verdict.verdict == want, c.verdict.reason
    recs = [r for r in journal.read(c.journal.path) if r["event"] == je.VERDICT]
    assert [r["verdict"] for r in recs] == [want], "one verdict record, no flapping"
    assert recs[0]["reason"].startswith(want if want != V.COMPUTE else "compute-bound")
    assert not [r for r in journal.read(c.journal.path) if r["event"] == je.FINDING and r["kind"] == "batch_changed"]
    assert c.registry.get_sample_value("watchdog_coordinator_bottleneck", {"verdict": want}) == 1
    others = [v for v in V.VERDICTS if v != want]
    assert all(c.registry.get_sample_value("watchdog_coordinator_bottleneck", {"verdict": v}) == 0 for v in others)
    status = c.status(sim.now, 1.7e9)
    assert status["bottleneck"]["verdict"] == want


def test_straggler_reason_names_the_rank_and_its_cost(tmp_path):
    c = _coordinator(tmp_path)
    sim = SimJob(jitter=0.05, seed=1)
    sim.slow(2, 1.3)
    sim.run_until(30.0, coordinator=c, tick_s=0.5)
    assert c.verdict.verdict == V.STRAGGLER
    assert "rank 2 computes 1.3" in c.verdict.reason
    assert c.verdict.evidence["slowest_rank"] == 2
    # 0.03 s of extra compute on a ~0.14 s step: the job loses about a fifth of every step.
    assert 0.15 < c.verdict.evidence["straggler_share"] < 0.3


def _measure(data_share: float) -> V.Measure:
    return V.Measure(
        {V.DATA: data_share, V.COMMUNICATION: 0.05, V.STRAGGLER: 0.0, V.MEMORY: 0.0}, {"step_s": 0.1}, True
    )


def test_hysteresis_holds_through_noise_around_the_threshold():
    state = V.Verdict()
    for i in range(V.CONFIRM):  # the first verdict too needs CONFIRM evaluations
        assert state.verdict == V.UNKNOWN
        state = V.decide(state, _measure(0.3), float(i - V.CONFIRM))
    verdicts = []
    # Data share wandering 0.16-0.26 around the 0.20 threshold: data-bound once, and it stays.
    for i, share in enumerate([0.25, 0.26, 0.19, 0.17, 0.22, 0.16, 0.18, 0.21, 0.17, 0.19]):
        state = V.decide(state, _measure(share), float(i))
        verdicts.append(state.verdict)
    assert verdicts == [V.DATA] * 10
    # Clearly gone for CONFIRM evaluations: compute-bound, and only then.
    for i in range(V.CONFIRM):
        assert state.verdict == V.DATA
        state = V.decide(state, _measure(0.05), 20.0 + i)
    assert state.verdict == V.COMPUTE and state.since == 20.0 + V.CONFIRM - 1


def test_one_outlier_evaluation_does_not_change_the_verdict():
    state = V.Verdict()
    for i in range(5):
        state = V.decide(state, _measure(0.02), float(i))
    assert state.verdict == V.COMPUTE
    state = V.decide(state, _measure(0.5), 5.0)
    state = V.decide(state, _measure(0.02), 6.0)
    assert state.verdict == V.COMPUTE


def test_unknown_until_every_live_rank_has_steps():
    view = t.view([t.rank(r, world_size=2, recent_steps=t.steps(1, V.MIN_STEPS)) for r in range(2)])
    assert V.leader(V.measure(100.0, view)) == V.UNKNOWN
    view = t.view([t.rank(r, world_size=2, recent_steps=t.steps(1, V.MIN_STEPS + 2)) for r in range(2)])
    assert V.leader(V.measure(100.0, view)) == V.COMPUTE


def test_memory_bound_from_accelerator_memory():
    v = t.view([t.rank(r, world_size=2, recent_steps=t.steps(1, 40)) for r in range(2)])
    from dataclasses import replace
    from types import MappingProxyType

    hosts = {
        h: replace(hv, accelerators=({"mem_used_bytes": 75 << 30, "mem_total_bytes": 80 << 30},))
        for h, hv in v.hosts.items()
    }
    v = replace(v, hosts=MappingProxyType(hosts))
    m = V.measure(100.0, v)
    assert V.leader(m) == V.MEMORY
    assert "memory-bound: accelerator memory 94% full" in V.reason(V.MEMORY, m)


def test_communication_share_is_the_least_waiting_rank():
    # Rank 1 computes longer; rank 0 waits for it in the all-reduce. Communication
    # itself is what rank 1 spends there, not rank 0's wait.
    r0 = [StepSample(step=i, step_s=0.2, data_s=0.0, coll_s=0.11) for i in range(1, 40)]
    r1 = [StepSample(step=i, step_s=0.2, data_s=0.0, coll_s=0.01) for i in range(1, 40)]
    view = t.view([t.rank(0, world_size=2, recent_steps=r0), t.rank(1, world_size=2, recent_steps=r1)])
    m = V.measure(100.0, view)
    assert m.shares[V.COMMUNICATION] == pytest.approx(0.05)
    assert V.leader(m) == V.STRAGGLER


def test_the_verdict_outlives_the_job_ending():
    state = V.Verdict()
    for _ in range(V.CONFIRM):
        state = V.decide(state, _measure(0.3), 1.0)
    assert state.verdict == V.DATA
    gone = V.Measure({V.DATA: 0.0, V.COMMUNICATION: 0.0, V.STRAGGLER: 0.0, V.MEMORY: 0.0}, {}, False)
    for i in range(2 * V.CONFIRM):
        state = V.decide(state, gone, 2.0 + i)
    assert state.verdict == V.DATA


def test_one_starving_rank_is_a_straggler_through_its_loader(tmp_path):
    c = _coordinator(tmp_path)
    sim = SimJob(jitter=0.05, seed=2)
    sim.starve(4, 0.05)
    sim.run_until(30.0, coordinator=c, tick_s=0.5)
    assert c.verdict.verdict == V.STRAGGLER
    assert "rank 4 waits 50 ms longer on its loader" in c.verdict.reason


def test_jitter_is_not_a_straggler(tmp_path):
    # +-30% iid jitter on every rank: some rank is always the slowest by luck.
    for seed in range(10):
        c = _coordinator(tmp_path, f"j{seed}.jsonl")
        sim = SimJob(world_size=4, jitter=0.3, seed=seed, compute_s=0.05)
        sim.run_until(40.0, coordinator=c, tick_s=0.25)
        got = [r["verdict"] for r in journal.read(c.journal.path) if r["event"] == je.VERDICT]
        assert got == [V.COMPUTE], (seed, got)


def test_one_spike_is_not_a_straggler():
    steps = {r: [StepSample(step=i, step_s=0.1, data_s=0.0, coll_s=0.02) for i in range(1, 41)] for r in range(4)}
    steps[1][5] = StepSample(step=6, step_s=1.0, data_s=0.0, coll_s=0.0)  # one 1 s step (a GC pause)
    for r in (0, 2, 3):
        steps[r][5] = StepSample(step=6, step_s=1.0, data_s=0.0, coll_s=0.92)  # the others wait for it
    view = t.view([t.rank(r, world_size=4, recent_steps=steps[r]) for r in range(4)])
    m = V.measure(100.0, view)
    assert m.shares[V.STRAGGLER] == 0.0 and V.leader(m) == V.COMPUTE


def test_communication_reason_gives_bytes_per_step_against_compute(tmp_path):
    """Not the last collective's size: every collective's bytes in a step, against
    the compute they synchronise."""
    c = _coordinator(tmp_path)
    sim = SimJob(jitter=0.1, seed=3, compute_s=0.03, comm_s=0.06, coll_bytes=48_000_000)
    sim.run_until(30.0, coordinator=c, tick_s=0.5)
    assert c.verdict.verdict == V.COMMUNICATION
    e = c.verdict.evidence
    assert e["bytes_per_step"] == 48_000_000
    assert e["bytes_per_compute_s"] == pytest.approx(48e6 / e["compute_s"], rel=1e-3)
    assert "48.0 MB per step against" in c.verdict.reason and "per compute-second" in c.verdict.reason


def test_finer_split_is_in_the_evidence_only_where_measured(tmp_path):
    c = _coordinator(tmp_path)
    sim = SimJob(jitter=0.0, seed=3, compute_s=0.1, split=(0.3, 0.6, 0.1, 0.0))
    sim.run_until(30.0, coordinator=c, tick_s=0.5)
    split = c.verdict.evidence["split"]
    assert split["forward_s"] == pytest.approx(0.03, rel=1e-3)
    assert split["backward_s"] == pytest.approx(0.06, rel=1e-3)
    assert split["optimizer_s"] == pytest.approx(0.01, rel=1e-3)
    assert split["h2d_s"] == 0.0
    assert V.split_line(c.verdict.evidence).startswith("model split per step: forward 30 ms, backward 60 ms")
    assert "optimizer 10 ms, host-to-device 0.00 ms" in V.split_line(c.verdict.evidence)
    plain = _coordinator(tmp_path, "plain.jsonl")
    SimJob(jitter=0.0, seed=3).run_until(30.0, coordinator=plain, tick_s=0.5)
    assert "split" not in plain.verdict.evidence and V.split_line(plain.verdict.evidence) == ""
