"""The one writer of a rank's slot: every store into the mapping goes through here.

Seqlock. Words H_STEP .. H_LAST_DYNAMIC (and the ring) change only between an
odd and an even store of H_SEQ: ``begin()`` makes it odd, ``end()`` makes it
even, and nothing else in the process stores H_SEQ. ``self._seq`` is our own
copy: the slot is never read back, so garbage written into it by someone else
cannot steer us. The lock makes each bracket safe against the other writers in
this process (DDP comm-hook callbacks and async collectives complete on the
backend's thread) and is held only for the stores; it is reentrant so that a
signal handler marking a phase while the main thread is inside a bracket cannot
deadlock (the reader may then accept that one header early: the price of never
blocking).

What goes between ``begin()`` and ``end()`` is the caller's (the recorder knows
what the words mean; this class knows how they may change). Why a begin/end
pair rather than one method taking the words: the hot paths store a few
contiguous words with one precompiled struct pack, and passing those values
through a generic call (a tuple, then ``*args``) costs ~200 ns, four times what
the two calls cost (benchmarks/hook_overhead.py).

Single-writer words (status, heartbeat, control acks) sit outside the seqlock
and are stored alone with ``put``.

Friends: the hot paths open this same bracket inline, on this object's lock,
``_words``, ``_seq`` and ``_head``, because a call costs more than the stores it
brackets: ``Recorder.step`` (recorder.py), ``CollectiveMarks.enter``/``exit``
(collective_marks.py), their copy in the patched collectives (collectives.py)
and the loader's data-wait marks (loader.py). Nothing else touches those;
tests/test_hook_slotwriter.py and tests/test_hook_inline.py prove they leave
the bytes ``write`` would.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterable
from typing import Any

from watchdog.contracts import slot as wire
from watchdog.contracts.slot import (
    H_EVENT_RING_HEAD,
    H_RING_HEAD,
    H_SEQ,
    R_A,
    R_INDEX,
    R_KIND,
    R_L,
    R_STEP,
    R_T_NS,
    WORD,
)

REC_BYTES = wire.RECORD_WORDS * WORD
_PAD = (0,) * (wire.RECORD_WORDS - 4)
# A ring record's words, R_INDEX .. R_L, in one pack (native order, as
# wire.init_slot writes: the slot is little-endian and so are the hosts).
pack_record = struct.Struct("16q").pack_into

if (R_INDEX, R_KIND, R_T_NS, R_STEP, R_A, R_L, wire.RECORD_WORDS) != (0, 1, 2, 3, 4, 15, 16):  # pragma: no cover
    raise ImportError("watchdog.hook.slotwriter: wire record layout changed; update pack_record")


class SlotWriter:
    """Owns the mapping, its int64 view, the seqlock counter, the ring head and
    the lock. ``buf`` must already be formatted (``format`` does both)."""

    __slots__ = ("_buf", "_cap", "_ev0", "_ev_cap", "_ev_head", "_head", "_ring0", "_seq", "_words", "lock")

    def __init__(self, buf: Any, ring_capacity: int) -> None:
        self.lock = threading.RLock()
        self._buf = buf
        self._words = memoryview(buf).cast("q")
        self._seq = 0
        self._head = 0
        self._cap = ring_capacity
        self._ring0 = wire.RING_OFFSET
        # The event ring (wire version 2): written on the cold paths only.
        self._ev0 = wire.event_ring_offset(ring_capacity)
        self._ev_cap = wire.EVENT_RING_FACTOR * ring_capacity
        self._ev_head = 0

    @classmethod
    def format(cls, buf: Any, identity: wire.Identity, ring_capacity: int, *, wall_ns: int, mono_ns: int) -> SlotWriter:
        """Format ``buf`` as a fresh slot for ``identity`` and return its writer."""
        wire.init_slot(buf, identity, ring_capacity, wall_ns=wall_ns, mono_ns=mono_ns)
        return cls(buf, ring_capacity)

    @property
    def words(self) -> memoryview:
        """The slot as int64 words, for reading the agent's control block."""
        return self._words

    # -- the seqlock bracket ------------------------------------------------------

    def begin(self) -> memoryview:
        """Take the lock and make H_SEQ odd; returns the int64 view to store into
        (``view[i] = v``, or a struct pack at a byte offset). Always followed by
        ``end()``, in a ``finally``."""
        self.lock.acquire()
        try:
            s = self._seq + 1
            w = self._words
            w[H_SEQ] = s
            self._seq = s
            return w
        except BaseException:
            self.lock.release()
            raise

    def end(self) -> None:
        """Make H_SEQ even again and release the lock."""
        try:
            s = self._seq + 1
            self._words[H_SEQ] = s
            self._seq = s
        finally:
            self.lock.release()

    def append(
        self,
        kind: int,
        t_ns: int,
        step: int,
        a: int = 0,
        b: int = 0,
        c: int = 0,
        d: int = 0,
        e: int = 0,
        f: int = 0,
        g: int = 0,
        h: int = 0,
        i: int = 0,
        j: int = 0,
        k: int = 0,
        l: int = 0,  # noqa: E741
    ) -> None:
        """Inside a bracket: write the next ring record (payload words R_A .. R_L)
        and advance H_RING_HEAD past it."""
        head = self._head
        pack_record(
            self._words,
            self._ring0 + (head % self._cap) * REC_BYTES,
            head, kind, t_ns, step, a, b, c, d, e, f, g, h, i, j, k, l,
        )  # fmt: skip
        head += 1
        self._words[H_RING_HEAD] = head
        self._head = head

    def append_wide(self, kind: int, t_ns: int, step: int, payload: tuple[int, ...]) -> None:
        """Inside a bracket: like ``append`` with all twelve payload words (R_A ..
        R_L; fewer are zero-filled)."""
        if len(payload) > wire.RECORD_WORDS - 4:
            raise ValueError(f"a record holds {wire.RECORD_WORDS - 4} payload words, got {len(payload)}")
        self.append(kind, t_ns, step, *payload)

    def write_wide(self, records: Iterable[tuple[int, int, int, tuple[int, ...]]]) -> None:
        """The cold path: append wide records ``(kind, t_ns, step, payload)``, in one bracket."""
        self.begin()
        try:
            for kind, t_ns, step, payload in records:
                self.append_wide(kind, t_ns, step, payload)
        finally:
            self.end()

    def write_events(self, records: Iterable[tuple[int, int, int, tuple[int, ...]]]) -> None:
        """The event ring's one writer (background thread: Flight Recorder
        signatures, GPU completions): records ``(kind, t_ns, step, payload)`` in
        one bracket, so a burst of collectives never pushes out step records."""
        self.begin()
        try:
            head, cap, w = self._ev_head, self._ev_cap, self._words
            for kind, t_ns, step, payload in records:
                if len(payload) > wire.RECORD_WORDS - 4:
                    raise ValueError(f"a record holds {wire.RECORD_WORDS - 4} payload words, got {len(payload)}")
                pack_record(
                    w, self._ev0 + (head % cap) * REC_BYTES, head, kind, t_ns, step, *payload, *_PAD[len(payload) :]
                )
                head += 1
                w[H_EVENT_RING_HEAD] = head
                self._ev_head = head
        finally:
            self.end()

    def write(self, words: Iterable[tuple[int, int]] = (), record: tuple | None = None) -> None:
        """The cold path: store header words (index, value) and append at most one
        record ``(kind, t_ns, step, *payload)``, in one bracket."""
        w = self.begin()
        try:
            for index, value in words:
                w[index] = value
            if record is not None:
                self.append(*record)
        finally:
            self.end()

    # -- outside the seqlock -------------------------------------------------------

    def put(self, index: int, value: int) -> None:
        """Store one single-writer word read on its own, outside the seqlock
        (status, heartbeat, control acknowledgement). One aligned 8-byte store."""
        if wire.seqlocked(index):
            raise ValueError(f"word {index} changes only inside a seqlock bracket")
        self._words[index] = value

    def copy(self) -> bytes:
        """The whole slot as bytes (tests)."""
        return self._words.tobytes()

    def detach(self) -> None:
        """Point later stores at scratch memory and unmap: a writer still in
        flight on another thread (a collective's callback) lands harmlessly."""
        with self.lock:
            w, buf = self._words, self._buf
            self._buf = bytearray(len(buf))
            self._words = memoryview(self._buf).cast("q")
        try:
            w.release()
            buf.close()
        except Exception:
            pass  # a view is still exported: the mapping goes with the process
