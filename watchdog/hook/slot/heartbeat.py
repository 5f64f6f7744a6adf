"""The heartbeat: a named daemon thread that proves the process can still run Python.

Every interval it stores the monotonic time and a counter (single-writer words,
outside the seqlock) and polls the control block. It stops when asked, and is
joined with a timeout: a heartbeat must never hold up interpreter exit. A frozen
rank (SIGSTOP, a C call holding the GIL) stops beating: that is the signal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from watchdog.contracts.slot import H_HEARTBEAT_COUNT, H_HEARTBEAT_NS

THREAD_NAME = "watchdog-heartbeat"


class Heartbeat:
    def __init__(
        self,
        put: Callable[[int, int], None],
        interval_s: float,
        clock: Callable[[], int],
        poll: Callable[[], None],
        on_error: Callable[[str, BaseException], None],
    ) -> None:
        self._put = put  # SlotWriter.put: single-writer words, outside the seqlock
        self._interval_s = interval_s
        self._clock = clock
        self._poll = poll
        self._on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.count = 0

    def beat(self) -> None:
        self.count += 1
        self._put(H_HEARTBEAT_NS, self._clock())
        self._put(H_HEARTBEAT_COUNT, self.count)

    def _run(self) -> None:
        while True:
            try:
                self.beat()
                self._poll()
            except Exception as exc:  # the monitor counts it; may stop us via stop()
                self._on_error("heartbeat", exc)
            if self._stop.wait(self._interval_s):
                return

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread() and t.is_alive():
            t.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
