"""The verdict and goodput where people read them: ``watchdog status`` and
``watchdog timeline`` (text and HTML) of a simulated straggler job; an advisory
batch_changed finding is listed but never taken for the root cause."""

from __future__ import annotations

from watchdog.coordinator.cli.status import render
from watchdog.coordinator.config import Config
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.testing import SimJob
from watchdog.timeline import html, load, text


def _journal(tmp_path):
    path = str(tmp_path / "j.jsonl")
    c = Coordinator(Config(journal=path, job="job", world_size=8, tick_s=0.5), Journal(path, lambda: (1.7e9, 0.0)))
    c.journal.write(je.START, {"pid": 1, "address": "x", "job": "job", "world_size": 8})
    sim = SimJob(jitter=0.05, seed=4, split=(0.25, 0.5, 0.25, 0.0))
    sim.slow(6, 1.4)
    sim.run_until(40.0, coordinator=c, tick_s=0.5)
    return c, sim, path


def test_status_shows_the_bottleneck_and_goodput(tmp_path):
    c, sim, _ = _journal(tmp_path)
    out = render(c.status(sim.now, 1.7e9))
    assert "bottleneck: straggler-bound: rank 6 computes 1.3" in out or "rank 6 computes 1.4" in out
    assert "time: goodput " in out and "straggler" in out.split("time: goodput ")[1]
    assert "model split per step: forward 2" in out and "host-to-device 0.00 ms" in out  # mon.watch_model's


def test_timeline_tells_the_verdict_and_the_final_goodput(tmp_path):
    c, _, path = _journal(tmp_path)
    c.journal.write(
        je.FINDING,
        {
            "kind": "batch_changed",
            "ranks": [],
            "hosts": ["host0"],
            "reason": "the job restarted with 4 ranks instead of 8",
            "onset_wall": 1.0,
            "detected_wall": 1.0,
        },
    )
    c.journal.write(je.GOODPUT, c.goodput_record(final=True))
    c.journal.close()
    tl = load.load(path)
    [sec] = tl.sections
    out = text.render(tl)
    assert "bottleneck " in out and "straggler-bound: rank 6" in out
    assert "time (final): goodput " in out
    assert "model split per step: forward 2" in out
    root = sec.root
    assert root is not None and root["kind"] == "straggler"  # the detector's finding, not the advice
    assert "batch_changed" in out  # listed among the other findings
    page = html.render(tl)
    assert "Where the time went" in page and "straggler-bound: rank 6" in page
    assert "model split per step: forward" in page
