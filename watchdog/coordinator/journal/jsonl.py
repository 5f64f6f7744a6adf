"""The append-only JSONL journal: one object per line, ``event``, ``t_wall``,
``t_mono`` and the payload.

Every write is flushed; findings, resolutions, start/stop, commands sent and
their outcomes (evidence included) are also fsync'd,
so what paged someone survives a crash. Group commit: inside ``batch()`` (the
coordinator's tick) this thread's durable records are written and flushed at
once, as always, and fsync'd together when the block ends. A tick that sends
``snapshot_slots`` to 2,048 hosts journals 2,048 commands: one fsync each took
1.5 s on this project's VM, the tick's whole budget and more, and several
seconds on a busy disk. The request loop's durable records (commands' outcomes
and the evidence they carry, written inside ``deferred()``) are written and
flushed at once too, and fsync'd with the next tick's: after a hang at 16,384
ranks, an fsync per outcome held the loop 2.2 s out of 25 while reports
queued. A crash of the coordinator loses nothing either way (the records are
in the kernel), and a crash of the machine at most what was written since the
last tick began. A kill mid-write leaves at most a torn
last line: ``read`` skips lines that do not parse, and a writer reopening a
journal that does not end in a newline first terminates the torn line, so it can
never glue itself to the next record.

A full disk (or a file size limit) makes ``write()`` store part of a record and
return a short count, silently. That is an error here (``ShortWrite``, an
OSError the coordinator counts): the torn bytes are cut off again, or if that
fails the next record starts on a fresh line; and the first record that gets
through afterwards is preceded by a ``journal_gap`` record saying how many were
lost since when, so a post-mortem knows the hole is there.

Trust. The journal is what a restarted coordinator rebuilds its decisions from,
so nobody else may write it: it is opened without following a link
(``O_NOFOLLOW``), and an existing journal owned by another user or writable by
every user is refused (``JournalRefused``, a clear error at start). With a job
token every line carries a MAC keyed by it (``journal_line.sign``); replay
(``iter_records`` with the key) skips a line whose MAC is wrong, and an unsigned
line after the first signed one: a line appended by someone without the token.
Unsigned lines before the first signed one are a journal written without a
token (or before MACs) and are read as they always were.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import threading
from collections.abc import Callable, Iterator
from typing import Any

from watchdog.contracts.journal import line as journal_line
from watchdog.contracts.journal.lifecycle import JournalGapRecord
from watchdog.contracts.journal.reader import iter_records, read
from watchdog.contracts.journal.record import Record

from . import event_names as je

__all__ = ["DURABLE", "Journal", "JournalRefused", "ShortWrite", "iter_records", "read"]

JOURNAL_MODE = 0o600
# Fsync'd: what paged someone, and what a restarted coordinator rebuilds its decisions
# from (control/replay.py: an action's decision, end and restart).
DURABLE = frozenset(
    {
        je.START,
        je.CONFIG,
        je.FINDING,
        je.RESOLVED,
        je.STOP,
        je.ACTION,
        je.ACTION_OUTCOME,
        je.RESTART,
        je.LAUNCHER_RESTART,
        je.RECOVERED,
        je.STATE,
        je.HOST_LOST,
        je.LAUNCHER_EXITED,
        je.JOURNAL_GAP,
        je.COMMAND,
        je.EVIDENCE,
        je.COMMAND_DONE,
        je.COMMAND_REFUSED,
        je.COMMAND_EXPIRED,
    }
)


class ShortWrite(OSError):
    """``write()`` stored only part of a record (disk full, file size limit)."""

    def __init__(self, wrote: int, wanted: int) -> None:
        super().__init__(errno.ENOSPC, f"short write: {wrote} of {wanted} bytes (disk full?)")


class JournalRefused(OSError):
    """An existing journal this coordinator must not write or believe."""


def _open(path: str) -> int:
    # 0600: the journal holds stacks, slot contents and command ids of a job.
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, JOURNAL_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise JournalRefused(
                f"journal {path} is a symbolic link: refused (it could point at any file; give the real path)",
            ) from None
        raise
    st = os.fstat(fd)
    why = ""
    if stat.S_ISREG(st.st_mode) and st.st_uid != os.geteuid():
        why = f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    elif stat.S_ISREG(st.st_mode) and st.st_mode & stat.S_IWOTH:
        why = f"is writable by every user (mode {stat.filemode(st.st_mode)})"
    if why:
        os.close(fd)
        raise JournalRefused(
            f"journal {path} {why}: refused, since a restarted coordinator rebuilds its decisions from it; "
            f"move it aside or fix its owner and mode (0600)",
        )
    return fd


class Journal:
    def __init__(self, path: str, clock: Callable[[], tuple[float, float]], key: str = "") -> None:
        """``clock`` returns (wall, mono); injected so tests control both. ``key``: the
        job token, which signs every line ("" = unsigned lines)."""
        self.path = path
        self._clock = clock
        self._key = key.encode()
        self._lock = threading.Lock()
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        fd = _open(path)
        self._fh = os.fdopen(fd, "ab", buffering=0)
        self._torn = False  # the file may end inside a record: start the next one on a fresh line
        self.lost = 0  # records not written since the last one that was (journaled as journal_gap)
        self._lost_since_wall = 0.0
        self._first_error = ""
        size = os.fstat(fd).st_size
        if size > 0:
            self._torn = os.pread(fd, 1, size - 1) != b"\n"
        self._good_end = self._fh.tell()  # the file's length after the last whole record
        self._batching = threading.local()  # per thread: another thread's durable record is not held back
        self._deferring = threading.local()  # per thread: durable records left to the next batch's fsync
        self._unsynced = False  # a deferred durable record was written since the last fsync

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group commit for this thread: durable records written inside are fsync'd
        once, at the end of the block (nested blocks join the outer one)."""
        local = self._batching
        if getattr(local, "on", False):
            yield
            return
        local.on, local.dirty = True, False
        try:
            yield
        finally:
            local.on = False
            with self._lock:
                if (local.dirty or self._unsynced) and not self._fh.closed:
                    self._unsynced = False
                    os.fsync(self._fh.fileno())  # an OSError: the tick's, logged and counted there

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """For the request loop: durable records written inside are fsync'd by the
        next ``batch()`` to end (the next tick's), not one by one on the loop."""
        local = self._deferring
        outer = getattr(local, "on", False)
        local.on = True
        try:
            yield
        finally:
            local.on = outer

    def _append(self, data: bytes, fsync: bool) -> None:
        """One whole record or an OSError; never leaves a partial record behind if it can help it."""
        if self._torn:
            data = b"\n" + data
        try:
            wrote = self._fh.write(data)  # unbuffered: one write() per record
            if wrote != len(data):
                raise ShortWrite(wrote or 0, len(data))
            if fsync:
                if getattr(self._batching, "on", False):
                    self._batching.dirty = True
                elif getattr(self._deferring, "on", False):
                    self._unsynced = True
                else:
                    os.fsync(self._fh.fileno())
                    self._unsynced = False  # what was deferred is synced with it
        except OSError:
            try:  # cut the torn bytes off again (shrinking a file needs no free space); _torn stays as it was
                os.ftruncate(self._fh.fileno(), self._good_end)
            except OSError:
                self._torn = True
            raise
        self._torn = False
        self._good_end += len(data)

    def write(self, event: str | Record, payload: dict[str, Any] | None = None, *, durable: bool | None = None) -> dict:
        """Appends ``event``: a typed record (its ``t_wall``/``t_mono`` stamped here), or an
        event name and its payload."""
        if isinstance(event, Record):
            name, payload = event.event, event.payload()
        else:
            name = event
        wall, mono = self._clock()
        record = {"event": name, "t_wall": round(wall, 6), "t_mono": round(mono, 6), **(payload or {})}
        line = self._signed(journal_line.line(record))
        with self._lock:
            if self._fh.closed:
                return record
            if self.lost:
                gap = JournalGapRecord(
                    t_wall=round(wall, 6),
                    t_mono=round(mono, 6),
                    lost_records=self.lost,
                    since_wall=round(self._lost_since_wall, 6),
                    error=self._first_error,
                ).to_dict()
                try:
                    self._append(self._signed(json.dumps(gap, separators=(",", ":")).encode() + b"\n"), fsync=True)
                except OSError as exc:
                    self._lose(wall, exc)
                    raise
                self.lost = 0
            try:
                self._append(line, fsync=(name in DURABLE) if durable is None else durable)
            except OSError as exc:
                self._lose(wall, exc)
                raise
        return record

    def _signed(self, line: bytes) -> bytes:
        return journal_line.sign(line, self._key) if self._key else line

    def _lose(self, wall: float, exc: OSError) -> None:
        if not self.lost:  # the first failure says why; the ones after it repeat "disk full"
            self._lost_since_wall = wall
            self._first_error = str(exc)
        self.lost += 1

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                os.fsync(self._fh.fileno())
                self._fh.close()
