"""The GPU-side step split from COMPLETION records (agent/slotfiles/gpusteps.py): pure,
records written by hand as the hook's completion seam writes them."""

from __future__ import annotations

import pytest

from watchdog.agent.slotfiles.gpusteps import COLLECTIVE, STEP, GpuFold
from watchdog.contracts import slot as wire

MS = 1_000_000
GPU = int(wire.Clock.GPU_EVENT)


class Ring:
    """Event records numbered as the event ring numbers them."""

    def __init__(self) -> None:
        self.index = 0

    def rec(self, kind, step, payload) -> wire.Record:
        self.index += 1
        return wire.Record(self.index - 1, int(kind), 0, step, tuple(payload))

    def coll(self, step_done: int, seq: int, enq: int, started: int, done: int, clock: int = GPU) -> wire.Record:
        """A collective of step ``step_done + 1`` (the hook stamps steps completed)."""
        return self.rec(wire.RecordKind.COMPLETION, step_done, (COLLECTIVE, 0, seq, enq, done, clock, started))

    def step(self, k: int, enq: int, done: int) -> wire.Record:
        return self.rec(wire.RecordKind.COMPLETION, k, (STEP, 0, k, enq, done, GPU, 0))


def step_end(k: int, step_ns: int, data_ns: int, coll_ns: int, phase=wire.Phase.TRAIN) -> wire.Record:
    return wire.Record(k, int(wire.RecordKind.STEP_END), 0, k, (step_ns, data_ns, coll_ns, 1, k, int(phase)))


def test_a_long_kernel_before_an_all_reduce_is_compute_and_the_peer_wait_is_collective_wait():
    """NCCL-like: the CPU queues a 100 ms kernel and an all-reduce and ends the step
    in 10 ms (collective 'wait' 0.05 ms: the enqueue). On the GPU the kernel ends
    at +100 ms, the all-reduce, waiting for a slower peer, at +140 ms."""
    ring, fold, t0 = Ring(), GpuFold(), 5_000 * MS
    cpu = [step_end(1, 10 * MS, 2 * MS, MS // 20), step_end(2, 10 * MS, 2 * MS, MS // 20)]
    events = [
        ring.step(1, t0 - 200 * MS, t0),  # the previous step's end on the GPU
        ring.coll(1, 7, t0 + 9 * MS, started=t0 + 100 * MS, done=t0 + 140 * MS),
        ring.step(2, t0 + 10 * MS, t0 + 141 * MS),
    ]
    ((index, g),) = fold.feed(cpu, events)
    assert index == 2 and g.step == 2 and g.phase == "train"
    assert g.step_s == pytest.approx(0.141)
    assert g.coll_s == pytest.approx(0.040)  # the peer wait, which the CPU side read as 0.05 ms
    assert g.data_s == pytest.approx(0.002)
    assert g.compute_s == pytest.approx(0.099)  # the kernel, not the wait
    assert g.lag_s == pytest.approx(0.131)  # the GPU finished the step 131 ms after the CPU did
    assert fold.rejected == 0


def test_overlapping_collectives_count_once_and_only_inside_the_step():
    ring, fold, t0 = Ring(), GpuFold(), 1_000 * MS
    events = [
        ring.step(3, t0, t0),
        ring.coll(3, 1, t0, started=t0 + 10 * MS, done=t0 + 30 * MS),
        ring.coll(3, 2, t0, started=t0 + 20 * MS, done=t0 + 40 * MS),  # overlaps the first
        ring.coll(3, 3, t0, started=t0 + 90 * MS, done=t0 + 120 * MS),  # runs past the step's end
        ring.step(4, t0, t0 + 100 * MS),
    ]
    ((_, g),) = fold.feed([step_end(4, 100 * MS, 0, 0)], events)
    assert g.coll_s == pytest.approx(0.030 + 0.010)


def test_steps_are_split_across_reads_and_a_lost_step_marker_splits_nothing():
    ring, fold, t0 = Ring(), GpuFold(), 1_000 * MS
    assert fold.feed([step_end(1, MS, 0, 0)], [ring.step(1, t0, t0)]) == []  # no previous end: no span
    assert fold.feed([step_end(2, MS, 0, 0)], []) == []
    ((_, g),) = fold.feed([], [ring.step(2, t0, t0 + 50 * MS)])  # its STEP_END came in the read before
    assert g.step == 2 and g.step_s == pytest.approx(0.05)
    # Step 3's marker lost (the hook's in-flight cap): step 4 has no span to split.
    assert fold.feed([step_end(3, MS, 0, 0), step_end(4, MS, 0, 0)], [ring.step(4, t0, t0 + 150 * MS)]) == []
    ((_, g),) = fold.feed([step_end(5, MS, 0, 0)], [ring.step(5, t0, t0 + 190 * MS)])
    assert g.step == 5 and g.step_s == pytest.approx(0.04)


@pytest.mark.parametrize(
    "bad",
    [
        lambda r, t: r.coll(1, 1, t, started=t + 50 * MS, done=t + 10 * MS),  # completed before it started
        lambda r, t: r.coll(1, 1, t, started=t, done=t + 10 * MS, clock=int(wire.Clock.WALL)),  # unusable clock
        lambda r, t: r.coll(1, 1, -1, started=t, done=t + 10 * MS),
        lambda r, t: r.rec(wire.RecordKind.COMPLETION, 1, (9, 0, 1, t, t, GPU, 0)),  # unknown "what"
        lambda r, t: r.step(2, t, t - 5 * MS),  # the GPU finished step 2 before step 1
        lambda r, t: r.step(1, t, t + 5 * MS),  # step 1 again
        lambda r, t: r.coll(1, 1, t, started=t, done=t + 10**18),  # a span no collective lasts
    ],
)
def test_hostile_completion_records_are_counted_and_never_folded(bad):
    ring, fold, t0 = Ring(), GpuFold(), 1_000 * MS
    fold.feed([step_end(1, MS, 0, 0)], [ring.step(1, t0, t0)])
    assert fold.feed([], [bad(ring, t0)]) == [] and fold.rejected == 1
    out = fold.feed([step_end(2, 10 * MS, 0, 0)], [ring.step(2, t0, t0 + 10 * MS)])
    assert [g.coll_s for _, g in out] in ([0.0], [])  # nothing of the bad record in a figure
