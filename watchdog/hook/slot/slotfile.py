"""Create and map a rank's slot file, or fall back to anonymous memory.

The file must never be able to hurt training. Two hazards matter:

* A sparse file on a full filesystem (tmpfs included) SIGBUSes the process on the
  first store to an unbacked page. Writing the file's zeros up front (34 KiB by
  default) allocates every block, so a full disk is an OSError here, at install,
  instead. (posix_fallocate would too, but not on every filesystem: NFS, some
  overlays answer EOPNOTSUPP.)
* An unusable run directory (read-only, not a directory, no permission). The hook
  then maps anonymous memory of the same size: every code path stays the same,
  the agent simply cannot see this rank. The caller counts and logs the error.

* A run directory someone else controls (``rundir.insecure``: created first by
  another user under a predictable /tmp name, or world-writable without the
  sticky bit). It is refused like an unusable one: anonymous memory, and the
  hook's warning says why.

The path is replaced rather than reused: a file left there by an earlier process
with the same pid is stale, possibly corrupt, possibly another size.
"""

from __future__ import annotations

import errno
import mmap
import os
from dataclasses import dataclass

from watchdog import rundir

FILE_MODE = 0o644
DIR_MODE = 0o755


@dataclass
class SlotMapping:
    mm: mmap.mmap
    path: str | None  # None: anonymous fallback, nobody else can read it
    error: OSError | None  # why the file could not be used


def _create_file(path: str, size: int) -> mmap.mmap:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # exact mode whatever the umask: the agent must read it
        written = os.pwrite(fd, bytes(size), 0)
        if written != size:
            raise OSError(errno.ENOSPC, f"short write reserving the slot ({written} of {size} bytes)", path)
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)  # the mapping keeps its own reference


def open_slot(run_dir: str, filename: str, size: int) -> SlotMapping:
    """Never raises OSError: a failure returns an anonymous mapping plus the error."""
    path = os.path.join(run_dir, filename)
    try:
        os.makedirs(run_dir, mode=DIR_MODE, exist_ok=True)
        why = rundir.insecure(run_dir)
        if why:
            raise PermissionError(
                errno.EPERM,
                f"run dir refused: {run_dir} {why}; this rank's slot is kept in memory only, invisible to the agent",
                run_dir,
            )
        return SlotMapping(_create_file(path, size), path, None)
    except OSError as exc:
        return SlotMapping(mmap.mmap(-1, size), None, exc)
