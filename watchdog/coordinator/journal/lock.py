"""One coordinator per journal: an exclusive lock on ``<journal>.lock``.

Two coordinators appending to one journal (a systemd instance and a manual run,
a shared volume) interleave their records, and a restarted one would rebuild its
decisions from both. The second is refused at start, naming the first's pid. The
lock is ``flock`` on a file of its own, so the journal's own open is untouched;
the kernel drops it when the process ends, however it ends (no stale lock after a
SIGKILL). On NFS, Linux maps flock to a byte-range lock the server holds, so two
hosts sharing a volume are refused too.
"""

from __future__ import annotations

import fcntl
import os
import stat

SUFFIX = ".lock"


class JournalLocked(OSError):
    """Another live process holds the journal."""


def acquire(journal: str) -> int:
    """The locked file's descriptor (keep it open while the journal is in use;
    ``release`` or the process's end frees it). Raises JournalLocked, or OSError
    when the lock file cannot be made."""
    path = journal + SUFFIX
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    # O_NOFOLLOW: a symlink planted at the lock's name must not make us write elsewhere.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise JournalLocked(
                f"journal {journal} is in use by another coordinator (pid {holder}, lock {path}): "
                f"stop that one, or give this one its own --journal"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def release(fd: int) -> None:
    try:
        os.close(fd)  # closing the last descriptor drops the flock
    except OSError:
        pass
