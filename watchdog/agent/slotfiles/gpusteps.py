"""A rank's GPU-side step split, from the COMPLETION records of its event ring.

On NCCL a collective call returns once queued: the hook's CPU-side split reads
collective wait ~0 and puts the wait in "compute". The hook's completion seam
(watchdog.hook.completion.tracker) records when the accelerator reached a marker queued
before and after each collective, and after each step. Folded per step:

* step time: between the GPU finishing step k - 1 and step k (consecutive step
  markers; the first step after start, or after a lost marker, has none);
* collective wait: the union of the step's collectives' GPU-side intervals
  (started .. completed), clipped to the step's span on the GPU;
* data wait: the CPU side's, from the step's STEP_END record (the GPU idles while
  the loader is waited on, once the queue drains);
* compute: what is left (``report.GpuStep.compute_s``).

A pure fold over records: ``GpuFold.feed`` keeps the few numbers it needs
between reads. Records with values no hook writes (a completion before its
start, times on a clock it cannot use, a step that goes back) are rejected and
counted, never folded into a figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from watchdog.agent.slotfiles import slot_states
from watchdog.contracts import slot as wire
from watchdog.report import GpuStep

_COMPLETION = int(wire.RecordKind.COMPLETION)
_STEP_END = int(wire.RecordKind.STEP_END)
COLLECTIVE, STEP = 1, 2  # COMPLETION word A (watchdog.hook.completion.tracker)
# Clocks whose times are CLOCK_MONOTONIC ns on this host: comparable with the hook's marks.
USABLE_CLOCKS = frozenset({int(wire.Clock.MONOTONIC), int(wire.Clock.GPU_EVENT)})
MAX_SPAN_NS = 10**9 * 10**6  # ~11.6 days: no step or collective lasts longer (report.MAX_SECONDS is 31 years)
CPU_STEPS_KEPT = 512  # STEP_END data waits kept for steps whose GPU completion is not read yet
MAX_OPEN_STEPS = 64  # steps with collectives but no step completion yet (a wedged GPU)


@dataclass
class GpuFold:
    """Per slot, between reads."""

    last_step: int = -1  # the step whose completion was folded last
    last_done_ns: int = 0
    clock: int = 0  # wire.Clock of the times folded
    cpu: dict[int, tuple[int, int]] = field(default_factory=dict)  # step -> (data ns, phase)
    colls: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # R_STEP -> (started, completed)
    rejected: int = 0
    totals_ns: tuple[int, int, int] = (0, 0, 0)  # step, data, collective over the steps split so far

    def feed(self, steps: list[wire.Record], events: list[wire.Record]) -> list[tuple[int, GpuStep]]:
        """New STEP_END records (step ring) and new event records, oldest first;
        returns (event index, sample) for each step the GPU finished."""
        for r in steps:
            if r.kind == _STEP_END:
                self.cpu[r.step] = (r.payload[1], r.payload[5])
        if len(self.cpu) > 2 * CPU_STEPS_KEPT:  # the GPU source stopped: keep the newest, amortised
            for k in sorted(self.cpu)[: len(self.cpu) - CPU_STEPS_KEPT]:
                del self.cpu[k]
        out = []
        for r in events:
            if r.kind != _COMPLETION:
                continue
            what, _group, seq, enq, done, clock, started = r.payload[:7]
            if clock not in USABLE_CLOCKS or done <= 0 or enq < 0 or started < 0 or r.step < 0:
                self.rejected += 1
                continue
            if what == COLLECTIVE:
                if started and not 0 <= done - started <= MAX_SPAN_NS:
                    self.rejected += 1
                    continue
                if started:  # without a start marker its GPU-side time is unknown: not guessed
                    self.colls.setdefault(r.step, []).append((started, done))
                    if len(self.colls) > MAX_OPEN_STEPS:
                        del self.colls[min(self.colls)]
            elif what == STEP:
                sample = self._step(seq, enq, done, clock)
                if sample is not None:
                    out.append((r.index, sample))
            else:
                self.rejected += 1
        return out

    def _step(self, k: int, enq: int, done: int, clock: int) -> GpuStep | None:
        prev_step, prev_done = self.last_step, self.last_done_ns
        if k <= prev_step or (prev_step == k - 1 and not 0 <= done - prev_done <= MAX_SPAN_NS):
            self.rejected += 1
            return None
        self.last_step, self.last_done_ns, self.clock = k, done, clock
        colls = self.colls.pop(k - 1, [])
        for old in [s for s in self.colls if s < k - 1]:
            del self.colls[old]
        cpu = self.cpu.pop(k, None)
        if prev_step != k - 1 or cpu is None:
            return None  # no span to split (first step, a lost marker) or no CPU side to pair with
        step_ns = done - prev_done
        coll_ns = _union_within(colls, prev_done, done)
        data_ns, phase = cpu
        data_ns = min(max(0, data_ns), step_ns)
        s, d, c = self.totals_ns
        self.totals_ns = (s + step_ns, d + data_ns, c + coll_ns)
        return GpuStep(
            step=k,
            step_s=step_ns / 1e9,
            data_s=data_ns / 1e9,
            coll_s=coll_ns / 1e9,
            lag_s=max(0, done - enq) / 1e9 if done - enq <= MAX_SPAN_NS else 0.0,
            phase=slot_states.label(wire.Phase, phase, "other"),
        )


def _union_within(spans: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Total length of the union of ``spans`` clipped to [lo, hi]: overlapping
    collectives (async buckets on several streams) count once."""
    total, end = 0, lo
    for a, b in sorted(spans):
        a, b = max(a, end), min(b, hi)
        if b > a:
            total += b - a
            end = b
    return total
