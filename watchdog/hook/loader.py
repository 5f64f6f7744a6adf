"""What ``wrap_loader`` returns: the user's iterable, every fetch timed as a data wait."""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from watchdog.hook.recorder import Recorder


class TimedIterator:
    """``next()`` on the user's iterator, timed by the recorder (``fetch``: one
    call per batch). StopIteration and the loader's own errors pass through
    untouched, and the iterator stays usable after one, as the user's was."""

    __slots__ = ("_next", "_rec")

    def __init__(self, it: Iterator, rec: Recorder) -> None:
        self._next = it.__next__
        self._rec = rec

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self):
        return self._rec.fetch(self._next)  # a quiet recorder's fetch just calls it


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
