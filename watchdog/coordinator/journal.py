"""The append-only JSONL journal: one object per line, ``event``, ``t_wall``,
``t_mono`` and the payload.

Every write is flushed; findings, resolutions, start/stop, commands sent and
their outcomes (evidence included) are also fsync'd,
so what paged someone survives a crash. A kill mid-write leaves at most a torn
last line: ``read`` skips lines that do not parse, and a writer reopening a
journal that does not end in a newline first terminates the torn line, so it can
never glue itself to the next record.
"""

from __future__ import annotations

import json
import math
import os
import threading
from typing import Any, Callable, Iterator

from . import journal_events as je

JOURNAL_MODE = 0o600
# An action's decision, end and restart are what a restarted coordinator rebuilds its budget from (recover.py).
DURABLE = frozenset({je.START, je.CONFIG, je.FINDING, je.RESOLVED, je.STOP, je.ACTION, je.ACTION_OUTCOME, je.RESTART,
                     je.RECOVERED, je.COMMAND, je.EVIDENCE, je.COMMAND_DONE, je.COMMAND_REFUSED, je.COMMAND_EXPIRED})


def _default(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def _clean(obj: Any) -> Any:
    """JSON has no NaN/inf; a journal line must stay parseable by anything."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


class Journal:
    def __init__(self, path: str, clock: Callable[[], tuple[float, float]]) -> None:
        """``clock`` returns (wall, mono); injected so tests control both."""
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        # 0600: the journal holds stacks, slot contents and command ids of a job.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), JOURNAL_MODE)
        self._fh = os.fdopen(fd, "ab", buffering=0)
        if self._fh.tell() > 0:
            with open(path, "rb") as fh:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    self._fh.write(b"\n")

    def write(self, event: str, payload: dict[str, Any] | None = None, *, durable: bool | None = None) -> dict:
        wall, mono = self._clock()
        record = {"event": event, "t_wall": round(wall, 6), "t_mono": round(mono, 6), **(payload or {})}
        line = json.dumps(_clean(record), default=_default, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            if self._fh.closed:
                return record
            self._fh.write(line)  # unbuffered: one write() per record
            if (event in DURABLE) if durable is None else durable:
                os.fsync(self._fh.fileno())
        return record

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                os.fsync(self._fh.fileno())
                self._fh.close()


def iter_records(path: str) -> Iterator[dict]:
    with open(path, "rb") as fh:
        for raw in fh:
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                continue  # torn by a kill mid-write
            if isinstance(obj, dict) and "event" in obj:
                yield obj


def read(path: str) -> list[dict]:
    """All intact records, in order; torn lines skipped."""
    return list(iter_records(path))
