"""What ``wrap_loader`` returns: the user's iterable, every fetch timed as a data wait.

Two opt-ins ride along, both decided when the loader is wrapped:

* ``device=``: each batch is moved there (``.to(device)`` on every tensor in it)
  and the copy is timed as host-to-device time, the finer split's fourth part.
  What is timed is the ``.to`` call: on CPU it is ~0 (nothing moves); on CUDA
  with ``non_blocking=True`` from pinned memory it is the enqueue only (the
  copy then overlaps and shows up in the forward); a blocking copy is timed
  whole. Cost: benchmarks/model_split_overhead.py.
* the per-rank batch size, for ``batch_changed`` after an elastic restart: the
  loader's ``batch_size`` attribute (torch's DataLoader has one), an explicit
  ``batch_size=``, or else the first batch's leading dimension, sized once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from watchdog.contracts.slot import H_DATA_ENTER_NS, H_DATA_EXIT_NS
from watchdog.hook.marks.recorder import Recorder
from watchdog.hook.slot.slotwriter import inline_seqlock, seqlocked


def batch_len(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor (a tensor, or
    one inside a tuple, list or dict); 0 when there is none to read."""
    for _ in range(4):  # nested containers, a few levels at most
        if isinstance(batch, dict):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, (list, tuple)):
            batch = batch[0] if batch else None
        else:
            break
    shape = getattr(batch, "shape", None)
    try:
        return int(shape[0]) if shape is not None and len(shape) > 0 else 0
    except (TypeError, ValueError):
        return 0


def to_device(batch: Any, device: Any, non_blocking: bool = False) -> Any:
    """``batch`` with every tensor in it (tuples, lists and dicts, nested) moved by
    ``.to(device)``; anything else as it is."""
    if isinstance(batch, dict):
        return type(batch)((k, to_device(v, device, non_blocking)) for k, v in batch.items())
    if isinstance(batch, (list, tuple)):
        moved = (to_device(x, device, non_blocking) for x in batch)
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)  # a namedtuple
    move = getattr(batch, "to", None)
    return move(device, non_blocking=non_blocking) if callable(move) else batch


class DeviceIterator:
    """A timed iterator whose batches are moved to a device; the move's time is
    added to the step's host-to-device part (recorder.split[3]). The copy's own
    errors (device out of memory) are the user's, raised as their ``.to`` would."""

    __slots__ = ("_device", "_it", "_nb", "_rec")

    def __init__(self, it: Iterator, rec: Recorder, device: Any, non_blocking: bool) -> None:
        self._it, self._rec, self._device, self._nb = it, rec, device, non_blocking

    def __iter__(self) -> DeviceIterator:
        return self

    def __next__(self) -> Any:
        batch = next(self._it)
        r = self._rec
        if r.quiet:
            return to_device(batch, self._device, self._nb)
        clock = r._clock
        t0 = clock()
        out = to_device(batch, self._device, self._nb)
        r.split[3] += clock() - t0
        return out


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

    @inline_seqlock
    def __next__(self) -> Any:
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
                with seqlocked(slot) as w:
                    w[H_DATA_ENTER_NS] = t0
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
                    # if the monitor closed meanwhile, these stores land in the slot writer's scratch memory
                    with seqlocked(slot) as w:
                        w[H_DATA_EXIT_NS] = now
                finally:
                    lock.release()
            except Exception as exc:
                r.on_error("data", exc)


class TimedLoader:
    """Iterating it times every fetch. ``len()`` and attributes (``sampler``,
    ``dataset``, ...) are the wrapped object's."""

    def __init__(
        self, iterable: Iterable, rec: Recorder, *, device: Any = None, non_blocking: bool = False, batch_size: int = 0
    ) -> None:
        self._iterable = iterable
        self._rec = rec
        self._device = device
        self._non_blocking = non_blocking
        if device is not None:
            rec.split_on = True
        # The per-rank batch: given, or the loader's own, or read off the first batch.
        if not batch_size:
            own = getattr(iterable, "batch_size", None)
            batch_size = own if isinstance(own, int) and not isinstance(own, bool) and own > 0 else 0
        self._sized = batch_size > 0
        if self._sized:
            rec.set_batch(batch_size)

    def __iter__(self) -> Iterator:
        it = iter(self._iterable)
        timed = TimedIterator(it, self._rec)
        if not self._sized:
            self._sized = True
            timed._next = _size_first(it.__next__, timed, self._rec)
        if self._device is not None:
            return DeviceIterator(timed, self._rec, self._device, self._non_blocking)
        return timed

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_iterable", "_rec", "_device", "_non_blocking", "_sized"):
            raise AttributeError(name)
        return getattr(self._iterable, name)


def _size_first(nxt: Any, timed: TimedIterator, rec: Recorder) -> Any:
    """A ``next`` that sizes the first batch, then puts the plain one back: later
    batches pay nothing for it."""

    def first() -> Any:
        batch = nxt()
        timed._next = nxt
        try:
            n = batch_len(batch)
            if n > 0:
                rec.set_batch(n)
        except Exception as exc:
            rec.on_error("batch_size", exc)
        return batch

    return first
