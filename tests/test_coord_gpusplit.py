"""The step split on the GPU clock: where a rank's hook has a completion source,
detectors read the GPU-side split. On NCCL a collective returns once queued, so
the CPU side reads collective wait ~0 and a slower rank's peers seem to compute
as long as it does: the straggler detector would be blind."""

from __future__ import annotations

import pytest

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config, DetectorConfig
from watchdog.coordinator.detectors.straggler import Straggler
from watchdog.coordinator.intake import status
from watchdog.coordinator.performance import verdict

CFG = DetectorConfig()
SLOW = 6


def nccl_rank(r: int, gpu: bool):
    """Every rank's wall step is 0.2 s; on the CPU its collective 'wait' is the
    0.1 ms enqueue. On the GPU rank 6 computes 0.15 s, the others 0.10 s and wait
    the rest in the all-reduce."""
    compute = 0.15 if r == SLOW else 0.10
    cpu = t.steps(1, 120, step_s=0.2, coll_s=0.0001)
    return t.rank(
        r,
        recent_steps=cpu,
        recent_gpu=t.gpu_steps(1, 120, step_s=0.2, coll_s=0.2 - compute, lag_s=0.05) if gpu else (),
        gpu_clock="gpu" if gpu else "",
    )


def test_on_the_cpu_side_alone_an_nccl_straggler_is_invisible():
    view = t.view([nccl_rank(r, gpu=False) for r in range(8)])
    assert Straggler(CFG).check(100.0, view) == []
    assert view.ranks[0].split_clock == "cpu"


def test_the_gpu_side_split_moves_the_wait_into_collective_wait_and_names_the_straggler():
    view = t.view([nccl_rank(r, gpu=True) for r in range(8)])
    rv = view.ranks[0]
    assert rv.split_clock == "gpu"
    assert rv.history[-1].coll_s == pytest.approx(0.1) and rv.history[-1].compute_s == pytest.approx(0.1)
    assert rv.step_stats.history[-1].compute_s == pytest.approx(0.1999)  # the CPU side, kept as measured
    (f,) = Straggler(CFG).check(100.0, view)
    assert f.ranks == (SLOW,) and f.evidence["factor"] == pytest.approx(1.5) and f.evidence["clock"] == "gpu"


def test_the_verdict_and_status_say_which_clock_their_figures_came_from():
    view = t.view([nccl_rank(r, gpu=True) for r in range(8)])
    m = verdict.measure(100.0, view)
    assert m.evidence["clock"] == "gpu" and m.evidence["coll_s"] == pytest.approx(0.1)
    assert verdict.reason(verdict.STRAGGLER, m).endswith("(split on the GPU clock)")
    assert verdict.measure(100.0, t.view([nccl_rank(r, gpu=False) for r in range(8)])).evidence["clock"] == "cpu"
    row = status.build(view, {}, 100.0, 1.7e9, Config())["ranks"][SLOW]
    assert row["clock"] == "cpu" and row["gpu"]["clock"] == "gpu"
    assert row["gpu"]["compute_s"] == pytest.approx(0.15) and row["gpu"]["lag_s"] == pytest.approx(0.05)


def test_gpu_steps_keep_what_only_the_cpu_side_measures():
    from dataclasses import replace

    cpu = tuple(replace(x, coll_bytes=4096, forward_s=0.03) for x in t.steps(1, 30, step_s=0.2, coll_s=0.0001))
    view = t.view([t.rank(0, recent_steps=cpu, recent_gpu=t.gpu_steps(1, 30, step_s=0.2, coll_s=0.1))])
    x = view.ranks[0].history[-1]
    assert (x.coll_s, x.coll_bytes, x.forward_s) == (pytest.approx(0.1), 4096, pytest.approx(0.03))


def test_the_coordinator_exports_which_clock_its_split_came_from(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    from watchdog.coordinator.journal.jsonl import Journal
    from watchdog.coordinator.service import Coordinator

    reg, path = CollectorRegistry(), str(tmp_path / "j.jsonl")
    coord = Coordinator(Config(journal=path), Journal(path, lambda: (1.7e9 + 100.0, 100.0)), registry=reg)
    assert 'watchdog_coordinator_step_split_clock{clock="cpu"} 1.0' in generate_latest(reg).decode()
    for host in sorted({t.host_of(r) for r in range(8)}):
        coord.accept(t.report(host, [nccl_rank(r, gpu=True) for r in range(8) if t.host_of(r) == host]), now=100.0)
    coord.tick(101.0, 1.7e9 + 101.0)
    text = generate_latest(reg).decode()
    assert 'watchdog_coordinator_step_split_clock{clock="gpu"} 1.0' in text
    assert 'watchdog_coordinator_step_split_clock{clock="cpu"} 0.0' in text


def test_a_gpu_split_that_stopped_is_no_longer_read():
    """The completion source failed (a sticky CUDA error): GPU samples end at step
    120 while the CPU side goes on; past GPU_STALE_STEPS the CPU split is read again."""
    from watchdog.coordinator.view.cluster import GPU_STALE_STEPS

    view = t.view([nccl_rank(r, gpu=True) for r in range(8)])
    later = [t.rank(r, recent_steps=t.steps(121, GPU_STALE_STEPS + 10, step_s=0.2, coll_s=0.0001)) for r in range(8)]
    view = t.view(later, now=130.0, base=view, seq=2)
    assert view.ranks[0].split_clock == "cpu" and view.ranks[0].history[-1].coll_s == pytest.approx(0.0001)


def test_watchdog_status_shows_the_gpu_split_marked_as_such():
    from watchdog.coordinator.cli.status import _ms, render

    view = t.view([nccl_rank(r, gpu=r == SLOW) for r in range(8)])
    doc = status.build(view, {}, 100.0, 1.7e9, Config())
    lines = render(doc).splitlines()
    rows = {ln.split()[0]: ln.split() for ln in lines[3:11]}
    # step, data, compute, collective: the GPU side's, marked
    assert rows[str(SLOW)][5:9] == [_ms(x) + "g" for x in (0.2, 0.0, 0.15, 0.05)]
    assert not any(x.endswith("g") for x in rows["0"][5:9])  # the CPU side's
    assert any(ln.startswith("(g: on the accelerator's clock") for ln in lines)
