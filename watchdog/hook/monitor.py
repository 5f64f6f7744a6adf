"""The Monitor: turns training events into stores into the rank's slot.

Hot paths (step, data wait, collective enter/exit) are written for cost: state in
plain attributes, one clock read per event, the header update and ring record
packed with precompiled structs, one RLock held only around the stores. Per step
the hook writes one ring record; data waits and collectives only update the few
header words a live reader needs ("waiting on data since t", "in collective #k
since t") and accumulate in Python ints until the step ends.

Seqlock. Words H_STEP .. H_LAST_DYNAMIC change only between an odd and an even
store of H_SEQ. ``self._seq`` is our own copy: the slot is never read back (except
the control words), so garbage written into it by someone else cannot steer us.
The lock makes the bracket safe against the other writers in this process (DDP's
comm-hook callbacks run on the backend's thread); it is reentrant so that a
signal handler that marks a phase while the main thread is inside a bracket
cannot deadlock.

Failure policy. Every hooked path catches Exception, counts it (``errors`` here,
H_HOOK_ERRORS in the slot), logs it once, and carries on; at ``max_errors`` the
monitor writes Status.DISABLED and swaps its methods for no-ops. Errors raised by
the user's code (their loader, their collective) are theirs and pass through.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from typing import Any, Callable, Iterable, Iterator, TypeVar

from watchdog import wire
from watchdog.hook import control
from watchdog.hook.errors import ErrorLog
from watchdog.hook.heartbeat import Heartbeat
from watchdog.hook.noop import NULL_CONTEXT, NULL_MONITOR, nop
from watchdog.hook.slotfile import SlotMapping
from watchdog.wire import (
    H_COLL_BYTES,
    H_COLL_DONE_SEQ,
    H_COLL_ENTER_NS,
    H_COLL_OP,
    H_COLL_SEQ,
    H_LAST_COLL_NS,
    H_LAST_DATA_NS,
    H_LAST_STEP_NS,
    H_TOTAL_COLL_NS,
    H_TOTAL_DATA_NS,
    H_TOTAL_STEP_NS,
    R_A,
    R_G,
    R_INDEX,
    R_KIND,
    R_STEP,
    R_T_NS,
    H_COLL_EXIT_NS,
    H_COLL_GROUP,
    H_COLL_OUTSTANDING,
    H_CTRL_ACK_NS,
    H_CTRL_ACK_RESULT,
    H_CTRL_ACK_SEQ,
    H_CTRL_ACK_STEP,
    H_DATA_ENTER_NS,
    H_DATA_EXIT_NS,
    H_HOOK_ERRORS,
    H_PG_CHANGE_NS,
    H_PG_STATE,
    H_PHASE,
    H_PHASE_SINCE_NS,
    H_RING_HEAD,
    H_SEQ,
    H_STATUS,
    H_STEP,
    H_STEP_START_NS,
    WORD,
    CollOp,
    Command,
    Phase,
    PgState,
    RecordKind,
    Status,
)

log = logging.getLogger("watchdog.hook")
T = TypeVar("T")

_NEVER = 1 << 62  # "no control request due"
_REC_BYTES = wire.RECORD_WORDS * wire.WORD
# H_STEP .. H_TOTAL_COLL are contiguous: one pack per step instead of eight stores.
_pack_step = struct.Struct("<8q").pack_into
_STEP_OFF = H_STEP * WORD
# H_COLL_GROUP, _SEQ, _OP, _BYTES, _ENTER_NS, _EXIT_NS, _OUTSTANDING, _DONE_SEQ
# are contiguous: one pack at enter, one (the last three) at exit.
_pack_coll = struct.Struct("<8q").pack_into
_COLL_OFF = H_COLL_GROUP * WORD
_pack_exit = struct.Struct("<3q").pack_into
_EXIT_OFF = H_COLL_EXIT_NS * WORD
# The packs above rely on wire's word order; fail at import, not with a garbled slot.
if not (
    [H_STEP_START_NS, H_LAST_STEP_NS, H_LAST_DATA_NS, H_LAST_COLL_NS, H_TOTAL_STEP_NS, H_TOTAL_DATA_NS, H_TOTAL_COLL_NS]
    == list(range(H_STEP + 1, H_STEP + 8))
    and [H_COLL_SEQ, H_COLL_OP, H_COLL_BYTES, H_COLL_ENTER_NS, H_COLL_EXIT_NS, H_COLL_OUTSTANDING, H_COLL_DONE_SEQ]
    == list(range(H_COLL_GROUP + 1, H_COLL_GROUP + 8))
    and (R_INDEX, R_KIND, R_T_NS, R_STEP, R_A, R_G) == (0, 1, 2, 3, 4, 10)
):  # pragma: no cover
    raise ImportError("watchdog.hook.monitor: wire layout changed; update the packed stores")
# A ring record up to R_G; the rest of the record stays zero.
_pack_rec = struct.Struct("<11q").pack_into

_STEP_END = int(RecordKind.STEP_END)
_PHASE_LABELS = {p.label: int(p) for p in Phase}


def phase_of(name: Any) -> int:
    """A Phase value from a Phase, an int or a label; anything else is OTHER."""
    if isinstance(name, Phase):
        return int(name)
    if isinstance(name, str):
        return _PHASE_LABELS.get(name.strip().lower(), int(Phase.OTHER))
    if isinstance(name, int) and not isinstance(name, bool) and name in Phase._value2member_map_:
        return int(name)
    return int(Phase.OTHER)


def coll_op_of(op: Any) -> int:
    if isinstance(op, str):
        try:
            return int(CollOp[op.strip().upper()])
        except KeyError:
            return int(CollOp.OTHER)
    try:
        return int(CollOp(op))
    except (ValueError, TypeError):
        return int(CollOp.OTHER)


class _Group:
    """Collective counters of one process group (shared by every handle to it)."""

    __slots__ = ("key", "seq", "done")

    def __init__(self, key: int) -> None:
        self.key = key
        self.seq = 0  # collectives entered
        self.done = 0  # highest seq completed


class _StepScope:
    __slots__ = ("_mon",)

    def __init__(self, mon: Monitor) -> None:
        self._mon = mon

    def __enter__(self) -> None:
        self._mon._scope_enter()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self._mon.step()


class _PhaseScope:
    __slots__ = ("_mon", "_phase")

    def __init__(self, mon: Monitor, phase: int) -> None:
        self._mon = mon
        self._phase = phase

    def __enter__(self) -> None:
        self._mon._phase_enter(self._phase)

    def __exit__(self, exc_type, exc, tb) -> None:
        self._mon._phase_exit()


class _CollScope:
    __slots__ = ("_mon", "_args", "_token")

    def __init__(self, mon: Monitor, args: tuple) -> None:
        self._mon = mon
        self._args = args

    def __enter__(self) -> None:
        self._token = self._mon._coll_enter(*self._args)

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._token is not None:
            self._mon._coll_exit(self._token)


class _TimedIterator:
    """``next()`` on the user's iterator, bracketed by data-wait marks."""

    __slots__ = ("_next", "_mon")

    def __init__(self, it: Iterator, mon: Monitor) -> None:
        self._next = it.__next__
        self._mon = mon

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self):
        return self._mon._fetch(self._next)


class TimedLoader:
    """What ``wrap_loader`` returns: iterating it times every fetch. ``len()`` and
    attributes (``sampler``, ``dataset``, ...) are the wrapped object's."""

    def __init__(self, iterable: Iterable, mon: Monitor) -> None:
        self._iterable = iterable
        self._mon = mon

    def __iter__(self) -> Iterator:
        return _TimedIterator(iter(self._iterable), self._mon)

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_iterable", "_mon"):
            raise AttributeError(name)
        return getattr(self._iterable, name)


def _call(fn: Callable[[], T]) -> T:
    return fn()


def _call_through(orig: Callable, args: tuple, kwargs: dict, *_: Any):
    return orig(*args, **kwargs)


# Methods replaced by no-ops when the monitor goes quiet (closed, disabled, forked).
_QUIET = {
    "step": NULL_MONITOR.step,
    "step_scope": NULL_MONITOR.step_scope,
    "wrap_loader": NULL_MONITOR.wrap_loader,
    "phase": NULL_MONITOR.phase,
    "collective": NULL_MONITOR.collective,
    "watch_ddp": NULL_MONITOR.watch_ddp,
    "set_step": NULL_MONITOR.set_step,
    "_scope_enter": nop,
    "_fetch": _call,
    "_coll_enter": nop,  # returns None: callers then skip the exit
    "_coll_exit": nop,
    "_collective": _call_through,
    "_phase_enter": nop,
    "_phase_exit": nop,
    "_set_pg": nop,
    "_poll_control": nop,
    "_run_control": nop,
}


class Monitor:
    """The live monitor of one rank. Create it with ``watchdog.hook.install()``."""

    enabled = True

    def __init__(
        self,
        config,
        mapping: SlotMapping,
        identity: wire.Identity,
        *,
        start_ns: int,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.config = config
        self.identity = identity
        self.slot_path = mapping.path
        self._mm = mapping.mm
        self._w = memoryview(self._mm).cast("q")
        self._clock = clock
        self._lock = threading.RLock()
        self._owner_pid = os.getpid()
        self._seq = 0
        self._head = 0
        self._cap = config.ring_capacity
        self._ring0 = wire.RING_OFFSET
        # step accounting: Python ints, written to the slot once per step
        self._step = 0
        self._step_start = start_ns
        self._acc_data = 0
        self._n_data = 0
        self._acc_coll = 0
        self._n_coll = 0
        self._tot_step = 0
        self._tot_data = 0
        self._tot_coll = 0
        # collectives
        self._groups: dict[Any, _Group] = {}  # group handle (None = default) -> counters
        self._groups_by_key: dict[int, _Group] = {}
        self._group_name: Callable[[Any], str] = lambda g: str(getattr(g, "group_name", "") or "")
        self._outstanding = 0
        self._span_start = 0
        self._cur_group: _Group = _Group(0)  # group of the last collective entered
        self._last_exit = 0
        self._last_seq = 0
        self._suppress_tid = 0  # thread inside watch_ddp's hook: don't count its inner all_reduce
        # phases
        self._phase = int(Phase.TRAIN)
        self._phase_stack: list[int] = []
        self._phase_scopes = {int(p): _PhaseScope(self, int(p)) for p in Phase}
        self._step_scope = _StepScope(self)
        # control
        self._ctrl_lock = threading.Lock()
        self._ctrl_seen = 0
        self._ctrl_pending: control.Request | None = None
        self._ctrl_due = _NEVER
        self._checkpoint_fn: Callable[[int], Any] | None = None
        # health
        self._errors = 0
        self._errlog = ErrorLog()
        self._counters = {"ctrl_rejected": 0, "ctrl_done": 0, "save_failures": 0}
        self._status = int(Status.STARTING)
        self._closed = False
        self._disabled = False
        self._undo: list[Callable[[], None]] = []  # unpatch / unregister, run at close
        self._heartbeat = Heartbeat(self._w, config.heartbeat_interval_s, clock, self._poll_control, self._fail)

    # -- public API --------------------------------------------------------------

    @property
    def errors(self) -> int:
        """Errors the hook caught and swallowed since install."""
        return self._errors

    @property
    def status(self) -> Status:
        return Status(self._status)

    def stats(self) -> dict[str, int]:
        return {"errors": self._errors, "steps": self._step, **self._counters}

    def step(self) -> None:
        """Mark the end of the step in progress (and the start of the next)."""
        try:
            now = self._clock()
            lock = self._lock
            lock.acquire()
            try:
                step_ns = now - self._step_start
                coll = self._acc_coll
                if self._outstanding:  # a collective spans the boundary: split it
                    coll += now - self._span_start
                    self._span_start = now
                data = self._acc_data
                n = self._step + 1
                tot_step = self._tot_step + step_ns
                tot_data = self._tot_data + data
                tot_coll = self._tot_coll + coll
                head = self._head
                mm = self._mm
                w = self._w
                s = self._seq + 1
                w[H_SEQ] = s
                _pack_step(mm, _STEP_OFF, n, now, step_ns, data, coll, tot_step, tot_data, tot_coll)
                _pack_rec(
                    mm, self._ring0 + (head % self._cap) * _REC_BYTES,
                    head, _STEP_END, now, n, step_ns, data, coll,
                    self._n_coll, self._last_seq, self._phase, self._n_data,
                )  # fmt: skip
                w[H_RING_HEAD] = head + 1
                w[H_SEQ] = s + 1
                self._seq = s + 1
                self._head = head + 1
                self._step = n
                self._step_start = now
                self._tot_step = tot_step
                self._tot_data = tot_data
                self._tot_coll = tot_coll
                self._acc_data = self._n_data = self._acc_coll = self._n_coll = 0
            finally:
                lock.release()
            if n >= self._ctrl_due:
                self._run_control(n)
        except Exception as exc:
            self._fail("step", exc)

    def step_scope(self) -> _StepScope:
        """``with mon.step_scope(): ...`` — the step ends when the block exits
        normally (a raising step is not counted; its time goes to the next one).
        It starts at the block's entry unless waits were already recorded for it
        (a wrapped loader's fetch just before the block), which then belong to it."""
        return self._step_scope

    def wrap_loader(self, iterable: Iterable[T]) -> Iterable[T]:
        """An iterable over ``iterable`` whose every fetch is timed as a data wait."""
        return TimedLoader(iterable, self)

    def phase(self, name: Any) -> _PhaseScope:
        """``with mon.phase("checkpoint"): ...`` — a Phase or its label; unknown
        names count as Phase.OTHER. Nested phases restore the outer one on exit."""
        return self._phase_scopes[phase_of(name)]

    def collective(self, op: Any, group: Any = None, nbytes: int = 0) -> _CollScope:
        """Time a collective the hook cannot see by itself (custom comm library):
        ``with mon.collective("all_reduce", group=pg, nbytes=n): ...``."""
        return _CollScope(self, (coll_op_of(op), group, int(nbytes)))

    def watch_ddp(self, model: Any, *, hook: Callable | None = None, state: Any = None) -> None:
        """Register a DDP comm hook that times each gradient bucket's all-reduce.
        ``hook``/``state``: the comm hook to wrap (default: torch's allreduce_hook)."""
        from watchdog.hook.ddp import register

        register(self, model, hook=hook, state=state)

    def register_checkpoint(self, fn: Callable[[int], Any]) -> None:
        """``fn(step)`` saves a checkpoint; the agent can request one through the
        slot (Command.CHECKPOINT_AT_STEP); it runs on the training thread right
        after the requested step completes."""
        if not callable(fn):
            raise ValueError(f"register_checkpoint: {fn!r} is not callable")
        self._checkpoint_fn = fn

    def set_step(self, step: int) -> None:
        """Set the completed-step count (a job resumed at step S calls set_step(S)),
        so the slot and checkpoint requests use the job's own numbering."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"set_step: step must be an int >= 0, got {step!r}")
        self._write([(H_STEP, step)])
        self._step = step

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
        self._heartbeat.stop()
        if not self._disabled:
            self._set_status(Status.EXITED)
        self._go_quiet()
        from watchdog.hook import lifecycle

        lifecycle.forget(self)
        try:
            w, self._w = self._w, memoryview(bytearray(len(self._mm))).cast("q")
            w.release()
            self._mm.close()
        except Exception:
            pass  # some view is still exported: the mapping goes with the process

    def __repr__(self) -> str:
        return f"Monitor(rank={self.identity.rank}, slot={self.slot_path!r}, status={self.status.name})"

    # -- data waits --------------------------------------------------------------

    def _fetch(self, nxt: Callable[[], T]) -> T:
        """``nxt()`` timed as a data wait: enter and exit marks in one frame (hot)."""
        try:
            t0 = self._clock()
            lock = self._lock
            lock.acquire()
            try:
                w = self._w
                s = self._seq + 1
                w[H_SEQ] = s
                w[H_DATA_ENTER_NS] = t0
                w[H_SEQ] = s + 1
                self._seq = s + 1
            finally:
                lock.release()
        except Exception as exc:
            self._fail("data", exc)
            return nxt()
        try:
            return nxt()  # StopIteration and the loader's own errors pass through
        finally:
            try:
                now = self._clock()
                lock.acquire()
                try:
                    self._acc_data += now - t0
                    self._n_data += 1
                    s = self._seq + 1
                    w[H_SEQ] = s
                    w[H_DATA_EXIT_NS] = now
                    w[H_SEQ] = s + 1
                    self._seq = s + 1
                finally:
                    lock.release()
            except Exception as exc:
                self._fail("data", exc)

    def _scope_enter(self) -> None:
        if self._n_data or self._n_coll or self._outstanding:
            return  # waits already recorded for this step: it started before the block
        try:
            now = self._clock()
            self._write([(H_STEP_START_NS, now)])
            self._step_start = now
        except Exception as exc:
            self._fail("step_scope", exc)

    # -- collectives -------------------------------------------------------------

    def _group_for(self, group: Any) -> _Group:
        """Counters for a group handle; None is the default group (key 0). Handles
        with the same name share counters, so group=None and group=WORLD agree."""
        name = "" if group is None else self._group_name(group)
        key = wire.group_key(name)
        st = self._groups_by_key.setdefault(key, _Group(key))
        self._groups[group] = st
        return st

    def _reset_groups(self, group: Any = None) -> None:
        """Forget counters: all of them (default group destroyed or re-created,
        sequence numbers restart on every rank), or one subgroup's."""
        if group is None:
            self._groups = {}
            self._groups_by_key = {}
        else:
            st = self._groups.pop(group, None)
            if st is not None:
                self._groups_by_key.pop(st.key, None)

    def _coll_enter(self, op: int, group: Any, nbytes: int):
        """Mark a collective entered; returns the token for _coll_exit (or None)."""
        try:
            now = self._clock()
            st = self._groups.get(group)
            if st is None:
                st = self._group_for(group)
            lock = self._lock
            lock.acquire()
            try:
                seq = st.seq + 1
                st.seq = seq
                out = self._outstanding + 1
                if out == 1:
                    self._span_start = now
                self._outstanding = out
                self._n_coll += 1
                self._last_seq = seq
                self._cur_group = st
                w = self._w
                s = self._seq + 1
                w[H_SEQ] = s
                _pack_coll(self._mm, _COLL_OFF, st.key, seq, op, nbytes, now, self._last_exit, out, st.done)
                w[H_SEQ] = s + 1
                self._seq = s + 1
            finally:
                lock.release()
            return st, seq
        except Exception as exc:
            self._fail("collective", exc)
            return None

    def _collective(self, orig: Callable, args: tuple, kwargs: dict, op: int, group: Any, nbytes: int, work_type):
        """``orig(*args, **kwargs)`` marked as a collective: the patched torch
        functions' hot path. It is _coll_enter + call + _coll_exit written out in
        one frame (two calls and a token less per collective). A returned
        ``work_type`` (async_op=True) is marked complete when its future is."""
        try:
            now = self._clock()
            st = self._groups.get(group)
            if st is None:
                st = self._group_for(group)
            lock = self._lock
            lock.acquire()
            try:
                seq = st.seq + 1
                st.seq = seq
                out = self._outstanding + 1
                if out == 1:
                    self._span_start = now
                self._outstanding = out
                self._n_coll += 1
                self._last_seq = seq
                self._cur_group = st
                w = self._w
                s = self._seq + 1
                w[H_SEQ] = s
                _pack_coll(self._mm, _COLL_OFF, st.key, seq, op, nbytes, now, self._last_exit, out, st.done)
                w[H_SEQ] = s + 1
                self._seq = s + 1
            finally:
                lock.release()
        except Exception as exc:
            self._fail("collective", exc)
            return orig(*args, **kwargs)
        try:
            ret = orig(*args, **kwargs) if kwargs else orig(*args)
        except BaseException:
            self._coll_exit((st, seq))
            raise
        if ret is not None and work_type is not None and isinstance(ret, work_type):
            self._exit_on_completion(ret, (st, seq))
            return ret
        try:
            now = self._clock()
            lock.acquire()
            try:
                out = self._outstanding
                if out:
                    out -= 1
                    self._outstanding = out
                    if not out:
                        self._acc_coll += now - self._span_start
                if seq > st.done:
                    st.done = seq
                self._last_exit = now
                s = self._seq + 1
                w[H_SEQ] = s
                _pack_exit(self._mm, _EXIT_OFF, now, out, self._cur_group.done)
                w[H_SEQ] = s + 1
                self._seq = s + 1
            finally:
                lock.release()
        except Exception as exc:
            self._fail("collective", exc)
        return ret

    def _exit_on_completion(self, work: Any, token: tuple) -> None:
        try:
            fut = work.get_future()
        except Exception:  # no future (coalescing placeholder, some backends): done now
            self._coll_exit(token)
            return
        try:
            fut.then(lambda _f: self._coll_exit(token))
        except Exception as exc:
            self._coll_exit(token)
            self._fail("collective_future", exc)

    def _coll_exit(self, token) -> None:
        """Mark a collective completed. May run on another thread (async work)."""
        try:
            now = self._clock()
            st, seq = token
            lock = self._lock
            lock.acquire()
            try:
                out = self._outstanding
                if out:
                    out -= 1
                    self._outstanding = out
                    if not out:
                        self._acc_coll += now - self._span_start
                if seq > st.done:
                    st.done = seq
                self._last_exit = now
                w = self._w
                s = self._seq + 1
                w[H_SEQ] = s
                # DONE_SEQ describes H_COLL_GROUP: rewrite it with that group's value
                _pack_exit(self._mm, _EXIT_OFF, now, out, self._cur_group.done)
                w[H_SEQ] = s + 1
                self._seq = s + 1
            finally:
                lock.release()
        except Exception as exc:
            self._fail("collective", exc)

    # -- phases, process group, status -------------------------------------------

    def _phase_enter(self, phase: int) -> None:
        try:
            now = self._clock()
            prev = self._phase
            self._phase_stack.append(prev)
            self._phase = phase
            self._write([(H_PHASE, phase), (H_PHASE_SINCE_NS, now)], (RecordKind.PHASE, now, phase, prev))
        except Exception as exc:
            self._fail("phase", exc)

    def _phase_exit(self) -> None:
        try:
            now = self._clock()
            left = self._phase
            back = self._phase_stack.pop() if self._phase_stack else int(Phase.TRAIN)
            self._phase = back
            self._write([(H_PHASE, back), (H_PHASE_SINCE_NS, now)], (RecordKind.PHASE, now, back, left))
        except Exception as exc:
            self._fail("phase", exc)

    def _set_pg(self, state: PgState) -> None:
        try:
            now = self._clock()
            self._write([(H_PG_STATE, int(state)), (H_PG_CHANGE_NS, now)], (RecordKind.PG, now, int(state)))
        except Exception as exc:
            self._fail("process_group", exc)

    def _set_status(self, status: Status) -> None:
        try:
            self._status = int(status)
            self._w[H_STATUS] = int(status)  # static word, single store: outside the seqlock
        except Exception:
            pass

    # -- slot writing (cold paths) -----------------------------------------------

    def _write(self, words: list[tuple[int, int]], record: tuple | None = None) -> None:
        """Store header words (and append one ring record) inside a seqlock bracket."""
        with self._lock:
            w = self._w
            s = self._seq + 1
            w[H_SEQ] = s
            for index, value in words:
                w[index] = value
            if record is not None:
                kind, t_ns, *payload = record
                head = self._head
                base = (self._ring0 + (head % self._cap) * _REC_BYTES) // WORD
                w[base : base + wire.RECORD_WORDS] = _record_words(head, kind, t_ns, self._step, payload)
                w[H_RING_HEAD] = head + 1
                self._head = head + 1
            w[H_SEQ] = s + 1
            self._seq = s + 1

    # -- control (agent -> hook) -------------------------------------------------

    def _poll_control(self) -> None:
        """Heartbeat thread: notice a new request; the training thread acts on it."""
        req = control.read_request(self._w, self._ctrl_seen)
        if req is None:
            return
        self._ctrl_seen = req.seq
        why = control.rejection(req)
        with self._ctrl_lock:
            self._ctrl_pending = None  # a new request supersedes the pending one
            self._ctrl_due = _NEVER
            if why is None and req.command == Command.CHECKPOINT_AT_STEP:
                self._ctrl_pending = req
                self._ctrl_due = req.arg
                log.info("watchdog.hook control=checkpoint_at_step step=%d seq=%d", req.arg, req.seq)
                return
        if why is None:  # Command.NONE: cancelled
            self._ack(req, control.ACK_OK)
            return
        self._counters["ctrl_rejected"] += 1
        log.warning("watchdog.hook control rejected seq=%d reason=%s", req.seq, why)
        self._ack(req, control.ACK_REJECTED)

    def _run_control(self, step: int) -> None:
        """Training thread, at a step boundary at or past the requested step."""
        with self._ctrl_lock:
            req, self._ctrl_pending = self._ctrl_pending, None
            self._ctrl_due = _NEVER
        if req is None:
            return
        fn = self._checkpoint_fn
        if fn is None:
            log.warning("watchdog.hook checkpoint requested at step=%d but no function registered", step)
            self._ack(req, control.ACK_NO_HANDLER)
            return
        result = control.ACK_OK
        with self.phase(Phase.CHECKPOINT):
            try:
                fn(step)
            except Exception as exc:  # the user's save failed: report it, keep training
                result = control.ACK_SAVE_FAILED
                self._counters["save_failures"] += 1
                log.warning(
                    "watchdog.hook requested checkpoint failed step=%d", step, exc_info=(type(exc), exc, exc.__traceback__)
                )
        self._counters["ctrl_done"] += 1
        self._ack(req, result)

    def _ack(self, req: control.Request, result: int) -> None:
        now = self._clock()
        with self._lock:
            w = self._w
            w[H_CTRL_ACK_RESULT] = result
            w[H_CTRL_ACK_STEP] = self._step
            w[H_CTRL_ACK_NS] = now
            w[H_CTRL_ACK_SEQ] = req.seq  # last: the agent trusts the ack words once this matches
            self._write([], (RecordKind.CONTROL, now, req.seq, req.command, result))

    # -- failure handling --------------------------------------------------------

    def _fail(self, where: str, exc: BaseException) -> None:
        """Count, log (rate-limited), record; disable at max_errors. Never raises."""
        if self._closed or self._disabled:
            return
        try:
            with self._lock:
                self._errors += 1
                total = self._errors
            self._errlog.report(where, exc, total)
            try:
                self._write([(H_HOOK_ERRORS, total)], (RecordKind.ERROR, self._clock(), total))
            except Exception:
                pass  # the slot itself is what fails; the in-process count still holds
            if total >= self.config.max_errors:
                self._disable(f"{total} errors")
        except Exception:
            pass

    def _disable(self, reason: str) -> None:
        if self._disabled:
            return
        self._disabled = True
        self._set_status(Status.DISABLED)
        log.warning("watchdog.hook disabled reason=%r: training continues unmonitored", reason)
        self._run_undo()
        self._heartbeat.stop(timeout_s=0.5)
        self._go_quiet()

    def _go_quiet(self) -> None:
        for name, fn in _QUIET.items():
            setattr(self, name, fn)

    def _run_undo(self) -> None:
        undo, self._undo = self._undo, []
        for fn in reversed(undo):
            try:
                fn()
            except Exception:
                log.debug("watchdog.hook undo failed", exc_info=True)

    def _after_fork_in_child(self) -> None:
        """The child shares our mapping but is not this rank: never write to it."""
        self._closed = True
        self._go_quiet()


def _record_words(index: int, kind: int, t_ns: int, step: int, payload: list[int]):
    words = [index, int(kind), t_ns, step, *(int(p) for p in payload)]
    words += [0] * (wire.RECORD_WORDS - len(words))
    return memoryview(struct.pack(f"<{wire.RECORD_WORDS}q", *words)).cast("q")
