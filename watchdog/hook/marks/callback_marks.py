"""What the framework callbacks (``watchdog.hook.lightning``, ``watchdog.hook.hf``)
share: turning "a batch ended", "the next one started", "validation started" into
the monitor's steps, data waits and phases. Plain Python, no framework import:
each callback is a thin adapter over a ``CallbackMarks``.

A framework hands its callback the moments around a batch, not the loader's
fetch, so the data wait is the gap between one training batch's end and the
next one's start (it holds the fetch, and the loader's iterator start at an
epoch's start). Anything else that fills that gap is not data: validation and
checkpoint saves drop the wait open at their start (``enter``) and, when
training resumes between batches, open a fresh one at their end (``leave``).

Never hurt training: the monitor's methods do not raise, and ``guarded`` wraps
each callback method so that an error in the adapter itself (a framework
attribute that moved) is handed to the monitor's failure policy instead.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any, TypeVar

from watchdog.contracts.slot import Phase

F = TypeVar("F", bound=Callable[..., Any])


class CallbackMarks:
    def __init__(self, mon: Any) -> None:
        self.mon = mon
        self.between = False  # between two training batches: the gap is a data wait
        self._open: list[Any] = []  # phase scopes this callback entered, innermost last

    @property
    def phases(self) -> int:
        """Phases this callback has open."""
        return len(self._open)

    def batch_start(self) -> None:
        """A training batch starts: the wait since the last one ends, counted."""
        if self.between:
            self.between = False
            self.mon.data_wait_end()

    def batch_end(self, stepped: bool) -> None:
        """A training batch ended; ``stepped``: the optimizer stepped in it (a
        batch that only accumulates gradients does not end a step)."""
        if stepped:
            self.mon.step()
        self.resume()

    def resume(self) -> None:
        """Training goes on between batches from now (an epoch starts, a batch ended)."""
        self.between = True
        if not self._open:
            self.mon.data_wait_begin()

    def enter(self, phase: Phase) -> None:
        """Validation or a checkpoint starts: the wait open so far was not data."""
        self.mon.data_wait_end(counted=False)
        scope = self.mon.phase(phase)
        scope.__enter__()
        self._open.append(scope)

    def leave(self) -> None:
        """The innermost phase this callback entered ends."""
        if self._open:
            self._open.pop().__exit__(None, None, None)
        if self.between and not self._open:
            self.mon.data_wait_begin()

    def stop(self) -> None:
        """Training ended (or was interrupted): close what is open, count nothing more."""
        self.between = False
        self.mon.data_wait_end(counted=False)
        while self._open:
            self._open.pop().__exit__(None, None, None)


def guarded(method: F) -> F:
    """A callback method that never raises into the framework: an error is the
    monitor's (counted, logged once, disabling it after max_errors)."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            fail = getattr(self.marks.mon, "report_error", None)  # the no-op monitor has none
            if fail is not None:
                fail(f"callback.{method.__name__}", exc)
            return None

    return call  # type: ignore[return-value]


def lazy_callback(
    module: str, marks: type, base: tuple[str, str], framework: str, extra: str, doc: str
) -> tuple[Callable[[], type], Callable[[str], Any]]:
    """The framework callback class, built on first use: ``marks`` on the
    framework's callback base (``base``: module and class name), so that importing
    ``watchdog.hook.<framework>`` never imports the framework. Returns the class
    builder and the module's ``__getattr__`` serving ``WatchdogCallback``; without
    the framework, a clear ImportError naming it (``framework``) and the extra to install."""
    built: list[type] = []

    def build() -> type:
        if not built:
            try:
                framework_base = getattr(importlib.import_module(base[0]), base[1])
            except ImportError as exc:
                raise ImportError(
                    f"{module}.WatchdogCallback needs {framework}: pip install 'rank-watchdog[{extra}]'"
                ) from exc
            cls = type("WatchdogCallback", (marks, framework_base), {"__doc__": doc, "__module__": module})
            built.append(cls)
        return built[0]

    def module_getattr(name: str) -> Any:
        if name == "WatchdogCallback":
            return build()
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return build, module_getattr
