"""One coordinator per journal: a second real coordinator on the same journal is
refused at start with the first one's pid, writes nothing to it, and the journal
is free again once the first has stopped (or died: the kernel drops the lock)."""

from __future__ import annotations

import os

import pytest

from watchdog.coordinator.journal import jsonl as journal
from watchdog.coordinator.journal import lock as journallock
from watchdog.dev import localjob

pytestmark = pytest.mark.integration


def start(tmp_path, name: str, journal_path):
    flags = ["--job.name", "job", "--job.world-size", "2", "--journal", str(journal_path)]
    return localjob.start_daemon(name, "coordinator", flags, tmp_path)


def test_a_second_coordinator_on_the_journal_is_refused(tmp_path):
    path = tmp_path / "j.jsonl"
    first = start(tmp_path, "first", path)
    try:
        records = len(journal.read(str(path)))
        with pytest.raises(RuntimeError) as refused:
            start(tmp_path, "second", path)
        text = str(refused.value)
        assert "exited with 1" in text, text
        assert f"in use by another coordinator (pid {first.popen.pid}" in text, text
        assert len(journal.read(str(path))) == records  # the second wrote nothing
    finally:
        assert first.stop() == 0
    # Killed or stopped, the lock goes with the process: the next one starts.
    third = start(tmp_path, "third", path)
    third.popen.kill()
    third.popen.wait()
    fourth = start(tmp_path, "fourth", path)
    assert fourth.stop() == 0


def test_lock_in_process(tmp_path):
    path = str(tmp_path / "j.jsonl")
    fd = journallock.acquire(path)
    try:
        with pytest.raises(journallock.JournalLocked, match=f"pid {os.getpid()}"):
            journallock.acquire(path)
    finally:
        journallock.release(fd)
    journallock.release(journallock.acquire(path))


def test_a_symlink_at_the_lock_name_is_not_followed(tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me")
    (tmp_path / ("j.jsonl" + journallock.SUFFIX)).symlink_to(target)
    with pytest.raises(OSError):
        journallock.acquire(str(tmp_path / "j.jsonl"))
    assert target.read_text() == "keep me"
