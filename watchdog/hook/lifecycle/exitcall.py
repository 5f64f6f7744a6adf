"""How a rank asks to leave: ``sys.exit`` and ``os._exit``, seen from inside.

Frameworks catch the exception that ends a rank (hydra's ``@hydra.main``, click,
many trainers), print it and call ``sys.exit(1)``: ``sys.excepthook`` never runs,
atexit does, and a hook that only watched for uncaught exceptions would call the
rank's end a clean exit. Only the process's parent (torchrun) learns the exit
status; the agent reads it from the zombie when it is quick enough. So install()
wraps both calls (``patch``): the wrapper notes the status asked for and the
exception being handled at that moment (``sys.exc_info()``: hydra calls
``sys.exit(1)`` inside its ``except`` block), then calls the original. The
lifecycle decides what to do with it (installer.py): at atexit for ``sys.exit``
(a ``SystemExit`` can still be caught), at once for ``os._exit`` (nothing runs after it).

Not seen here: ``raise SystemExit(n)`` written out (the agent's zombie read is the
only witness) and a C-level ``exit()``. Every wrapper is a pass-through that
never raises anything but what the original raises.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SYS_EXIT = "sys.exit"
OS_EXIT = "os._exit"


def exit_status(code: Any) -> int:
    """The process's exit status for ``SystemExit(code)``, as CPython computes it:
    None is 0, an int is taken modulo 256 (the kernel keeps 8 bits), anything else
    is printed and gives 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


@dataclass(frozen=True)
class ExitCall:
    """One call to ``sys.exit`` / ``os._exit``: what was asked."""

    call: str  # SYS_EXIT / OS_EXIT
    status: int | None  # None: an argument the call refuses (os._exit("x") raises TypeError)
    code: str  # the argument as written (bounded repr): a string code says why

    @property
    def failed(self) -> bool:
        return self.status is not None and self.status != 0

    def label(self) -> str:
        """``sys.exit(1)``, ``os._exit(3)``, ``sys.exit('no data')``."""
        return f"{self.call}({self.code})"

    def as_record(self) -> dict[str, Any]:
        return {"call": self.label(), "status": self.status}


def note(call: str, code: Any) -> ExitCall:
    """What a call asks for, taken inside the wrapper (before the original runs)."""
    if call == OS_EXIT:
        status = code & 0xFF if isinstance(code, int) and not isinstance(code, bool) else None
    else:
        status = exit_status(code)
    try:
        text = "" if code is None else repr(code)[:200]
    except Exception:  # a code whose repr raises is still a code
        text = type(code).__name__
    return ExitCall(call, status, text)


def handled() -> tuple[Any, Any, Any]:
    """The exception being handled now (``sys.exc_info()``), leaving out a
    SystemExit (``sys.exit`` inside ``except SystemExit``: no cause of its own).
    None being handled: the one the code that asked to exit still holds (``held``)."""
    info = sys.exc_info()
    if info[0] is not None and issubclass(info[0], SystemExit):
        return (None, None, None)
    if info[0] is None:
        return held(sys._getframe(1))  # noqa: SLF001 - CPython API, the caller's frame
    return info


_OWN = frozenset({__name__, "watchdog.hook.lifecycle.installer"})  # the exit call's own frames, skipped


def held(frame: Any) -> tuple[Any, Any, Any]:
    """The exception the first frame outside the hook holds in a local variable, itself
    or through a bound method of it: click (8.2 on) leaves its ``except ClickException``
    block first, keeping ``e.show``, and calls ``sys.exit`` after it. Read only at exit."""
    while frame is not None and frame.f_globals.get("__name__") in _OWN:
        frame = frame.f_back
    if frame is not None:
        for value in list(frame.f_locals.values()):
            exc = value if isinstance(value, BaseException) else getattr(value, "__self__", None)
            if isinstance(exc, BaseException) and not isinstance(exc, SystemExit):
                return type(exc), exc, exc.__traceback__
    return (None, None, None)


def patch(on_call: Callable[[str, Any], None]) -> None:
    """Wrap ``sys.exit`` and ``os._exit``: ``on_call(call, code)`` runs first
    (whatever it raises is swallowed), then the original with the same argument."""
    orig_sys_exit, orig_os_exit = sys.exit, os._exit

    def exit(status: Any = None) -> Any:  # noqa: A001 - the name tracebacks show
        try:
            on_call(SYS_EXIT, status)
        except Exception:
            pass
        return orig_sys_exit(status)

    def _exit(status: int) -> Any:
        try:
            on_call(OS_EXIT, status)
        except Exception:
            pass
        return orig_os_exit(status)

    exit.__wrapped__ = orig_sys_exit  # type: ignore[attr-defined]
    _exit.__wrapped__ = orig_os_exit  # type: ignore[attr-defined]
    exit.__doc__, _exit.__doc__ = orig_sys_exit.__doc__, orig_os_exit.__doc__
    sys.exit = exit
    os._exit = _exit
