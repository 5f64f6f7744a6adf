"""Stop a daemon on SIGTERM/SIGINT without taking a lock inside the signal handler.

A Python signal handler runs in the main thread between two bytecodes, possibly
while that thread holds the stop event's internal lock inside ``Event.wait``.
``Event.set()`` takes the same lock, which is not reentrant: called from the
handler it deadlocks, and the daemon ignores SIGTERM for good (an agent that did
not stop within 10 s of SIGTERM, once in CI). Logging from the handler has the
same hazard with the stream's lock. So the handler only writes the signal's
number into a pipe (one system call, no Python lock); a thread of its own reads
it, says it, and sets the event.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signals(
    stop: threading.Event,
    on_signal: Callable[[str], None] = lambda _name: None,
    signals: Iterable[signal.Signals] = DEFAULT_SIGNALS,
) -> None:
    """Install handlers (main thread only) that set ``stop``; ``on_signal(name)`` runs
    first, on the relay thread, once per signal received."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def handler(signum: int, _frame: object) -> None:
        try:
            os.write(write_fd, bytes([signum]))
        except OSError:  # pipe full: stops are already on their way
            pass

    def relay() -> None:
        while True:
            received = os.read(read_fd, 64)
            for signum in received:
                try:
                    on_signal(signal.Signals(signum).name)
                finally:
                    stop.set()

    threading.Thread(target=relay, name="watchdog-signals", daemon=True).start()
    for sig in signals:
        signal.signal(sig, handler)
