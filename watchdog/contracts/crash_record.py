"""A rank's last words, beside its slot: the format of ``<slot>.crash`` (JSON: the
uncaught exception that ended the rank, or the failing exit call, ``sys.exit(1)``,
``os._exit(3)``, with the exception it was handling) and ``<slot>.fatal``
(faulthandler's text at a fatal signal), and their readers.

Why files: only a process's parent learns its exit status, and under torchrun
that is the elastic agent, not ours. What the rank itself can say before it
goes, it says here (the hook's writer: ``watchdog.hook.lifecycle.crash_writer``),
and the agent reads it once it sees the process gone (``watchdog.agent.deathcause``).

Rules: a record is bounded (MAX_TEXT per field, MAX_BYTES per file) and replaced
atomically (a reader never sees half a record); a reader takes only the rank's own
regular file (the slot's owner; never a link or a FIFO) and validates every field.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from watchdog import sharedfile

CRASH_SUFFIX = ".crash"
FATAL_SUFFIX = ".fatal"
RECORD_VERSION = 1  # the "v" field
MAX_TEXT = 1000  # one exception message
MAX_TRACEBACK = 8000  # the traceback's tail: the innermost frames are the useful ones
MAX_BYTES = 16384  # what a reader accepts from either file
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def crash_path(slot_path: str) -> str:
    return slot_path + CRASH_SUFFIX


def fatal_path(slot_path: str) -> str:
    return slot_path + FATAL_SUFFIX


def read_crash(slot_path: str) -> dict[str, Any] | None:
    """The agent's side: the record, or None (absent, torn, hostile: bounded and validated)."""
    try:  # only the rank's own file: the owner of the slot it sits beside, not a link, not a FIFO
        raw = sharedfile.read(crash_path(slot_path), _owner(slot_path), MAX_BYTES)
    except OSError:  # sharedfile.Untrusted too
        return None
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        return None
    out: dict[str, Any] = {}
    for key, limit in (
        ("type", 200),
        ("message", MAX_TEXT),
        ("where", 300),
        ("function", 200),
        ("thread", 200),
        ("traceback", MAX_TRACEBACK),
    ):
        value = obj.get(key, "")
        out[key] = value[:limit] if isinstance(value, str) else ""
    pid = obj.get("pid")
    out["pid"] = pid if isinstance(pid, int) and not isinstance(pid, bool) else 0
    ex = obj.get("exit")
    if isinstance(ex, dict):
        call, status = ex.get("call"), ex.get("status")
        if isinstance(call, str) and isinstance(status, int) and not isinstance(status, bool) and 0 <= status < 256:
            out["exit"] = {"call": call[:240], "status": status}
    return out


def read_fatal(slot_path: str) -> str:
    """faulthandler's dump (its tail, bounded), or ""."""
    try:  # as read_crash: the rank's own regular file only (a FIFO would block the agent)
        fd = os.open(fatal_path(slot_path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC)
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in _owner(slot_path):
            return ""
        return os.pread(fd, MAX_BYTES, max(0, st.st_size - MAX_BYTES)).decode("utf-8", "replace").strip()
    except OSError:
        return ""
    finally:
        os.close(fd)


def _owner(slot_path: str) -> frozenset[int]:
    try:
        return frozenset({os.lstat(slot_path).st_uid})
    except OSError:
        return frozenset()
