"""The coordinator's journal: its directory writable, and no other coordinator
holding it (coordinator/journal/lock.py)."""

from __future__ import annotations

import fcntl
import os

from watchdog.coordinator.journal.lock import SUFFIX

from .check import COORDINATOR, FIX, OK, Host, Result


def holder(journal: str) -> str | None:
    """The pid in the lock file while another process holds it, else None.
    Reads only: a lock that is not there is not made."""
    try:
        fd = os.open(journal + SUFFIX, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
    finally:
        os.close(fd)  # drops the shared lock, if taken
    return None


class Journal:
    name = "journal"
    roles = frozenset({COORDINATOR})

    def check(self, host: Host) -> Result:
        path = os.path.abspath(host.journal)
        parent = os.path.dirname(path)
        existing = parent
        while not os.path.isdir(existing):  # the coordinator creates the missing part (os.makedirs)
            existing = os.path.dirname(existing)
        if not os.access(existing, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
            return Result(
                self.name,
                FIX,
                f"{path} cannot be written by uid {host.euid} ({existing} is not writable)",
                f"create {parent} owned by the coordinator's user, or choose another --journal",
            )
        pid = holder(path)
        if pid is not None:
            return Result(
                self.name,
                FIX,
                f"{path} is in use by another coordinator (pid {pid})",
                "stop that coordinator, or give this one its own --journal",
            )
        return Result(self.name, OK, f"{path} writable, no coordinator holds it")
