"""The completion-source seam: GPU-side completion times learned off the training
thread, through a source that a test can fake; nothing of it on a CPU-only run."""

from __future__ import annotations

import pytest

from watchdog.contracts import slot as wire
from watchdog.contracts.slot import Clock, RecordKind
from watchdog.hook.completion import tracker as completion
from watchdog.hook.completion.tracker import COLLECTIVE, STEP, CompletionTracker
from watchdog.hook.testing import ENV_VARS, FakeClock, FakeCompletionSource, installed, read_monitor, records_of


class Sink:
    def __init__(self):
        self.records = []

    def __call__(self, recs):
        self.records += recs


def tracker(**kw):
    src, sink, clock = FakeCompletionSource(), Sink(), FakeClock(1_000)
    return CompletionTracker(src, sink, clock, **kw), src, sink, clock


def test_resolved_markers_are_written_with_their_clock_and_enqueue_time():
    tr, src, sink, clock = tracker()
    for seq in (1, 2, 3):
        clock.advance(10)
        tr.submit(COLLECTIVE, 0, seq, step=7)
    src.complete(2, at_ns=5_000)
    assert tr.poll() == 2 and tr.in_flight == 1
    payloads = [r[3] for r in sink.records]
    assert [(p[2], p[3], p[4], Clock(p[5])) for p in payloads] == [
        (1, 1_010, 5_000, Clock.GPU_EVENT),
        (2, 1_020, 5_000, Clock.GPU_EVENT),
    ]
    assert all(r[0] == RecordKind.COMPLETION and r[2] == 7 for r in sink.records)
    assert tr.oldest_unresolved() == (COLLECTIVE, 0, 3, 1_030)  # where the queue is stuck


def test_a_later_marker_never_resolves_before_an_earlier_one():
    tr, src, sink, _ = tracker()
    tr.submit(COLLECTIVE, 0, 1, 0)
    tr.submit(COLLECTIVE, 0, 2, 0)
    src._done[2] = 9  # out of order: a stream cannot do that; the scan stops at 1
    assert tr.poll() == 0 and not sink.records


def test_a_wedged_accelerator_cannot_grow_memory():
    tr, _, _, _ = tracker(max_in_flight=4)
    for seq in range(10):
        tr.submit(COLLECTIVE, 0, seq, 0)
    assert tr.in_flight == 4 and tr.dropped == 6


def test_no_source_on_a_cpu_only_machine_and_cuda_untouched(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    with installed(tmp_path / "run", heartbeat_interval_s=3600) as mon:
        assert mon.completions is None and completion.cuda_source(lambda: 0) is None
        assert mon.step.__self__ is mon.recorder  # the plain step: nothing added
    assert not torch.cuda.is_initialized()


def test_collectives_and_steps_get_markers_through_a_fake_source(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "ERROR")
    src = FakeCompletionSource()
    with installed(tmp_path / "run", heartbeat_interval_s=3600, completion_source=src) as mon:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
        try:
            dist.all_reduce(torch.ones(4))
            dist.all_reduce(torch.ones(4))
            mon.step()
            assert src.marked == 5  # before and after each collective, after the step
            src.complete(1, at_ns=100_000)  # the long kernel queued before the first all-reduce ends
            src.complete(2, at_ns=123_456)  # the all-reduce completes
            src.complete(5, at_ns=130_000)
            mon._poll_background()  # what the heartbeat thread runs
            snap = read_monitor(mon)
            recs = [r.payload for r in records_of(snap, RecordKind.COMPLETION)]
            assert [(p[0], p[1], p[2]) for p in recs] == [(COLLECTIVE, 0, 1), (COLLECTIVE, 0, 2), (STEP, 0, 1)]
            assert [(p[6], p[4]) for p in recs] == [(100_000, 123_456), (130_000, 130_000), (0, 130_000)]
            assert all(p[5] == wire.Clock.GPU_EVENT for p in recs)
            # On the event ring, not among the step records.
            assert not any(r.kind == RecordKind.COMPLETION for r in snap.records)
        finally:
            dist.destroy_process_group()


def test_a_source_that_raises_is_given_up_without_touching_training():
    class Sticky(FakeCompletionSource):
        def done(self, marker):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    src, sink = Sticky(), Sink()
    tr = CompletionTracker(src, sink, FakeClock())
    tr.submit(COLLECTIVE, 0, 1, 0)
    assert tr.poll() == 0 and "illegal memory access" in tr.broken and tr.in_flight == 0
    tr.submit(COLLECTIVE, 0, 2, 0)  # no more markers, no error
    assert src.marked == 1 and tr.in_flight == 0
