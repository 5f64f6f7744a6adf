"""One-entry memo for the pure functions of (view, now) that several detectors
share: each rank's health, the hang analysis, the straggler scores.

Six detectors and their gauges asked for ``classify_all`` eight times a tick,
and for the hang analysis and straggler scores twice each; at 16,384 ranks that
repetition was most of a tick. The functions are pure and the view immutable,
so the answer for the same (view object, now, cfg object) is the same answer:
the memo keeps the last one per function (it never grows). It holds its view
by a weak reference (compared by identity, so a view that died cannot pass for
a new one with its id): a memo holding the last tick's view made the next tick
pay for freeing it (~0.1 s at 16,384 ranks: the rank objects the Folder has
replaced since) in whichever part dropped the last reference; unheld, the
view goes when the Folder folds the next report, and each replaced rank's
objects go as it is folded.
Callers must treat what they get as read-only (they always did).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, cast

P = ParamSpec("P")
R = TypeVar("R")


class Memoized(Protocol, Generic[P, R]):
    """A ``per_tick`` function: callable as the function it wraps, which stays
    reachable as ``uncached`` (the equivalence tests compare the two)."""

    uncached: Callable[P, R]

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...


def per_tick(view_arg: int = 0) -> Callable[[Callable[P, R]], Memoized[P, R]]:
    """Memoize ``fn(*args)`` on its first three positional arguments, by identity
    for the view (``args[view_arg]``) and the config, by value for ``now``. Calls
    with any further arguments are not memoized."""

    def wrap(fn: Callable[P, R]) -> Memoized[P, R]:
        last: list[tuple] = []
        call: Callable[..., R] = fn  # memo passes its positional arguments on as they came

        @functools.wraps(fn)
        def memo(*args: Any) -> Any:
            if len(args) != 3:
                return call(*args)
            view = args[view_arg]
            key = tuple(None if i == view_arg else a for i, a in enumerate(args))
            hit = last[0] if last else None
            if (
                hit is not None
                and hit[0]() is view
                and all(a is b or (i != 2 and a == b) for i, (a, b) in enumerate(zip(hit[1], key)))
            ):
                return hit[2]
            out = call(*args)
            last[:] = [(_weak(view), key, out)]
            return out

        memoized = cast("Memoized[P, R]", memo)
        memoized.uncached = fn
        return memoized

    return wrap


def _weak(obj: Any) -> Callable[[], Any]:
    """A weak reference to ``obj``, or a strong one where it cannot have one."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj
