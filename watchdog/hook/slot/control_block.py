"""The hook's side of the agent -> hook control block (its format: watchdog.contracts.control_block).

``ControlBlock`` reads a request on the heartbeat thread (``poll``), runs a
requested checkpoint on the training thread at its step (``run``) and
acknowledges both (``ack``: H_CTRL_ACK_RESULT, _STEP and _NS first,
H_CTRL_ACK_SEQ last). The monitor hands its ``poll`` to the heartbeat and its
``run`` to the recorder (``on_control_due``), as callables; it holds the
pending request, the checkpoint function and the counters ``Monitor.stats``
reports.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from watchdog.contracts.control_block import (
    ACK_NO_HANDLER,
    ACK_OK,
    ACK_REJECTED,
    ACK_SAVE_FAILED,
    ControlRequest,
    read_request,
    rejection,
)
from watchdog.contracts.slot import (
    H_CTRL_ACK_NS,
    H_CTRL_ACK_RESULT,
    H_CTRL_ACK_SEQ,
    H_CTRL_ACK_STEP,
    Command,
    RecordKind,
)

log = logging.getLogger("watchdog.hook")


class ControlBlock:
    """Reads the agent's requests (heartbeat thread: ``poll``), runs a requested
    checkpoint at its step boundary (training thread: ``run``), acknowledges both."""

    def __init__(
        self,
        slot: Any,
        recorder: Any,
        clock: Callable[[], int],
        checkpoint_phase: Callable[[], AbstractContextManager],
        dump_flight_recorder: Callable[[], int],
        never: int,
    ) -> None:
        self._slot = slot  # SlotWriter
        self._rec = recorder  # its control_due says when run() is due; its steps the ack's step
        self._clock = clock
        self._checkpoint_phase = checkpoint_phase  # the monitor's phase(Phase.CHECKPOINT), as the script would open it
        self._dump_flight_recorder = dump_flight_recorder  # () -> ACK_* code
        self._never = never  # recorder.NEVER: no request due
        self._lock = threading.Lock()
        self._seen = 0
        self._pending: ControlRequest | None = None
        self.checkpoint_fn: Callable[[int], Any] | None = None
        self.counters = {"ctrl_rejected": 0, "ctrl_done": 0, "save_failures": 0, "fr_dumps": 0}

    def poll(self) -> None:
        """Heartbeat thread: notice a new request; the training thread acts on it
        at its next step boundary (step() compares one int: ``recorder.control_due``)."""
        req = read_request(self._slot.words, self._seen)
        if req is None:
            return
        self._seen = req.seq
        why = rejection(req)
        rec = self._rec
        with self._lock:
            self._pending = None  # a new request supersedes the pending one
            rec.control_due = self._never
            if why is None and req.command == Command.CHECKPOINT_AT_STEP:
                self._pending = req
                rec.control_due = req.arg
                log.info("watchdog.hook control=checkpoint_at_step step=%d seq=%d", req.arg, req.seq)
                return
        if why is None and req.command == Command.DUMP_FLIGHT_RECORDER:
            result = self._dump_flight_recorder()
            if result == ACK_OK:
                self.counters["fr_dumps"] += 1
            self.ack(req, result)
            return
        if why is None:  # Command.NONE: cancelled
            self.ack(req, ACK_OK)
            return
        self.counters["ctrl_rejected"] += 1
        log.warning("watchdog.hook control rejected seq=%d reason=%s", req.seq, why)
        self.ack(req, ACK_REJECTED)

    def run(self, step: int) -> None:
        """Training thread, at a step boundary at or past the requested step."""
        with self._lock:
            req, self._pending = self._pending, None
            self._rec.control_due = self._never
        if req is None:
            return
        fn = self.checkpoint_fn
        if fn is None:
            log.warning("watchdog.hook checkpoint requested at step=%d but no function registered", step)
            self.ack(req, ACK_NO_HANDLER)
            return
        result = ACK_OK
        with self._checkpoint_phase():
            try:
                fn(step)
            except Exception as exc:  # the user's save failed: report it, keep training
                result = ACK_SAVE_FAILED
                self.counters["save_failures"] += 1
                exc_info = (type(exc), exc, exc.__traceback__)
                log.warning("watchdog.hook requested checkpoint failed step=%d", step, exc_info=exc_info)
        self.counters["ctrl_done"] += 1
        self.ack(req, result)

    def ack(self, req: ControlRequest, result: int) -> None:
        now = self._clock()
        slot = self._slot
        with slot.lock:
            step = self._rec.steps
            slot.put(H_CTRL_ACK_RESULT, result)
            slot.put(H_CTRL_ACK_STEP, step)
            slot.put(H_CTRL_ACK_NS, now)
            slot.put(H_CTRL_ACK_SEQ, req.seq)  # last: the agent trusts the ack words once this matches
            slot.write((), (RecordKind.CONTROL, now, step, req.seq, req.command, result))
