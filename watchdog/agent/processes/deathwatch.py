"""When exactly did a rank's process exit? A thread blocked on the ranks' pidfds.

Why: when one rank dies, torchrun tears the others down within tens of
milliseconds, often inside one 100 ms agent poll. Seen from the poll, every rank
died "at the same time" and the root cause cannot be told from the victims. A
pidfd becomes readable the moment its process exits; a thread blocked in
``poll()`` on all of them timestamps each exit to within a millisecond or so
(GIL hand-over included), which orders the deaths.

The thread owns its poll object (registration requests reach it through a
queue and a wake-up pipe), holds duplicates of the table's pidfds (closing is
independent), and never touches anything else.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any


class DeathWatch:
    def __init__(self, clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        self._pending: list[tuple[Hashable, int, Callable[[], Any] | None]] = []
        self._exit_ns: dict[Hashable, int] = {}
        self._info: dict[Hashable, Any] = {}
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._wfd, False)
        self._stop = False
        self._thread: threading.Thread | None = None

    def watch(self, key: Hashable, pidfd: int, probe: Callable[[], Any] | None = None) -> None:
        """Start timing ``key``'s exit; ``pidfd`` stays the caller's (we dup it).
        ``probe`` runs on this thread the moment the exit is seen, while the process
        is still a zombie its parent has not reaped (its exit status is readable
        then, see deathcause.py); what it returns is ``info(key)``."""
        try:
            fd = os.dup(pidfd)
        except OSError:
            return
        with self._lock:
            self._pending.append((key, fd, probe))
            if self._thread is None:  # lazy: no thread until there is a rank to watch
                self._thread = threading.Thread(target=self._run, name="watchdog-deathwatch", daemon=True)
                self._thread.start()
        self._wake()

    def exit_ns(self, key: Hashable) -> int | None:
        """Monotonic ns when ``key``'s process exited, if seen."""
        with self._lock:
            return self._exit_ns.get(key)

    def info(self, key: Hashable) -> Any:
        """What the probe returned at ``key``'s exit (None: no probe, not yet, or it failed)."""
        with self._lock:
            return self._info.get(key)

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._exit_ns.pop(key, None)
            self._info.pop(key, None)

    def close(self, timeout_s: float = 1.0) -> None:
        self._stop = True
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _wake(self) -> None:
        try:
            os.write(self._wfd, b"x")
        except OSError:  # pipe full: a wake-up is already pending
            pass

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._rfd, select.POLLIN)
        keys: dict[int, tuple[Hashable, Callable[[], Any] | None]] = {}
        while not self._stop:
            try:
                ready = poller.poll(1000)
            except InterruptedError:
                continue
            now = self._clock_ns()
            for fd, _ in ready:
                if fd == self._rfd:
                    os.read(self._rfd, 4096)
                    continue
                key, probe = keys.pop(fd, (None, None))
                poller.unregister(fd)
                os.close(fd)
                if key is None:
                    continue
                info = None
                if probe is not None:
                    try:
                        info = probe()
                    except Exception:  # a post-mortem detail, never the thread
                        info = None
                with self._lock:
                    self._exit_ns.setdefault(key, now)
                    if info is not None:
                        self._info.setdefault(key, info)
            with self._lock:
                pending, self._pending = self._pending, []
            for key, fd, probe in pending:
                keys[fd] = (key, probe)
                poller.register(fd, select.POLLIN)
        for fd in keys:
            os.close(fd)
