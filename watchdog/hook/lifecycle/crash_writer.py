"""The hook's side of a rank's last words (the format and its readers:
``watchdog.contracts.crash_record``): the record of an uncaught exception or a
failing exit call, written from an excepthook or at exit, and faulthandler pointed
at ``<slot>.fatal`` for a fatal signal.

Rules: every function here is called from an excepthook or at install and never
raises; the user's faulthandler set-up wins (if faulthandler is already enabled we
leave it alone).
"""

from __future__ import annotations

import faulthandler
import json
import os
import stat
import time
import traceback
from typing import IO, Any

from watchdog import sharedfile
from watchdog.contracts.crash_record import MAX_BYTES, MAX_TEXT, MAX_TRACEBACK, RECORD_VERSION, crash_path, fatal_path

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_FATAL_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC


def describe(
    exc_type: type | None, exc: BaseException | None, tb: Any, thread: str, exit_call: dict | None = None
) -> dict[str, Any]:
    """The record for one exception: type, message, where it was raised (the
    innermost frame, ``file.py:line``), bounded traceback text. ``exit_call``: how
    the process asked to leave (``{"call": "sys.exit(1)", "status": 1}``), with the
    exception it was handling then, or none (type "")."""
    frames = traceback.extract_tb(tb) if tb is not None else []
    last = frames[-1] if frames else None
    text = "".join(traceback.format_exception(exc_type, exc, tb)) if exc_type is not None else ""
    return {
        "v": RECORD_VERSION,
        **({"exit": exit_call} if exit_call else {}),
        "type": getattr(exc_type, "__qualname__", str(exc_type))[:200] if exc_type is not None else "",
        "message": str(exc)[:MAX_TEXT] if exc is not None else "",
        "where": f"{os.path.basename(last.filename)}:{last.lineno}" if last else "",
        "function": last.name if last else "",
        "thread": thread[:200],
        "traceback": text[-MAX_TRACEBACK:],
        "t_wall": round(time.time(), 6),
        "pid": os.getpid(),
    }


def write(
    slot_path: str | None,
    exc_type: type | None,
    exc: BaseException | None,
    tb: Any,
    thread: str,
    exit_call: dict | None = None,
) -> bool:
    """Record an uncaught exception (or a failing exit call, see ``describe``);
    False (never an exception) when it could not be."""
    if not slot_path:
        return False
    try:
        return write_record(slot_path, describe(exc_type, exc, tb, thread, exit_call))
    except Exception:  # an excepthook must not fail on top of the crash
        return False


def write_record(slot_path: str | None, record: dict[str, Any]) -> bool:
    """Write a record made earlier by ``describe``; False when it could not be."""
    if not slot_path:
        return False
    try:
        data = json.dumps(record, default=str).encode()[:MAX_BYTES]
        path = crash_path(slot_path)
        sharedfile.write(os.path.dirname(path) or ".", os.path.basename(path), data)  # never through a planted link
        return True
    except Exception:  # an excepthook must not fail on top of the crash
        return False


def clear(slot_path: str | None) -> None:
    """At install: a slot file name (job, rank, pid) can come back with a reused
    pid; the crash record left by its earlier owner must not be read as ours."""
    if not slot_path:
        return
    for path in (crash_path(slot_path), fatal_path(slot_path)):
        try:
            os.unlink(path)
        except OSError:
            pass


class FatalDump:
    """faulthandler into ``<slot>.fatal`` for a segfault/abort (SIGSEGV, SIGABRT,
    SIGBUS, SIGFPE, SIGILL): the Python stack of every thread at the fatal
    signal. Enabled only where faulthandler is not already on (the user's or
    PYTHONFAULTHANDLER's target is kept)."""

    def __init__(self) -> None:
        self._fh: IO[bytes] | None = None
        self.path = ""

    def enable(self, slot_path: str | None) -> bool:
        if not slot_path or self._fh is not None:
            return False
        try:
            if faulthandler.is_enabled():
                return False
            path = fatal_path(slot_path)
            # The run dir is shared: never through a link another user planted, never
            # blocked by a FIFO (install must not block), only a regular file of ours.
            fd = os.open(path, _FATAL_FLAGS, 0o644)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                os.close(fd)
                return False
            fh = os.fdopen(fd, "wb")
            faulthandler.enable(file=fh, all_threads=True)
        except Exception:  # a rank without it still trains
            return False
        self._fh, self.path = fh, path
        return True

    def forget_in_child(self) -> None:
        """After fork: the child must not write into the parent's file (nor close
        or unlink it: the descriptor and its offset are shared)."""
        if self._fh is not None:
            try:
                faulthandler.disable()
            except Exception:
                pass
            self._fh = None

    def disable(self) -> None:
        """At a clean close: stop, and leave no empty file behind."""
        fh, self._fh = self._fh, None
        if fh is None:
            return
        try:
            faulthandler.disable()
            empty = fh.tell() == 0
            fh.close()
            if empty:
                os.unlink(self.path)
        except Exception:
            pass
