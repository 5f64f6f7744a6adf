"""The context managers a Monitor hands out, and the name -> enum lookups.

Phase and step scopes are singletons per monitor (one per Phase value): entering
one allocates nothing. Nesting state lives in the recorder (a phase stack), so a
singleton can be entered again while it is active. Each scope holds the
recorder and looks its methods up per use: a quiet recorder's are no-ops.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from watchdog.contracts.slot import CollOp, Phase

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
    """A CollOp value from a CollOp, an int or a name ("all_reduce"); else OTHER."""
    if isinstance(op, str):
        try:
            return int(CollOp[op.strip().upper()])
        except KeyError:
            return int(CollOp.OTHER)
    try:
        return int(CollOp(op))
    except (ValueError, TypeError):
        return int(CollOp.OTHER)


class StepScope:
    __slots__ = ("_rec",)

    def __init__(self, rec: Any) -> None:
        self._rec = rec

    def __enter__(self) -> None:
        self._rec.scope_enter()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:  # a step that raised did not complete
            self._rec.step()


class PhaseScope:
    __slots__ = ("_phase", "_rec")

    def __init__(self, rec: Any, phase: int) -> None:
        self._rec = rec
        self._phase = phase

    def __enter__(self) -> None:
        self._rec.phase_enter(self._phase)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._rec.phase_exit()


class CollScope:
    __slots__ = ("_args", "_marks", "_token")

    def __init__(self, marks: Any, args: tuple) -> None:
        self._marks = marks  # the recorder's CollectiveMarks
        self._args = args
        self._token = None

    def __enter__(self) -> None:
        self._token = self._marks.enter(*self._args)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._token is not None:
            if exc_type is None:
                self._marks.exit(self._token)
            else:  # failed inside it (collective_marks.exit_failed)
                self._marks.exit_failed(self._token)
