"""Every store into the slot, under the seqlock discipline. The hot paths live here.

Seqlock. Words H_STEP .. H_LAST_DYNAMIC (and the ring) change only between an
odd and an even store of H_SEQ. ``self._seq`` is our own copy: the slot is never
read back (except the control words, elsewhere), so garbage written into it by
someone else cannot steer us. The lock makes each bracket safe against the
other writers in this process (DDP comm-hook callbacks and async collectives
complete on the backend's thread) and is held only for the stores; it is
reentrant so that a signal handler marking a phase while the main thread is
inside a bracket cannot deadlock (the reader may then accept that one header
early: the price of never blocking).

Cost. Per step the hook writes one ring record; a data wait or a collective only
updates the few header words a live reader needs ("waiting on data since t", "in
collective #k since t") and accumulates in Python ints until the step ends. The
hot methods read the clock once per event, keep state in plain attributes, pack
contiguous words with precompiled structs, and write out enter/call/exit in one
frame where a call would cost more than the lines it saves. On these CPUs a
memoryview store is ~30-40 ns, a lock round trip ~70 ns, a clock read ~50 ns:
the budget is counted in those (benchmarks/hook_overhead.py).

Every method catches Exception and reports it to ``self._fail`` (the Monitor's
failure policy); the user's own exceptions (loader, collective) pass through.
"""

from __future__ import annotations

import struct
import threading
from typing import Any, Callable, Iterable, Iterator, TypeVar

from watchdog import wire
from watchdog.wire import (
    H_COLL_BYTES,
    H_COLL_DONE_SEQ,
    H_COLL_ENTER_NS,
    H_COLL_EXIT_NS,
    H_COLL_GROUP,
    H_COLL_OP,
    H_COLL_OUTSTANDING,
    H_COLL_SEQ,
    H_DATA_ENTER_NS,
    H_DATA_EXIT_NS,
    H_LAST_COLL_NS,
    H_LAST_DATA_NS,
    H_LAST_STEP_NS,
    H_PG_CHANGE_NS,
    H_PG_STATE,
    H_PHASE,
    H_PHASE_SINCE_NS,
    H_RING_HEAD,
    H_SEQ,
    H_STATUS,
    H_STEP,
    H_STEP_START_NS,
    H_TOTAL_COLL_NS,
    H_TOTAL_DATA_NS,
    H_TOTAL_STEP_NS,
    R_A,
    R_G,
    R_INDEX,
    R_KIND,
    R_STEP,
    R_T_NS,
    WORD,
    Phase,
    PgState,
    RecordKind,
    Status,
)

T = TypeVar("T")

_REC_BYTES = wire.RECORD_WORDS * WORD
# The slot is little-endian; the hook writes it in native order (memoryview
# stores, native-order packs: struct's explicit "<" takes a slower generic
# conversion path), as wire.init_slot does. Hosts are little-endian (x86-64, aarch64).
# H_STEP .. H_TOTAL_COLL are contiguous: one pack per step instead of eight stores.
_pack_step = struct.Struct("8q").pack_into
_STEP_OFF = H_STEP * WORD
# H_COLL_GROUP, _SEQ, _OP, _BYTES, _ENTER_NS, _EXIT_NS, _OUTSTANDING, _DONE_SEQ
# are contiguous: one pack at enter; the last three at exit.
_pack_coll = struct.Struct("8q").pack_into
_COLL_OFF = H_COLL_GROUP * WORD
_pack_exit = struct.Struct("3q").pack_into
_EXIT_OFF = H_COLL_EXIT_NS * WORD
# A ring record up to R_G; the record's remaining words are left alone.
_pack_rec = struct.Struct("11q").pack_into
_STEP_END = int(RecordKind.STEP_END)

# The packs rely on wire's word order: fail at import, not with a garbled slot.
if not (
    [H_STEP_START_NS, H_LAST_STEP_NS, H_LAST_DATA_NS, H_LAST_COLL_NS, H_TOTAL_STEP_NS, H_TOTAL_DATA_NS, H_TOTAL_COLL_NS]
    == list(range(H_STEP + 1, H_STEP + 8))
    and [H_COLL_SEQ, H_COLL_OP, H_COLL_BYTES, H_COLL_ENTER_NS, H_COLL_EXIT_NS, H_COLL_OUTSTANDING, H_COLL_DONE_SEQ]
    == list(range(H_COLL_GROUP + 1, H_COLL_GROUP + 8))
    and (R_INDEX, R_KIND, R_T_NS, R_STEP, R_A, R_G) == (0, 1, 2, 3, 4, 10)
):  # pragma: no cover
    raise ImportError("watchdog.hook.recorder: wire layout changed; update the packed stores")


class _Group:
    """Collective counters of one process group (shared by every handle to it)."""

    __slots__ = ("key", "seq", "done")

    def __init__(self, key: int) -> None:
        self.key = key
        self.seq = 0  # collectives entered
        self.done = 0  # highest seq completed


class TimedIterator:
    """``next()`` on the user's iterator bracketed by data-wait marks. The marks are
    written out here rather than calling a monitor method: one frame less per
    batch. StopIteration and the loader's own errors pass through untouched, and
    the iterator stays usable after one, as the user's was."""

    __slots__ = ("_next", "_rec")

    def __init__(self, it: Iterator, rec: Recorder) -> None:
        self._next = it.__next__
        self._rec = rec

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self):
        # Callables kept in slots are bound to locals before calling: CPython 3.11
        # does not specialise ``obj.slot_attr()`` and takes a generic lookup each time.
        r = self._rec
        nxt = self._next
        if r._quiet:
            return nxt()
        try:
            clock = r._clock
            t0 = clock()
            lock = r._lock
            lock.acquire()
            try:
                w = r._w
                s = r._seq + 1
                w[H_SEQ] = s
                w[H_DATA_ENTER_NS] = t0
                s += 1
                w[H_SEQ] = s
                r._seq = s
            finally:
                lock.release()
        except Exception as exc:
            r._fail("data", exc)
            return nxt()
        try:
            return nxt()
        finally:
            try:
                now = clock()
                lock.acquire()
                try:
                    r._acc_data += now - t0
                    r._n_data += 1
                    s = r._seq + 1
                    w[H_SEQ] = s
                    w[H_DATA_EXIT_NS] = now
                    s += 1
                    w[H_SEQ] = s
                    r._seq = s
                finally:
                    lock.release()
            except Exception as exc:
                r._fail("data", exc)


class TimedLoader:
    """What ``wrap_loader`` returns: iterating it times every fetch. ``len()`` and
    attributes (``sampler``, ``dataset``, ...) are the wrapped object's."""

    def __init__(self, iterable: Iterable, rec: Recorder) -> None:
        self._iterable = iterable
        self._rec = rec

    def __iter__(self) -> Iterator:
        return TimedIterator(iter(self._iterable), self._rec)

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_iterable", "_rec"):
            raise AttributeError(name)
        return getattr(self._iterable, name)


NEVER = 1 << 62  # a step number never reached: "no control request due"


class Recorder:
    # Slots, not an instance dict: CPython 3.11 only specialises attribute access
    # for instance dicts of up to 30 shared keys, and the monitor has more; slot
    # reads and writes stay a few instructions each. ``__dict__`` remains for the
    # methods swapped out when the monitor goes quiet (and for tests' monkeypatching).
    __slots__ = (
        "_mm", "_w", "_clock", "_lock", "_quiet", "_status", "_seq", "_head", "_cap", "_ring0",
        "_step", "_step_start", "_acc_data", "_n_data", "_acc_coll", "_n_coll",
        "_tot_step", "_tot_data", "_tot_coll",
        "_groups", "_groups_by_key", "_group_name", "_outstanding", "_span_start", "_cur_group",
        "_last_exit", "_suppress_tid", "_phase", "_phase_stack", "_ctrl_due",
        "__dict__",
    )  # fmt: skip

    def __init__(self, mm, ring_capacity: int, clock: Callable[[], int], start_ns: int) -> None:
        self._mm = mm
        self._w = memoryview(mm).cast("q")
        self._clock = clock
        self._lock = threading.RLock()
        self._quiet = False  # checked where a method cannot be swapped for a no-op
        self._status = int(Status.STARTING)
        self._seq = 0
        self._head = 0
        self._cap = ring_capacity
        self._ring0 = wire.RING_OFFSET
        # step accounting: Python ints, written to the slot once per step
        self._step = 0
        self._step_start = start_ns
        self._acc_data = 0
        self._n_data = 0
        self._acc_coll = 0  # union of collective time this step (see _coll_*)
        self._n_coll = 0
        self._tot_step = 0
        self._tot_data = 0
        self._tot_coll = 0
        # collectives
        self._groups: dict[Any, _Group] = {}  # group handle (None = default) -> counters
        self._groups_by_key: dict[int, _Group] = {}
        self._group_name: Callable[[Any], str] = lambda g: str(getattr(g, "group_name", "") or "")
        self._outstanding = 0
        self._span_start = 0  # when _outstanding last went 0 -> 1
        self._cur_group = _Group(0)  # group of the last collective entered
        self._last_exit = 0
        self._suppress_tid = 0  # thread inside watch_ddp's hook: don't count its inner all_reduce
        self._phase = int(Phase.TRAIN)
        self._phase_stack: list[int] = []
        self._ctrl_due = NEVER  # step at which a control request is due (Monitor sets it)

    def _fail(self, where: str, exc: BaseException) -> None:  # pragma: no cover - Monitor's
        raise NotImplementedError

    def _run_control(self, step: int) -> None:  # pragma: no cover - Monitor's
        raise NotImplementedError

    # -- steps ---------------------------------------------------------------------

    def step(self) -> None:
        """Mark the end of the step in progress (and the start of the next)."""
        try:
            clock = self._clock  # see TimedIterator.__next__: slot callables via a local
            now = clock()
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
                    self._n_coll, self._cur_group.seq, self._phase, self._n_data,
                )  # fmt: skip
                head += 1
                w[H_RING_HEAD] = head
                s += 1
                w[H_SEQ] = s
                self._seq = s
                self._head = head
                self._step = n
                self._step_start = now
                self._tot_step = tot_step
                self._tot_data = tot_data
                self._tot_coll = tot_coll
                self._acc_data = self._n_data = self._acc_coll = self._n_coll = 0
            finally:
                lock.release()
            if n >= self._ctrl_due:  # the only control cost a step pays
                self._run_control(n)
        except Exception as exc:
            self._fail("step", exc)

    def _scope_enter(self) -> None:
        """A step_scope block starts the step, unless waits were already recorded
        for it (a wrapped loader's fetch just before the block)."""
        if self._n_data or self._n_coll or self._outstanding:
            return
        try:
            now = self._clock()
            with self._lock:
                self._write_locked([(H_STEP_START_NS, now)])
                self._step_start = now
        except Exception as exc:
            self._fail("step_scope", exc)

    def _set_step(self, step: int) -> None:
        with self._lock:
            self._write_locked([(H_STEP, step)])
            self._step = step

    # -- collectives -----------------------------------------------------------------

    def _group_for(self, group: Any) -> _Group:
        """Counters for a group handle; None is the default group (key 0). Handles
        with the same name share counters, so group=None and group=WORLD agree."""
        name = "" if group is None else self._group_name(group)
        key = wire.group_key(name)
        st = self._groups_by_key.setdefault(key, _Group(key))
        self._groups[group] = st
        return st

    def _reset_groups(self, group: Any = None) -> None:
        """Forget counters: all (the default group was destroyed or re-created:
        sequence numbers restart on every rank), or one subgroup's."""
        with self._lock:
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
            clock = self._clock
            now = clock()
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
                self._cur_group = st
                w = self._w
                s = self._seq + 1
                w[H_SEQ] = s
                _pack_coll(self._mm, _COLL_OFF, st.key, seq, op, nbytes, now, self._last_exit, out, st.done)
                s += 1
                w[H_SEQ] = s
                self._seq = s
            finally:
                lock.release()
            return st, seq
        except Exception as exc:
            self._fail("collective", exc)
            return None

    def _coll_exit(self, token) -> None:
        """Mark a collective completed. May run on another thread (async work)."""
        try:
            clock = self._clock
            now = clock()
            st, seq = token
            lock = self._lock
            lock.acquire()
            try:
                out = self._outstanding
                if out:
                    out -= 1
                    self._outstanding = out
                    if not out:  # the union of overlapping collectives ends here
                        self._acc_coll += now - self._span_start
                if seq > st.done:
                    st.done = seq
                self._last_exit = now
                w = self._w
                s = self._seq + 1
                w[H_SEQ] = s
                # DONE_SEQ describes H_COLL_GROUP: rewrite it with that group's value
                _pack_exit(self._mm, _EXIT_OFF, now, out, self._cur_group.done)
                s += 1
                w[H_SEQ] = s
                self._seq = s
            finally:
                lock.release()
        except Exception as exc:
            self._fail("collective", exc)

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

    # -- phases, process group, status -------------------------------------------------

    def _phase_enter(self, phase: int) -> None:
        try:
            now = self._clock()
            with self._lock:
                prev = self._phase
                self._phase_stack.append(prev)
                self._phase = phase
                self._write_locked([(H_PHASE, phase), (H_PHASE_SINCE_NS, now)], (RecordKind.PHASE, now, phase, prev))
        except Exception as exc:
            self._fail("phase", exc)

    def _phase_exit(self) -> None:
        try:
            now = self._clock()
            with self._lock:
                left = self._phase
                back = self._phase_stack.pop() if self._phase_stack else int(Phase.TRAIN)
                self._phase = back
                self._write_locked([(H_PHASE, back), (H_PHASE_SINCE_NS, now)], (RecordKind.PHASE, now, back, left))
        except Exception as exc:
            self._fail("phase", exc)

    def _set_pg(self, state: PgState) -> None:
        try:
            now = self._clock()
            with self._lock:
                self._write_locked([(H_PG_STATE, int(state)), (H_PG_CHANGE_NS, now)], (RecordKind.PG, now, int(state)))
        except Exception as exc:
            self._fail("process_group", exc)

    def _set_status(self, status: Status) -> None:
        """H_STATUS is a static word with a single store: outside the seqlock."""
        self._status = int(status)
        try:
            self._w[H_STATUS] = int(status)
        except Exception:
            pass

    # -- the cold path -------------------------------------------------------------

    def _write_locked(self, words: list[tuple[int, int]], record: tuple | None = None) -> None:
        """Store header words (and append one ring record) in one seqlock bracket.
        The caller holds self._lock."""
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
        s += 1
        w[H_SEQ] = s
        self._seq = s


def make_collective_wrapper(
    orig: Callable,
    op: int,
    group_pos: int,
    size_pos: int,
    size_arg: str | None,
    is_list: bool,
    work_type: type | None,
    sink: Any,
) -> Callable:
    """The function that replaces a torch collective: find the monitor (``sink``),
    size the payload, mark enter, call ``orig``, mark exit. The marks are
    _coll_enter and _coll_exit written out inline: the wrapper is the only frame
    the hook adds to a collective. A Work returned by async_op=True is marked
    complete when its future is, on the backend's thread.

    ``group_pos``/``size_pos``: positional index of ``group`` and of the tensor(s)
    to size (huge: keyword only); ``size_arg``: that argument's name (None: no
    payload, barrier); ``work_type``: what async_op=True returns (None: unknown)."""
    get_ident = threading.get_ident
    op = int(op)

    def wrapper(*args, **kwargs):
        m = sink.monitor
        if m is None or m._quiet or (m._suppress_tid and m._suppress_tid == get_ident()):
            return orig(*args, **kwargs)
        try:
            n = len(args)
            if kwargs:
                group = args[group_pos] if n > group_pos else kwargs.get("group")
                t = args[size_pos] if n > size_pos else kwargs.get(size_arg)
            else:
                group = args[group_pos] if n > group_pos else None
                t = args[size_pos] if n > size_pos else None
            if t is None:
                nbytes = 0
            elif is_list:
                nbytes = sum(getattr(x, "nbytes", 0) for x in t)
            else:
                nbytes = getattr(t, "nbytes", 0)
            clock = m._clock  # see TimedIterator.__next__: slot callables via a local
            now = clock()
            st = m._groups.get(group)
            if st is None:
                st = m._group_for(group)
            lock = m._lock
            lock.acquire()
            try:
                seq = st.seq + 1
                st.seq = seq
                out = m._outstanding + 1
                if out == 1:
                    m._span_start = now
                m._outstanding = out
                m._n_coll += 1
                m._cur_group = st
                w = m._w
                s = m._seq + 1
                w[H_SEQ] = s
                _pack_coll(m._mm, _COLL_OFF, st.key, seq, op, nbytes, now, m._last_exit, out, st.done)
                s += 1
                w[H_SEQ] = s
                m._seq = s
            finally:
                lock.release()
        except Exception as exc:
            m._fail("collective", exc)
            return orig(*args, **kwargs)
        try:
            ret = orig(*args, **kwargs) if kwargs else orig(*args)
        except BaseException:
            m._coll_exit((st, seq))
            raise
        if ret is not None and work_type is not None and isinstance(ret, work_type):
            m._exit_on_completion(ret, (st, seq))
            return ret
        try:
            now = clock()
            lock.acquire()
            try:
                out = m._outstanding
                if out:
                    out -= 1
                    m._outstanding = out
                    if not out:
                        m._acc_coll += now - m._span_start
                if seq > st.done:
                    st.done = seq
                m._last_exit = now
                s = m._seq + 1
                w[H_SEQ] = s
                _pack_exit(m._mm, _EXIT_OFF, now, out, m._cur_group.done)
                s += 1
                w[H_SEQ] = s
                m._seq = s
            finally:
                lock.release()
        except Exception as exc:
            m._fail("collective", exc)
        return ret

    return wrapper


def _record_words(index: int, kind: int, t_ns: int, step: int, payload: list[int]):
    words = [index, int(kind), t_ns, step, *(int(p) for p in payload)]
    words += [0] * (wire.RECORD_WORDS - len(words))
    return memoryview(struct.pack(f"<{wire.RECORD_WORDS}q", *words)).cast("q")
