"""Collective marks: "in collective #k of group g since t" for a live reader, and
the collective time of the step in progress for the step's record.

``enter`` and ``exit`` are the one generic implementation, called by
``mon.collective``, the DDP comm hook and the patched collectives' cold paths
(async completion, a raising collective); ``exit`` may run on the backend's
thread (async work), hence the slot writer's lock around the counters too. Like
the recorder's step, both open the SlotWriter's bracket inline: they run once
per collective, and a call costs more than the stores it brackets
(tests/test_hook_slotwriter.py proves the bytes are the bracket's).

Deliberate copy. The patched torch collectives (collectives.py,
``make_collective_wrapper``) write ``enter`` and the synchronous ``exit`` out in
their own body: two calls and a token tuple per collective were ~8% of a
step's hook cost. The copy must change with this one:
tests/test_hook_inline.py proves both leave identical slot bytes.

The step's view. ``outstanding``, ``span_start``, ``this_step_ns``, ``this_step_count``,
``this_step_bytes`` and ``current`` are read, and the per-step ones reset, by ``Recorder.step``
under the same lock: collective time is the union of overlapping collectives
(concurrent async work counts once), and a collective spanning a step boundary
is split between the two steps.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from watchdog.contracts.slot import (
    H_COLL_BYTES,
    H_COLL_DONE_SEQ,
    H_COLL_ENTER_NS,
    H_COLL_EXIT_NS,
    H_COLL_GROUP,
    H_COLL_OP,
    H_COLL_OUTSTANDING,
    H_COLL_SEQ,
    WORD,
)
from watchdog.hook.marks.groups import GroupCounters, GroupTable
from watchdog.hook.noop import nop
from watchdog.hook.slot.slotwriter import SlotWriter, inline_seqlock, seqlocked

# H_COLL_GROUP, _SEQ, _OP, _BYTES, _ENTER_NS, _EXIT_NS, _OUTSTANDING, _DONE_SEQ
# are contiguous: one pack at enter; the last three at exit (native order: see
# slotwriter.pack_record).
_pack_coll = struct.Struct("8q").pack_into
_COLL_OFF = H_COLL_GROUP * WORD
_pack_exit = struct.Struct("3q").pack_into
_EXIT_OFF = H_COLL_EXIT_NS * WORD

if list(range(H_COLL_GROUP + 1, H_COLL_GROUP + 8)) != [
    H_COLL_SEQ,
    H_COLL_OP,
    H_COLL_BYTES,
    H_COLL_ENTER_NS,
    H_COLL_EXIT_NS,
    H_COLL_OUTSTANDING,
    H_COLL_DONE_SEQ,
]:  # pragma: no cover
    raise ImportError("watchdog.hook.marks.collective_marks: wire layout changed; update the packed stores")


class CollectiveMarks:
    # Slots for cheap attribute access; ``__dict__`` for the methods swapped out
    # by go_quiet (and tests' monkeypatching).
    __slots__ = (
        "__dict__",
        "_by_handle",
        "_clock",
        "_last_exit",
        "_slot",
        "current",
        "groups",
        "on_error",
        "outstanding",
        "quiet",
        "span_start",
        "suppress_tid",
        "this_step_bytes",
        "this_step_count",
        "this_step_ns",
    )  # fmt: skip

    def __init__(self, slot: SlotWriter, clock: Callable[[], int], *, on_error: Callable[[str, BaseException], None]):
        self._slot = slot
        self._clock = clock
        self.on_error = on_error
        self.groups = GroupTable()
        self._by_handle = self.groups.by_handle  # the hot lookup (reset in place)
        self.suppress_tid = 0  # thread inside watch_ddp's hook: don't count its inner all_reduce
        self.outstanding = 0  # entered and not yet completed
        self.span_start = 0  # when outstanding last went 0 -> 1 (or the step boundary since)
        self.this_step_ns = 0  # union of collective time this step, up to span_start
        self.this_step_count = 0  # collectives entered this step
        self.this_step_bytes = 0  # and their bytes (the communication verdict's "bytes per step")
        self.current = GroupCounters(0)  # group of the last collective entered
        self._last_exit = 0
        self.quiet = False  # read by the inlined copy in the patched collectives, which cannot be swapped

    def go_quiet(self) -> None:
        """Entry points become no-ops: enter() then returns None and callers skip the exit."""
        self.quiet = True
        for name in ("enter", "exit", "exit_failed", "reset_groups"):
            setattr(self, name, nop)

    @inline_seqlock
    def enter(self, op: int, group: Any, nbytes: int) -> tuple[Any, int] | None:
        """Mark a collective entered; returns the token for exit(), or None if
        the mark failed (reported; the caller then skips the exit)."""
        try:
            clock = self._clock
            now = clock()
            st = self._by_handle.get(group)
            if st is None:
                st = self.groups.add(group)
            slot = self._slot
            lock = slot.lock
            lock.acquire()
            try:
                seq = st.seq + 1
                st.seq = seq
                out = self.outstanding + 1
                if out == 1:
                    self.span_start = now
                self.outstanding = out
                self.this_step_count += 1
                self.this_step_bytes += nbytes
                self.current = st
                with seqlocked(slot) as w:
                    _pack_coll(w, _COLL_OFF, st.key, seq, op, nbytes, now, self._last_exit, out, st.done)
            finally:
                lock.release()
            return st, seq
        except Exception as exc:
            self.on_error("collective", exc)
            return None

    @inline_seqlock
    def exit(self, token: tuple[GroupCounters, int]) -> None:
        """Mark a collective completed. May run on another thread (async work)."""
        try:
            clock = self._clock
            now = clock()
            st, seq = token
            slot = self._slot
            lock = slot.lock
            lock.acquire()
            try:
                out = self.outstanding
                if out:
                    out -= 1
                    self.outstanding = out
                    if not out:  # the union of overlapping collectives ends here
                        self.this_step_ns += now - self.span_start
                if seq > st.done:
                    st.done = seq
                self._last_exit = now
                with seqlocked(slot) as w:
                    # DONE_SEQ describes H_COLL_GROUP: rewrite it with that group's value
                    _pack_exit(w, _EXIT_OFF, now, out, self.current.done)
            finally:
                lock.release()
        except Exception as exc:
            self.on_error("collective", exc)

    def exit_failed(self, token: tuple[GroupCounters, int]) -> None:
        """The collective raised, or its work failed: the rank failed inside it.
        The counters move on as for any exit (a caught error leaves the step's
        accounting and the next collective's numbers right), but the header keeps
        saying "in collective #k since t, not completed" until the next collective
        rewrites it. A rank that dies of the error (a peer gone: "Connection reset
        by peer") is then seen dead inside the collective it was waiting in, not as
        one that never entered it: that would make it the culprit and spare the
        rank that really failed (seen on real runs: a SIGKILLed rank spared, its
        victims named)."""
        try:
            now = self._clock()
            st, seq = token
            with self._slot.lock:
                out = self.outstanding
                if out:
                    out -= 1
                    self.outstanding = out
                    if not out:
                        self.this_step_ns += now - self.span_start
                if seq > st.done:
                    st.done = seq
                self._last_exit = now
        except Exception as exc:
            self.on_error("collective", exc)

    def exit_on_completion(self, work: Any, token: tuple) -> None:
        """Async work: mark the exit when its future completes (backend thread)."""
        try:
            fut = work.get_future()
        except Exception:  # no future (coalescing placeholder, some backends): done now
            self.exit(token)
            return
        try:
            fut.then(lambda f: self._completed(f, token))
        except Exception as exc:
            self.exit(token)
            self.on_error("collective_future", exc)

    def _completed(self, fut: Any, token: tuple) -> None:
        try:
            fut.value()  # completed: returns at once, or raises the work's error
        except Exception:
            self.exit_failed(token)
            return
        self.exit(token)

    def reset_groups(self, group: Any = None) -> None:
        """Forget sequence numbers: all of them, or one subgroup's (groups.py)."""
        with self._slot.lock:
            self.groups.reset(group)
