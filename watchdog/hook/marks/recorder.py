"""What a rank records about itself: steps, data waits, phases, the process
group's state; collectives through its CollectiveMarks (collective_marks.py).
Every store is made inside the SlotWriter's seqlock bracket (slotwriter.py).

Hot paths. ``step`` (and the collective marks' ``enter`` and ``exit``, the
patched collectives' copy of them, and the loader's data-wait marks) run once
per step or per event and hold the writer's bracket inline (the lock, then
``with seqlocked(slot) as w:``, spliced in at import by ``inline_seqlock``:
slotwriter.py) instead of calling the writer: each call costs ~50 ns here, and
calling a bracket and append made a step 30% dearer
(benchmarks/hook_overhead.py --against). They are the writer's only friends; tests/test_hook_slotwriter.py and tests/test_hook_inline.py prove
they leave the same bytes as the same events written through
``SlotWriter.write``. Everything else calls the writer.

Data waits are marked by the loader's iterator itself (loader.py
``TimedIterator.__next__``, on this recorder's ``_acc_data``/``_n_data``): it
is their only caller, and a call per batch is what the inlining saves.

Cost. Per step the hook writes one ring record; a data wait or a collective only
updates the few header words a live reader needs ("waiting on data since t", "in
collective #k since t") and accumulates in Python ints until the step ends. The
hot methods read the clock once per event, keep state in plain attributes and
pack contiguous words with precompiled structs. On these CPUs a memoryview store
is ~30-40 ns, a lock round trip ~80 ns, a clock read ~50 ns, a Python call ~40-50 ns:
the budget is counted in those (benchmarks/hook_overhead.py).

Failures. Every method catches Exception and hands it to ``on_error(where, exc)``
(the Monitor's failure policy); the user's own exceptions (loader, collective)
never pass through here. ``on_control_due(step)`` runs at the end of the step
numbered ``control_due`` or later: the only control cost a step pays is one int
comparison.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from watchdog.contracts.slot import (
    H_BATCH_PER_RANK,
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
    H_STATUS,
    H_STEP,
    H_STEP_START_NS,
    H_TOTAL_COLL_BYTES,
    H_TOTAL_COLL_NS,
    H_TOTAL_DATA_NS,
    H_TOTAL_FWD_NS,
    H_TOTAL_STEP_NS,
    LOSS_WORDS,
    SPLIT_WORDS,
    WORD,
    PgState,
    Phase,
    RecordKind,
    Status,
    loss_bits,
)
from watchdog.hook.marks.collective_marks import CollectiveMarks
from watchdog.hook.noop import nop
from watchdog.hook.slot.slotwriter import REC_BYTES, SlotWriter, inline_seqlock, pack_record, seqlocked

_INF = float("inf")

# Native-order packs (struct's explicit "<" takes a slower generic conversion
# path; the slot is little-endian and so are the hosts, as in wire.init_slot).
# H_STEP .. H_TOTAL_COLL are contiguous: one pack per step instead of eight stores.
_pack_step = struct.Struct("8q").pack_into
_STEP_OFF = H_STEP * WORD
_pack_split = struct.Struct("4q").pack_into  # forward, backward, optimizer, h2d totals
_SPLIT_OFF = H_TOTAL_FWD_NS * WORD
_STEP_END = int(RecordKind.STEP_END)

# The packs rely on wire's word order: fail at import, not with a garbled slot.
if list(range(H_STEP + 1, H_STEP + 8)) != [
    H_STEP_START_NS,
    H_LAST_STEP_NS,
    H_LAST_DATA_NS,
    H_LAST_COLL_NS,
    H_TOTAL_STEP_NS,
    H_TOTAL_DATA_NS,
    H_TOTAL_COLL_NS,
] or list(SPLIT_WORDS) != list(range(H_TOTAL_FWD_NS, H_TOTAL_FWD_NS + 4)):  # pragma: no cover
    raise ImportError("watchdog.hook.marks.recorder: wire layout changed; update the packed stores")

NEVER = 1 << 62  # a step number never reached: "no control request due"

# Entry points replaced by no-ops when the recorder goes quiet (monitor closed,
# disabled, or a forked child): whoever holds the recorder (scopes) then writes
# nothing and pays one call, and so do the holders of its collective marks
# (mon.collective, the DDP comm hook). The two copies written out inline, the
# loader's data-wait marks and the patched collectives, cannot be swapped: they
# ask ``quiet`` (one slot read) instead.
# Phases in which the job does no training: a step that had one open is recorded in it,
# so the others' wait for this rank in that step reads as the pause's (stepstats/steps.py).
_PAUSES = frozenset({int(Phase.CHECKPOINT), int(Phase.EVAL)})
_QUIET_METHODS = (
    "step", "loss", "scope_enter", "set_step", "set_batch", "phase_enter", "phase_exit", "set_pg",
    "data_enter", "data_exit",
)  # fmt: skip


class Recorder:
    # Slots, not an instance dict: CPython 3.11 specialises slot reads and writes
    # to a few instructions each. ``__dict__`` remains for the methods swapped out
    # when the recorder goes quiet (and for tests' monkeypatching).
    __slots__ = (
        "__dict__",
        "_acc_data",
        "_clock",
        "_data_t0",
        "_n_data",
        "_phase",
        "_phase_stack",
        "_slot",
        "_status",
        "_step",
        "_step_phase",
        "_step_start",
        "_tot_bytes",
        "_tot_coll",
        "_tot_data",
        "_tot_split",
        "_tot_step",
        "collectives",
        "control_due",
        "on_control_due",
        "on_error",
        "quiet",
        "split",
        "split_on",
    )  # fmt: skip

    def __init__(
        self,
        slot: SlotWriter,
        clock: Callable[[], int],
        start_ns: int,
        *,
        on_error: Callable[[str, BaseException], None],
        on_control_due: Callable[[int], None],
    ) -> None:
        self._slot = slot
        self._clock = clock
        self.on_error = on_error
        self.on_control_due = on_control_due
        self.control_due = NEVER  # step at which on_control_due runs (the monitor sets it)
        self.collectives = CollectiveMarks(slot, clock, on_error=on_error)
        self._status = int(Status.STARTING)
        # step accounting: Python ints, written to the slot once per step
        self._step = 0
        self._step_start = start_ns
        self._acc_data = 0
        self._n_data = 0
        self._data_t0 = 0  # an explicit data wait open since (data_enter), 0: none
        self._tot_step = 0
        self._tot_data = 0
        self._tot_coll = 0
        self._tot_bytes = 0
        # The opt-in finer split (model_split.py, the loader's device copy) adds ns
        # here during the step: forward, backward, optimizer, host-to-device.
        # ``split_on`` is set once by whoever opts in: a step without it pays one
        # attribute test, never the four words.
        self.split = [0, 0, 0, 0]
        self.split_on = False
        self._tot_split = [0, 0, 0, 0]
        self._phase = int(Phase.TRAIN)
        # What the step record says the step was in: the phase at its end, or a pause
        # (checkpoint, eval) open at any time during it (``phase_enter``/``phase_exit``)
        self._step_phase = self._phase
        self._phase_stack: list[int] = []
        self.quiet = False  # read by the loader's data-wait marks (loader.py), which cannot be swapped

    @property
    def steps(self) -> int:
        """Steps completed (the job's numbering after set_step)."""
        return self._step

    @property
    def status(self) -> int:
        return self._status

    @property
    def current_phase(self) -> int:
        return self._phase

    @property
    def phase_depth(self) -> int:
        """Phases open (nested ``phase_enter`` not yet exited); 0 in plain training."""
        return len(self._phase_stack)

    def go_quiet(self) -> None:
        self.quiet = True
        for name in _QUIET_METHODS:
            setattr(self, name, nop)
        self.collectives.go_quiet()

    # -- steps ---------------------------------------------------------------------

    @inline_seqlock
    def step(self, loss: float | None = None) -> None:
        """Mark the end of the step in progress (and the start of the next);
        ``loss``, when given, is stored first (``loss``: a cold path of its own)."""
        if loss is not None:
            self.loss(loss)
        try:
            # A callable kept in a slot is called through a local: CPython 3.11
            # specialises ``self._clock`` (a slot read) but not ``self._clock()``.
            clock = self._clock
            now = clock()
            slot = self._slot
            lock = slot.lock
            lock.acquire()
            try:
                c = self.collectives  # its step view: see collective_marks.py
                step_ns = now - self._step_start
                coll = c.this_step_ns
                if c.outstanding:  # a collective spans the boundary: split it
                    coll += now - c.span_start
                    c.span_start = now
                data = self._acc_data
                n = self._step + 1
                tot_step = self._tot_step + step_ns
                tot_data = self._tot_data + data
                tot_coll = self._tot_coll + coll
                nbytes = c.this_step_bytes
                tot_bytes = self._tot_bytes + nbytes
                with seqlocked(slot) as w:
                    _pack_step(w, _STEP_OFF, n, now, step_ns, data, coll, tot_step, tot_data, tot_coll)
                    w[H_TOTAL_COLL_BYTES] = tot_bytes
                    if self.split_on:
                        sp, ts = self.split, self._tot_split
                        fwd, bwd, opt, h2d = sp
                        ts[0] += fwd
                        ts[1] += bwd
                        ts[2] += opt
                        ts[3] += h2d
                        _pack_split(w, _SPLIT_OFF, *ts)
                        sp[0] = sp[1] = sp[2] = sp[3] = 0
                    else:
                        fwd = bwd = opt = h2d = 0
                    head = slot._head  # SlotWriter.append:
                    pack_record(
                        w, slot._ring0 + (head % slot._cap) * REC_BYTES, head, _STEP_END, now, n,
                        step_ns, data, coll, c.this_step_count, c.current.seq, self._step_phase, self._n_data,
                        nbytes, fwd, bwd, opt, h2d,
                    )  # fmt: skip
                    head += 1
                    w[H_RING_HEAD] = head
                    slot._head = head
                self._step = n
                self._step_phase = self._phase
                self._step_start = now
                self._tot_step = tot_step
                self._tot_data = tot_data
                self._tot_coll = tot_coll
                self._tot_bytes = tot_bytes
                self._acc_data = self._n_data = c.this_step_ns = c.this_step_count = c.this_step_bytes = 0
            finally:
                lock.release()
            if n >= self.control_due:
                self.on_control_due(n)
        except Exception as exc:
            self.on_error("step", exc)

    def loss(self, value: float) -> None:
        """Store the loss of the step about to end (step number ``steps + 1``):
        the latest value, and the first step and count of NaN/inf losses, so a
        NaN between two agent reads is never missed. Only a Python number is
        taken: ``float()`` of a GPU tensor would synchronise the device. Anything
        else is ignored, counted in ``loss_ignored`` (not an error: it must not
        disable the monitor). Costs a bracket (~1 us): only users who pass a
        loss pay it."""
        try:
            if type(value) is not float:
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    self.__dict__["loss_ignored"] = self.__dict__.get("loss_ignored", 0) + 1
                    return
                value = float(value)
            n = self._step + 1
            d = self.__dict__
            if value != value or value in (_INF, -_INF):
                d["loss_bad_first"] = d.get("loss_bad_first") or n
                d["loss_bad_n"] = d.get("loss_bad_n", 0) + 1
            self._slot.write(zip(LOSS_WORDS, (loss_bits(value), n, d.get("loss_bad_first", 0), d.get("loss_bad_n", 0))))
        except Exception as exc:
            self.on_error("loss", exc)

    @inline_seqlock
    def scope_enter(self) -> None:
        """A step_scope block starts the step, unless waits were already recorded
        for it (a wrapped loader's fetch just before the block)."""
        c = self.collectives
        if self._n_data or c.this_step_count or c.outstanding:
            return
        try:
            now = self._clock()
            slot = self._slot
            with slot.lock, seqlocked(slot) as w:
                w[H_STEP_START_NS] = now
                self._step_start = now
        except Exception as exc:
            self.on_error("step_scope", exc)

    # -- data waits marked by a framework callback (the loader's own are inline: loader.py) --

    def data_enter(self) -> None:
        """A data wait starts now (a callback saw a batch end): the same header word
        as the loader's marks, so a live reader sees "waiting on data since t"."""
        try:
            now = self._clock()
            self._slot.write(((H_DATA_ENTER_NS, now),))
            self._data_t0 = now
        except Exception as exc:
            self.on_error("data", exc)

    def data_exit(self, counted: bool = True) -> None:
        """The open data wait ends now (the next batch starts): added to the step in
        progress as one wait, or, ``counted=False``, dropped (the gap turned out to
        be validation or a checkpoint, not data). No open wait: nothing to do."""
        t0 = self._data_t0
        if not t0:
            return
        try:
            now = self._clock()
            self._data_t0 = 0
            with self._slot.lock:
                if counted:
                    self._acc_data += now - t0
                    self._n_data += 1
                self._slot.write(((H_DATA_EXIT_NS, now),))
        except Exception as exc:
            self.on_error("data", exc)

    def set_batch(self, samples: int) -> None:
        """The per-rank batch size (samples per step on this rank), a cold path."""
        try:
            self._slot.write(((H_BATCH_PER_RANK, int(samples)),))
        except Exception as exc:
            self.on_error("batch_size", exc)

    @inline_seqlock
    def set_step(self, step: int) -> None:
        """Set the completed-step count (validated by the caller)."""
        slot = self._slot
        with slot.lock, seqlocked(slot) as w:
            w[H_STEP] = step
            self._step = step

    # -- phases, process group, status -------------------------------------------------

    def phase_enter(self, phase: int) -> None:
        try:
            now = self._clock()
            with self._slot.lock:
                prev = self._phase
                self._phase_stack.append(prev)
                self._phase = phase
                if self._step_phase not in _PAUSES:  # the step's first pause is what it was in
                    self._step_phase = phase
                words = ((H_PHASE, phase), (H_PHASE_SINCE_NS, now))
                self._slot.write(words, (RecordKind.PHASE, now, self._step, phase, prev))
        except Exception as exc:
            self.on_error("phase", exc)

    def phase_exit(self) -> None:
        try:
            now = self._clock()
            with self._slot.lock:
                left = self._phase
                back = self._phase_stack.pop() if self._phase_stack else int(Phase.TRAIN)
                self._phase = back
                if self._step_phase not in _PAUSES:  # a pause in this step: its record says so
                    self._step_phase = back
                words = ((H_PHASE, back), (H_PHASE_SINCE_NS, now))
                self._slot.write(words, (RecordKind.PHASE, now, self._step, back, left))
        except Exception as exc:
            self.on_error("phase", exc)

    def set_pg(self, state: PgState) -> None:
        try:
            now = self._clock()
            s = int(state)
            self._slot.write(((H_PG_STATE, s), (H_PG_CHANGE_NS, now)), (RecordKind.PG, now, self._step, s))
        except Exception as exc:
            self.on_error("process_group", exc)

    def set_status(self, status: Status) -> None:
        """H_STATUS is a static word with a single store: outside the seqlock."""
        self._status = int(status)
        try:
            self._slot.put(H_STATUS, int(status))
        except Exception:
            pass
