"""One-entry memo for the pure functions of (view, now) that several detectors
share: each rank's health, the hang analysis, the straggler scores.

Six detectors and their gauges asked for ``classify_all`` eight times a tick,
and for the hang analysis and straggler scores twice each; at 16,384 ranks that
repetition was most of a tick. The functions are pure and the view immutable,
so the answer for the same (view object, now, cfg object) is the same answer:
the memo keeps the last one per function (it never grows) and holds a
reference to its view, so the view's id cannot be reused while it is the key.
Callers must treat what they get as read-only (they always did).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def per_tick(view_arg: int = 0) -> Callable[[F], F]:
    """Memoize ``fn(*args)`` on its first three positional arguments, by identity
    for the view (``args[view_arg]``) and the config, by value for ``now``. Calls
    with any further arguments are not memoized."""

    def wrap(fn: F) -> F:
        last: list[tuple] = []

        @functools.wraps(fn)
        def memo(*args: Any) -> Any:
            if len(args) != 3:
                return fn(*args)
            hit = last[0] if last else None
            if hit is not None and all(
                a is b or (i != view_arg and i != 2 and a == b) for i, (a, b) in enumerate(zip(hit[0], args))
            ):
                return hit[1]
            out = fn(*args)
            last[:] = [(args, out)]
            return out

        memo.uncached = fn  # type: ignore[attr-defined]
        return memo  # type: ignore[return-value]

    return wrap
