"""The Monitor: the hook's public API, its lifecycle and its failure policy.

A Monitor holds a Recorder (marks/recorder.py: what is recorded) which holds the
SlotWriter (slot/slotwriter.py: how the slot may change); it is neither. Composition
rather than a base class: the recorder is handed the two behaviours it needs from
here as callables (``on_error``, ``on_control_due``), as the heartbeat is, so
each piece can be built and tested alone, and nothing waits for a subclass to
fill a method in. So are the control block (slot/control_block.py) and the
Flight Recorder reads (completion/flight_recorder_reads.py): the heartbeat gets their
``poll`` as callables. The user's hottest call, ``step``, is bound straight to the
recorder's method at construction: composition costs it no extra frame.

The seam. What installs the monitor and patches around it (lifecycle/installer.py,
zero_code/auto.py and collectives.py, the framework callbacks) uses the public methods below
the API: ``report_error``, ``add_undo``, ``add_automatic`` / ``hand_over``,
``zero_code``, ``mark_failed``, ``after_fork_in_child`` and ``heartbeat``.

Failure policy. Every hooked path catches Exception and reports it here: counted
(``errors``, and H_HOOK_ERRORS in the slot), logged once per place, an ERROR
record in the ring. At ``max_errors`` the monitor writes Status.DISABLED, undoes
its patches, stops its heartbeat and swaps its methods (and the recorder's) for
no-ops: training goes on unmonitored rather than paying for a broken monitor.
Errors raised by the user's own code (their loader, their collective) are theirs
and pass through.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from watchdog.contracts import slot as wire
from watchdog.contracts.slot import (
    H_HOOK_ERRORS,
    Phase,
    RecordKind,
    Status,
)
from watchdog.hook.completion import flight_recorder, flight_recorder_reads
from watchdog.hook.completion import tracker as completion
from watchdog.hook.config import HookConfig
from watchdog.hook.errors import ErrorLog
from watchdog.hook.marks import frames, progress
from watchdog.hook.marks.loader import TimedLoader
from watchdog.hook.marks.recorder import NEVER, Recorder
from watchdog.hook.marks.scopes import CollScope, PhaseScope, StepScope, coll_op_of, phase_of
from watchdog.hook.noop import NULL_MONITOR, nop
from watchdog.hook.slot import control_block as control
from watchdog.hook.slot.heartbeat import Heartbeat
from watchdog.hook.slot.slotwriter import SlotWriter

log = logging.getLogger("watchdog.hook")
T = TypeVar("T")

# Methods replaced when the monitor goes quiet (closed, disabled, forked child).
_QUIET = {
    "step": NULL_MONITOR.step,
    "step_scope": NULL_MONITOR.step_scope,
    "wrap_loader": NULL_MONITOR.wrap_loader,
    "phase": NULL_MONITOR.phase,
    "collective": NULL_MONITOR.collective,
    "watch_ddp": NULL_MONITOR.watch_ddp,
    "set_step": NULL_MONITOR.set_step,
    "data_wait_begin": NULL_MONITOR.data_wait_begin,
    "data_wait_end": NULL_MONITOR.data_wait_end,
    "_poll_control": nop,
    "_poll_flight": nop,
    "_poll_completions": nop,
    "_poll_progress": nop,
    "_poll_frame": nop,
    "_poll_pg": nop,
}


def _nothing(mon: Any) -> None:
    return None


class Monitor:
    """The live monitor of one rank. Create it with ``watchdog.hook.install()``."""

    enabled = True
    zero_code = False  # instrumented by `watchdog run` (watchdog.hook.zero_code.auto): a script's install() returns it

    def __init__(
        self,
        config: HookConfig,
        slot: SlotWriter,
        identity: wire.Identity,
        *,
        slot_path: str | None,
        start_ns: int,
        clock: Callable[[], int] = time.monotonic_ns,
        on_close: Callable[[Monitor], None] = _nothing,
    ) -> None:
        self.config = config
        self.identity = identity
        self.slot_path = slot_path
        self.slot = slot
        self.recorder = Recorder(slot, clock, start_ns, on_error=self.report_error, on_control_due=nop)
        # the recorder's own bound step (see the module docstring): no extra frame per step
        self.step = self.recorder.step  # type: ignore[method-assign]
        self._clock = clock
        self._on_close = on_close  # lifecycle forgets us (passed in: no import cycle)
        self._owner_pid = os.getpid()
        self._phase_scopes = {int(p): PhaseScope(self.recorder, int(p)) for p in Phase}
        self._step_scope = StepScope(self.recorder)
        # control (agent -> hook): polled by the heartbeat, run by the recorder at the step due
        self.control = control.ControlBlock(
            slot, self.recorder, clock, lambda: self.phase(Phase.CHECKPOINT), self._dump_flight_recorder, NEVER
        )
        self.recorder.on_control_due = self.control.run
        self._poll_control: Callable[[], object] = self.control.poll
        # health
        self._errors = 0
        self._errlog = ErrorLog()
        self._closed = False
        self._disabled = False
        self._failed = False  # an uncaught exception is ending the process
        self._undo: list[Callable[[], None]] = []  # unpatch / unregister, run at close
        self._auto_off: dict[str, Callable[[], None]] = {}  # automatic source -> switch it off (hand_over)
        # The Flight Recorder, read on the heartbeat thread only (flight_recorder.py);
        # off by configuration, it is a no-op decided here.
        self.flight = flight_recorder.FlightRecorderSource(
            flight_recorder.json_dumper,
            slot.write_events,
            clock,
            lambda: self.recorder.steps,
            since_wall_ns=time.time_ns(),
            mark=slot.write,
        )
        self.flight_reads = flight_recorder_reads.FlightRecorderReads(
            self.flight, self.recorder, slot.words, clock, config.heartbeat_interval_s
        )
        self._poll_flight: Callable[[], object] = (
            self.flight_reads.poll if getattr(config, "flight_recorder", True) else nop
        )
        # GPU-side completion times: None (and no cost anywhere) unless use_completions() is called
        self.completions: completion.CompletionTracker | None = None
        self._poll_completions: Callable[[], object] = nop
        # Progress the script does not report, and the automatic eval phase: None (and
        # no hook registered) unless use_progress() is called (install, by configuration).
        self.progress: progress.Progress | None = None
        self._poll_progress: Callable[[], object] = nop
        # Where the training thread is during a long step (frames.py): nop unless use_frames() is called.
        self._poll_frame: Callable[[], object] = nop
        # A process group made where the init wrapper could not see it (collectives.joined_poll)
        self._poll_pg: Callable[[], object] = nop
        self.heartbeat = Heartbeat(
            slot.put, config.heartbeat_interval_s, clock, self._poll_background, self.report_error
        )

    # -- public API ----------------------------------------------------------------

    @property
    def errors(self) -> int:
        """Errors the hook caught and swallowed since install."""
        return self._errors

    @property
    def status(self) -> Status:
        return Status(self.recorder.status)

    def stats(self) -> dict[str, int]:
        fr = {"fr_written": self.flight.written, "fr_skipped": self.flight.skipped}
        return {"errors": self._errors, "steps": self.recorder.steps, **self.control.counters, **fr}

    def step(
        self, loss: float | None = None
    ) -> None:  # replaced per instance by the recorder's own step (see __init__)
        """Mark the end of the step in progress (and the start of the next).
        ``loss``: the step's loss as a Python float (``loss.item()``, which the
        training loop usually computes anyway; a GPU tensor is not synchronised,
        it is ignored), for the coordinator's ``loss_anomaly`` detector."""
        self.recorder.step(loss)

    def step_scope(self) -> StepScope:
        """``with mon.step_scope(): ...`` — the step ends when the block exits
        normally (a raising step is not counted; its time goes to the next one).
        It starts at the block's entry unless waits were already recorded for it
        (a wrapped loader's fetch just before the block), which then belong to it."""
        return self._step_scope

    def wrap_loader(
        self, iterable: Iterable[T], *, device: Any = None, non_blocking: bool = False, batch_size: int = 0
    ) -> Iterable[T]:
        """An iterable over ``iterable`` whose every fetch is timed as a data wait.
        Wrap once: a loader wrapped twice counts its waits twice.
        ``device``: move each batch there, timing the copy (host-to-device time).
        ``batch_size``: this rank's samples per step, when the loader has no
        ``batch_size`` attribute and its batches no leading dimension to read."""
        if device is not None:
            device = _checked_device(device)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
            raise ValueError(f"wrap_loader: batch_size must be an int >= 0, got {batch_size!r}")
        return TimedLoader(iterable, self.recorder, device=device, non_blocking=non_blocking, batch_size=batch_size)

    def data_wait_begin(self) -> None:
        """A data wait starts now, for code that sees batches come and go but not
        the loader's fetch (a framework callback: batch end -> next batch start).
        Scripts that iterate a loader use ``wrap_loader`` instead."""
        self.recorder.data_enter()

    def data_wait_end(self, counted: bool = True) -> None:
        """The wait opened by ``data_wait_begin`` ends now and counts as one data
        wait of the step in progress; ``counted=False`` drops it (the gap was
        validation or a checkpoint). Without an open wait it does nothing."""
        self.recorder.data_exit(counted)

    def set_batch_size(self, samples: int) -> None:
        """This rank's samples per step (when no wrapped loader tells): after an
        elastic restart, ``batch_changed`` then gives old and new global batch."""
        if isinstance(samples, bool) or not isinstance(samples, int) or samples <= 0:
            raise ValueError(f"set_batch_size: expected an int > 0, got {samples!r}")
        self.recorder.set_batch(samples)

    def phase(self, name: Any) -> PhaseScope:
        """``with mon.phase("checkpoint"): ...`` — a Phase or its label; unknown
        names count as Phase.OTHER. Nested phases restore the outer one on exit.
        Phases are per process: mark them from one thread."""
        return self._phase_scopes[phase_of(name)]

    def collective(self, op: Any, group: Any = None, nbytes: int = 0) -> CollScope:
        """Time a collective the hook cannot see by itself (custom comm library):
        ``with mon.collective("all_reduce", group=pg, nbytes=n): ...``."""
        return CollScope(self.recorder.collectives, (coll_op_of(op), group, int(nbytes)))

    def watch_ddp(self, model: Any, *, hook: Callable | None = None, state: Any = None) -> None:
        """Register a DDP comm hook that times each gradient bucket's all-reduce.
        ``hook``/``state``: the comm hook to wrap (default: torch's allreduce_hook)."""
        from watchdog.hook.zero_code.ddp import register

        register(self.recorder.collectives, model, hook=hook, state=state)

    def watch_model(self, model: Any, optimizer: Any) -> Any:
        """Opt-in finer split of compute: forward, backward, optimizer per step
        (``watchdog.hook.marks.model_split``); returns the ``ModelSplit`` to read."""
        from watchdog.hook.marks.model_split import ModelSplit

        rec = self.recorder
        split = ModelSplit(self._clock, rec.split).watch(model, optimizer)
        rec.split_on = True
        return split

    def register_checkpoint(self, fn: Callable[[int], Any]) -> None:
        """``fn(step)`` saves a checkpoint; the agent can request one through the
        slot (Command.CHECKPOINT_AT_STEP); it runs on the training thread right
        after the requested step completes, inside Phase.CHECKPOINT."""
        if not callable(fn):
            raise ValueError(f"register_checkpoint: {fn!r} is not callable")
        self.control.checkpoint_fn = fn

    def set_step(self, step: int) -> None:
        """Set the completed-step count (a job resumed at step S calls set_step(S)),
        so the slot and checkpoint requests use the job's own numbering."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"set_step: step must be an int >= 0, got {step!r}")
        try:
            self.recorder.set_step(step)
        except Exception as exc:
            self.report_error("set_step", exc)

    def close(self) -> None:
        """Stop the heartbeat, undo patches, mark the slot EXITED. Idempotent; also
        run at interpreter exit. The slot file stays for the agent's post-mortem."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._owner_pid:  # a forked child: the slot is the parent's
            self._go_quiet()
            return
        self._run_undo()
        self.heartbeat.stop()
        self._final_flight_read()
        self._final_completions()
        if not self._disabled and not self._failed:
            self.recorder.set_status(Status.EXITED)
        self._go_quiet()
        self._on_close(self)
        self.slot.detach()  # late writers (a callback in flight on another thread) land in scratch memory

    def __repr__(self) -> str:
        return f"Monitor(rank={self.identity.rank}, slot={self.slot_path!r}, status={self.status.name})"

    def _final_flight_read(self) -> None:
        """At exit, with the heartbeat stopped and training over: the collectives
        since the last beat (a job that fails within milliseconds of a mismatched
        collective must still leave its shapes in the slot)."""
        try:
            if self._poll_flight is not nop:
                self.flight.poll(force=True)
        except Exception:
            pass

    def _final_completions(self) -> None:
        """At exit: the accelerator work done since the last beat (a script that
        synchronised before exiting leaves its last steps' GPU times)."""
        try:
            self._poll_completions()
        except Exception:
            pass

    # -- background (heartbeat thread) ---------------------------------------------

    def use_completions(self, source: completion.CompletionSource) -> None:
        """Track when the accelerator reaches each collective and step boundary
        (install: a CUDA event source when a GPU is there; tests: a fake). Before
        collectives are patched, so the patch can add the marker."""
        tracker = completion.CompletionTracker(source, self.slot.write_events, self._clock)
        self.completions = tracker
        self._poll_completions = tracker.poll
        step = self.recorder.step
        rec = self.recorder

        def step_and_mark(loss: float | None = None) -> None:
            step(loss)
            try:
                tracker.submit(completion.STEP, 0, rec.steps, rec.steps)
            except Exception as exc:
                self.report_error("completion", exc)

        self.step = step_and_mark  # type: ignore[method-assign]

    def use_progress(self) -> None:
        """Count forwards, backwards and optimizer steps, and open the automatic
        eval phase from them (watchdog.hook.marks.progress). Raises ImportError without torch."""
        source = progress.Progress(self.recorder, self.slot, self._clock, self.config.progress_stale_s)
        source.install(self._undo)
        self.progress = source
        self._poll_progress = source.poll

    def use_frames(self) -> None:
        """Sample the calling (training) thread's frame in the user's script during
        long steps, on the heartbeat (watchdog.hook.marks.frames)."""
        self._poll_frame = frames.FrameSampler(self.slot, self._clock).poll

    def watch_pg(self, poll: Callable[[], object]) -> None:
        """Run ``poll`` on every heartbeat (collectives.patch: the process group's join)."""
        self._poll_pg = poll

    def _poll_background(self) -> None:
        self._poll_control()
        self._poll_flight()
        self._poll_completions()
        self._poll_progress()
        self._poll_frame()
        self._poll_pg()

    def _dump_flight_recorder(self) -> int:
        """Heartbeat thread, asked by the agent (Command.DUMP_FLIGHT_RECORDER): write
        this rank's FR dump (JSON: the agent never unpickles a rank's file) next to
        the slot, whole or not at all, for the agent to collect as evidence."""
        dump = flight_recorder.json_dumper()
        if dump is None or self.slot_path is None or not getattr(self.config, "flight_recorder", True):
            return control.ACK_NO_HANDLER
        try:
            flight_recorder.write_dump(wire.fr_dump_filename(self.slot_path), dump())
        except Exception as exc:
            log.warning("watchdog.hook flight recorder dump failed: %s", exc)
            return control.ACK_SAVE_FAILED
        return control.ACK_OK

    # -- the seam: install, zero-code sources, framework callbacks, process hooks ----

    @property
    def disabled(self) -> bool:
        """Turned off by its own errors (max_errors): training goes on unmonitored."""
        return self._disabled

    def add_undo(self, fn: Callable[[], None]) -> None:
        """``fn`` unpatches or unregisters something installed for this monitor; run
        at close or disable, newest first, each alone (one that raises is logged)."""
        self._undo.append(fn)

    def add_automatic(self, source: str, off: Callable[[], None]) -> None:
        """An automatic source (``"step"``, ``"data"``, ``"save"``) is on; ``off``
        switches it off for good (``hand_over``)."""
        self._auto_off[source] = off

    def hand_over(self, *sources: str) -> None:
        """Switch the automatic ``sources`` off now: a framework callback marks them
        itself from here on. Nothing to do for a source not on (or already off)."""
        for source in sources:
            fn = self._auto_off.pop(source, None)
            if fn is not None:
                try:
                    fn()
                except Exception as exc:
                    self.report_error("hand_over", exc)

    def mark_failed(self) -> None:
        """The rank is crashing (the excepthook, a failing exit: see lifecycle)."""
        if not self._closed and not self._disabled:
            self._failed = True
            self.recorder.set_status(Status.FAILED)

    def after_fork_in_child(self) -> None:
        """The child shares our mapping but is not this rank: never write to it."""
        self._closed = True
        self._go_quiet()

    # -- failure handling --------------------------------------------------------

    def report_error(self, where: str, exc: BaseException) -> None:
        """An error the hook caught at ``where``: count, log (rate-limited), record;
        disable at max_errors. Never raises."""
        if self._closed or self._disabled:
            return
        try:
            slot = self.slot
            with slot.lock:
                self._errors += 1
                total = self._errors
                try:
                    slot.write(((H_HOOK_ERRORS, total),), (RecordKind.ERROR, self._clock(), self.recorder.steps, total))
                except Exception:
                    pass  # the slot itself is what fails; the in-process count still holds
            self._errlog.report(where, exc, total)
            if total >= self.config.max_errors:
                self._disable(f"{total} errors")
        except Exception:
            pass

    def _disable(self, reason: str) -> None:
        if self._disabled:
            return
        self._disabled = True
        self.recorder.set_status(Status.DISABLED)
        log.warning("watchdog.hook disabled reason=%r: training continues unmonitored", reason)
        self._run_undo()
        self.heartbeat.stop(timeout_s=0.5)
        self._go_quiet()

    def _go_quiet(self) -> None:
        self.recorder.go_quiet()  # for iterators, scopes and wrappers created before now
        for name, fn in _QUIET.items():
            setattr(self, name, fn)

    def _run_undo(self) -> None:
        undo, self._undo = self._undo, []
        for fn in reversed(undo):
            try:
                fn()
            except Exception:
                log.debug("watchdog.hook undo failed", exc_info=True)


def _checked_device(device: Any) -> Any:
    """Misuse fails at wrap time: a device torch cannot name raises here, not mid-epoch."""
    import torch

    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"wrap_loader: device {device!r} is not a torch device: {exc}") from None
