"""When the accelerator really finished: the completion-source seam.

On NCCL a collective call returns once its kernel is *queued*; the hook's exit
mark is the enqueue time. What the GPU did is known later, and must be learned
without ever synchronising the training thread. A ``CompletionSource`` answers
two questions:

* ``mark()`` — training thread, right after the call returns: put a marker in
  the accelerator's queue (a CUDA event recorded on the current stream). Must be
  cheap and must never wait.
* ``done(marker)`` — background thread: ``None`` while the marker has not been
  reached (``Event.query()`` is non-blocking), else the time it was, in the
  source's ``clock`` (``wire.Clock``).

A collective gets two markers: one queued just *before* the call (reached when
the work queued ahead of it, the step's compute, is done: the collective can
start) and one right after (reached when it completed). Their difference is the
collective's GPU-side time, waiting for the slowest peer included: the
collective wait that the CPU side reads as ~0 on NCCL. A step gets one marker,
after its last work: consecutive ones give the GPU-side step time.

``CompletionTracker`` keeps the markers in flight (bounded: a wedged GPU must not
grow memory), polls them from the hook's background thread, and writes each
resolved one as a COMPLETION ring record: the enqueue time on the host's
monotonic clock next to the completion time, with the clock it came from. A
marker still unresolved after the others behind it resolved is the GPU-side
"entered on the CPU, not done on the GPU" evidence.

Sources: ``CudaEventSource`` (CUDA events placed on the host's monotonic clock
through an anchor event; built only when ``torch.cuda.is_available()``, so a
CPU-only machine never initialises CUDA), the Flight Recorder's own times
(COLL_SIG records carry started/completed on NCCL, ``flight_recorder.py``), and
``watchdog.hook.testing.FakeCompletionSource`` for tests.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from watchdog.contracts.slot import Clock, RecordKind

log = logging.getLogger("watchdog.hook")

COLLECTIVE, STEP = 1, 2  # COMPLETION record word A: what completed
MAX_IN_FLIGHT = 1024  # markers kept; beyond, the oldest are counted as dropped


class CompletionSource(Protocol):
    clock: Clock

    def mark(self) -> Any: ...

    def done(self, marker: Any) -> int | None: ...


class CompletionTracker:
    """``submit`` on the training thread (one deque append); ``poll`` on the
    background thread writes what resolved, oldest first, in one slot bracket."""

    def __init__(
        self,
        source: CompletionSource,
        write: Callable[[list[tuple[int, int, int, tuple[int, ...]]]], None],
        clock: Callable[[], int],
        *,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.source = source
        self._write = write
        self._clock = clock
        self._pending: collections.deque = collections.deque()
        self._max = max_in_flight
        self._lock = threading.Lock()
        self.resolved = 0
        self.dropped = 0
        self.broken = ""  # why the source was given up ("" while it works)

    def _give_up(self, exc: BaseException) -> None:
        """A source that raises (a sticky CUDA error) is dropped, not retried every
        step: the hook's own error budget is for the hook."""
        self.broken = f"{type(exc).__name__}: {exc}"[:300]
        with self._lock:
            self._pending.clear()
        log.warning("watchdog.hook completion source failed, no longer used: %s", self.broken)

    def mark(self) -> Any:
        """Training thread, before a collective call: its start marker (None when
        the source is broken or fails). Never raises."""
        if self.broken:
            return None
        try:
            return self.source.mark()
        except Exception as exc:
            self._give_up(exc)
            return None

    def submit(self, what: int, group: int, seq: int, step: int, before: Any = None) -> None:
        """Training thread: right after a collective returned (or a step ended);
        ``before``: the marker ``mark()`` queued before the call. Never raises."""
        if self.broken:
            return
        try:
            marker = self.source.mark()
        except Exception as exc:
            self._give_up(exc)
            return
        with self._lock:
            if len(self._pending) >= self._max:
                self._pending.popleft()
                self.dropped += 1
            self._pending.append((what, group, seq, step, self._clock(), marker, before))

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def oldest_unresolved(self) -> tuple[int, int, int, int] | None:
        """(what, group, seq, enqueued_ns) of the oldest marker the accelerator
        has not reached: where its queue is stuck."""
        with self._lock:
            return self._pending[0][:3] + (self._pending[0][4],) if self._pending else None

    def poll(self) -> int:
        """Background thread. Markers resolve in queue order on one stream, so the
        scan stops at the first one not reached. Returns records written."""
        out: list[tuple[int, int, int, tuple[int, ...]]] = []
        clock = int(self.source.clock)
        while True:
            with self._lock:
                if not self._pending:
                    break
                what, group, seq, step, enq, marker, before = self._pending[0]
            try:
                at = self.source.done(marker)
                # Queued ahead of ``marker`` on the same stream: reached by now.
                started = self.source.done(before) if at is not None and before is not None else None
            except Exception as exc:
                self._give_up(exc)
                break
            if at is None:
                break
            with self._lock:
                if self._pending and self._pending[0][5] is marker:
                    self._pending.popleft()
            payload = (what, group, seq, enq, at, clock, started or 0)
            out.append((int(RecordKind.COMPLETION), self._clock(), step, payload))
        if out:
            self._write(out)
            self.resolved += len(out)
        return len(out)


class CudaEventSource:
    """CUDA events on the current stream, timed against an anchor event recorded
    at construction. ``done`` returns CLOCK_MONOTONIC ns: the anchor's host time
    plus the GPU-measured time from the anchor to the event (``elapsed_time``,
    valid once both completed), so figures line up with the hook's own marks.
    The anchor is taken when the queue is empty (install, before training): it
    is placed when the host recorded it."""

    clock = Clock.GPU_EVENT

    def __init__(self, torch_mod: Any, mono_ns: Callable[[], int]) -> None:
        self._cuda = torch_mod.cuda
        self._anchor = self._cuda.Event(enable_timing=True)
        self._anchor.record()
        self._anchor_ns = mono_ns()

    def mark(self) -> Any:
        ev = self._cuda.Event(enable_timing=True)
        ev.record()  # enqueued on the current stream; never waits
        return ev

    def done(self, marker: Any) -> int | None:
        if not marker.query() or not self._anchor.query():
            return None
        return self._anchor_ns + int(self._anchor.elapsed_time(marker) * 1e6)


def with_completion(
    wrapper: Callable, marks_of: Callable[[], Any], tracker: CompletionTracker, steps: Callable[[], int]
) -> Callable[..., Any]:
    """A patched collective that also queues completion markers before and after
    the call (used only when a source exists: on CPU the plain wrapper is installed)."""

    def collective(*args: Any, **kwargs: Any) -> Any:
        before = tracker.mark()
        ret = wrapper(*args, **kwargs)
        m = marks_of()
        if m is not None and not m.quiet:
            try:
                st = m.current
                tracker.submit(COLLECTIVE, st.key, st.seq, steps(), before)
            except Exception:  # never into training
                pass
        return ret

    for attr in ("__name__", "__qualname__", "__doc__", "__wrapped__", "watchdog_wrapper"):
        if hasattr(wrapper, attr):
            setattr(collective, attr, getattr(wrapper, attr))
    return collective


def cuda_source(mono_ns: Callable[[], int]) -> CudaEventSource | None:
    """A CUDA event source when this process has a usable GPU, else None. Looks
    at ``torch`` only if the process imported it; ``is_available()`` does not
    initialise CUDA, so a CPU-only machine pays nothing."""
    import sys

    torch_mod = sys.modules.get("torch")
    if torch_mod is None:
        return None
    try:
        if not torch_mod.cuda.is_available():
            return None
        return CudaEventSource(torch_mod, mono_ns)
    except Exception:
        return None
