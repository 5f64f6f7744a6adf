"""What ``wrap_loader`` returns: the user's iterable, every fetch timed as a data wait."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from watchdog.hook.recorder import Recorder
from watchdog.wire import H_DATA_ENTER_NS, H_DATA_EXIT_NS, H_SEQ


class TimedIterator:
    """``next()`` on the user's iterator, bracketed by the data-wait marks ("waiting
    on data since t" while it runs; the wait is added to the step in progress).
    StopIteration and the loader's own errors pass through untouched, and the
    iterator stays usable after one, as the user's was.

    The marks are written out here, on the recorder's and its slot writer's
    fields, rather than calling a recorder method: one frame less per batch (the
    call was ~3% of a step's hook cost). This is the only implementation of a
    data wait; tests/test_hook_inline.py proves it leaves the bytes of the
    same stores made through ``SlotWriter.write``, and that a quiet recorder
    makes it a plain ``next()``."""

    __slots__ = ("_next", "_rec")

    def __init__(self, it: Iterator, rec: Recorder) -> None:
        self._next = it.__next__
        self._rec = rec

    def __iter__(self) -> TimedIterator:
        return self

    # The wrapped iterator's own attributes and length stay reachable (its bound
    # ``__next__`` knows it): code that holds a DataLoader's iterator may use them.
    def __getattr__(self, name: str) -> Any:
        if name in ("_next", "_rec"):  # not set yet (a half-built or copied object)
            raise AttributeError(name)
        return getattr(self._next.__self__, name)  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self._next.__self__)  # type: ignore[attr-defined]

    def __next__(self):
        # Callables kept in slots are bound to locals before calling: CPython 3.11
        # does not specialise ``obj.slot_attr()`` and takes a generic lookup each time.
        r = self._rec
        nxt = self._next
        if r.quiet:
            return nxt()
        try:
            clock = r._clock
            t0 = clock()
            slot = r._slot
            lock = slot.lock
            lock.acquire()
            try:
                w = slot._words
                s = slot._seq + 1
                w[H_SEQ] = s  # bracket opens (SlotWriter.begin)
                try:
                    w[H_DATA_ENTER_NS] = t0
                finally:
                    s += 1
                    w[H_SEQ] = s  # bracket closes (SlotWriter.end)
                    slot._seq = s
            finally:
                lock.release()
        except Exception as exc:
            r.on_error("data", exc)
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
                    # w as at enter: if the monitor closed meanwhile, the slot writer released
                    # it and this store raises, reported to a closed monitor (a no-op)
                    s = slot._seq + 1
                    w[H_SEQ] = s  # bracket opens (SlotWriter.begin)
                    try:
                        w[H_DATA_EXIT_NS] = now
                    finally:
                        s += 1
                        w[H_SEQ] = s  # bracket closes (SlotWriter.end)
                        slot._seq = s
                finally:
                    lock.release()
            except Exception as exc:
                r.on_error("data", exc)


class TimedLoader:
    """Iterating it times every fetch. ``len()`` and attributes (``sampler``,
    ``dataset``, ...) are the wrapped object's."""

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
