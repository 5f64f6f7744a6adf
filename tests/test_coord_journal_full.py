"""A full disk under the journal: a short write is an error, counted, and the journal
resumes cleanly with a record of the gap.

Before: ``write()``'s short count was ignored, the torn half-record stayed, and the
next record was glued onto it: both lost, nothing counted.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from typing import cast

import pytest
from prometheus_client import CollectorRegistry

from watchdog.contracts.journal.findings import FindingRecord, ResolvedRecord
from watchdog.coordinator.config import Config
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.coordinator.service import Coordinator


def clock():
    return (1_700_000_000.5, 42.25)


class _DiskFillsUp:
    """The journal's file, as a disk that fills after ``room`` more bytes: a write stores
    what fits and returns that count (what the kernel does on ENOSPC part-way), then
    raises ENOSPC while full; ``free()`` empties the disk."""

    def __init__(self, fh, room: int) -> None:
        self._fh, self.room = fh, room

    def write(self, data: bytes) -> int:
        if self.room <= 0:
            raise OSError(28, "No space left on device")
        n = min(len(data), self.room)
        self.room -= n
        return self._fh.write(data[:n])

    def free(self) -> None:
        self.room = 1 << 30

    def __getattr__(self, name):
        return getattr(self._fh, name)


def _fill_up(j: journal.Journal, room: int) -> _DiskFillsUp:
    """Put ``j``'s file behind a disk with ``room`` bytes left."""
    disk = _DiskFillsUp(j._fh, room)
    j._fh = cast(io.FileIO, disk)  # the file itself but for write() and free()
    return disk


def _lines(path):
    return [json.loads(raw) for raw in path.read_bytes().splitlines()]  # every line must parse


def test_short_write_is_an_error_the_torn_bytes_go_and_the_gap_is_journaled(tmp_path):
    path = tmp_path / "journal.jsonl"
    j = journal.Journal(str(path), clock)
    j.write(je.START, {})
    disk = _fill_up(j, room=20)
    with pytest.raises(OSError) as err:
        j.write(je.FINDING, {"kind": "dead_rank", "ranks": [1]})
    assert isinstance(err.value, journal.ShortWrite)
    with pytest.raises(OSError):
        j.write(je.STATE, {"rank": 1})  # still full
    disk.free()
    j.write(je.RESOLVED, {"kind": "dead_rank"})
    j.close()
    recs = _lines(path)  # no torn, no glued line
    assert [r["event"] for r in recs] == [je.START, je.JOURNAL_GAP, je.RESOLVED]
    assert recs[1]["lost_records"] == 2 and "short write" in recs[1]["error"]


def test_when_the_torn_bytes_cannot_be_cut_the_next_record_starts_a_fresh_line(tmp_path, monkeypatch):
    path = tmp_path / "journal.jsonl"
    j = journal.Journal(str(path), clock)
    j.write(je.START, {})
    disk = _fill_up(j, room=20)

    def no_truncate(fd, size):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(journal.os, "ftruncate", no_truncate)
    with pytest.raises(OSError):
        j.write(je.FINDING, {"kind": "dead_rank"})
    disk.free()
    j.write(je.RESOLVED, {})
    j.close()
    assert [r["event"] for r in journal.read(str(path))] == [je.START, je.JOURNAL_GAP, je.RESOLVED]


def test_the_coordinator_counts_a_short_write_and_keeps_going(tmp_path):
    registry = CollectorRegistry()
    j = journal.Journal(str(tmp_path / "journal.jsonl"), clock)
    c = Coordinator(Config(journal=j.path), j, registry)
    disk = _fill_up(j, room=10)
    c._record(FindingRecord(kind="dead_rank"))
    assert registry.get_sample_value("watchdog_coordinator_journal_errors_total") == 1
    disk.free()
    c._record(ResolvedRecord(kind="dead_rank"))
    assert registry.get_sample_value("watchdog_coordinator_journal_errors_total") == 1
    j.close()
    assert [r["event"] for r in journal.read(j.path)][-2:] == [je.JOURNAL_GAP, je.RESOLVED]


# A real short write from the kernel: RLIMIT_FSIZE makes write() store up to the limit and return the
# count, as a full disk does (in a child process: the limit would apply to pytest's own files too).
_CHILD = textwrap.dedent("""
    import resource, signal, sys
    from watchdog.coordinator.journal import jsonl as journal, event_names as je
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    j = journal.Journal(sys.argv[1], lambda: (1.0, 2.0))
    j.write(je.START, {})
    size = j._fh.tell()
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, hard))
    errors = 0
    for i in range(10):
        try:
            j.write(je.FINDING, {"i": i, "pad": "x" * 40})
        except OSError as exc:
            errors += 1
            print(type(exc).__name__, exc, file=sys.stderr)
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    j.write(je.STOP, {})
    j.close()
    print(errors)
""")


def test_a_real_short_write_at_a_file_size_limit(tmp_path):
    path = tmp_path / "journal.jsonl"
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ShortWrite" in out.stderr  # the kernel stored part of a record: seen, not ignored
    recs = _lines(path)
    events = [r["event"] for r in recs]
    written = [r["i"] for r in recs if r["event"] == je.FINDING]
    gap = next(r for r in recs if r["event"] == je.JOURNAL_GAP)
    assert events[0] == je.START and events[-2:] == [je.JOURNAL_GAP, je.STOP]
    assert written == list(range(len(written))) and gap["lost_records"] == 10 - len(written) == int(out.stdout)
