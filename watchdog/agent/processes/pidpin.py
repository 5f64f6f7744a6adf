"""Pin a process for the length of an action on it (a py-spy dump), so the
action's result can be trusted to be about the process whose identity was
checked.

A pid is only a number: once the process exits and is reaped, the number can be
handed to an unrelated process, and a dump taken "of pid 4242" may be of that
one. A pidfd opened *before* the identity check refers to the checked process
for good: if it reports an exit by the end of the action, the result is
discarded. Without pidfds (an old kernel, a sandbox) the start time is read
again afterwards instead, which catches the same reuse slightly less surely.
"""

from __future__ import annotations

import os
import select


class Pin:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.gone = False
        self._fd: int | None = None
        if hasattr(os, "pidfd_open"):
            try:
                self._fd = os.pidfd_open(pid)
            except ProcessLookupError:
                self.gone = True
            except OSError:  # ENOSYS / EPERM: the caller's start-time re-check remains
                self._fd = None

    @property
    def pinned(self) -> bool:
        return self._fd is not None

    def exited(self) -> bool:
        """The pinned process has exited since the pin (always False unpinned)."""
        if self.gone:
            return True
        if self._fd is None:
            return False
        p = select.poll()
        p.register(self._fd, select.POLLIN)
        return bool(p.poll(0))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Pin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
