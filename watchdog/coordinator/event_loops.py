"""Which asyncio event loop the coordinator's HTTP server runs on.

``asyncio``: the stdlib's selector loop. ``uvloop``: libuv's, a drop-in loop
(MagicStack's ``uvloop``, a dependency where it builds: CPython on Linux and
macOS) whose polling, transports and timers are C: the server's own CPU per
report fell from ~115 to ~65 us with it (``benchmarks/loop_bench.py``, 2,048
kept-alive connections at 2,048 reports a second). ``auto`` (the default):
uvloop where it imports, else the stdlib's. The request handling is the same
code on either (``httpio``), and the tests run it on both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

CHOICES = ("auto", "asyncio", "uvloop")


def available() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def parse(text: str) -> str:
    """A ``--web.event-loop`` value; naming uvloop where it is missing is an error at start, not at the first report."""
    kind = text.strip().lower()
    if kind not in CHOICES:
        raise ValueError(f"must be one of {', '.join(CHOICES)}")
    if kind == "uvloop" and not available():
        raise ValueError("uvloop is not installed here (pip install uvloop), or choose asyncio or auto")
    return kind


def resolved(kind: str) -> str:
    """The loop ``kind`` runs on here: "asyncio" or "uvloop"."""
    kind = parse(kind)
    if kind == "auto":
        return "uvloop" if available() else "asyncio"
    return kind


def run(kind: str, main: Coroutine[Any, Any, Any]) -> Any:
    """``asyncio.run(main)`` on the loop ``kind`` names."""
    if resolved(kind) == "uvloop":
        import uvloop

        return uvloop.run(main)  # a fresh loop for this run only: no global policy is set
    return asyncio.run(main)
