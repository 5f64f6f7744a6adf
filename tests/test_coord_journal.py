"""The JSONL journal: flushed, fsync'd for findings, readable after a kill."""

from __future__ import annotations

import json
import os
from pathlib import Path

from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal

GOLDEN = Path(__file__).parent / "golden" / "journal_events.txt"


def clock():
    return (1_700_000_000.5, 42.25)


def test_round_trip(tmp_path):
    path = tmp_path / "j" / "journal.jsonl"
    j = journal.Journal(str(path), clock)
    j.write(je.START, {"pid": 1})
    j.write(je.FINDING, {"kind": "dead_rank", "ranks": (3,), "evidence": {"x": float("nan")}})
    j.close()
    recs = journal.read(str(path))
    assert recs == [
        {"event": je.START, "t_wall": 1_700_000_000.5, "t_mono": 42.25, "pid": 1},
        {
            "event": je.FINDING,
            "t_wall": 1_700_000_000.5,
            "t_mono": 42.25,
            "kind": "dead_rank",
            "ranks": [3],
            "evidence": {"x": None},
        },
    ]


def test_flushed_on_every_write_without_close(tmp_path):
    path = tmp_path / "journal.jsonl"
    j = journal.Journal(str(path), clock)
    j.write(je.STATE, {"rank": 1})
    assert json.loads(path.read_text().splitlines()[0])["rank"] == 1  # visible to another reader now


def test_durable_events_are_fsynced(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(journal.os, "fsync", lambda fd: synced.append(fd))
    j = journal.Journal(str(tmp_path / "journal.jsonl"), clock)
    j.write(je.RANK_JOINED, {})
    assert synced == []
    j.write(je.FINDING, {})
    j.write(je.RESOLVED, {})
    assert len(synced) == 2
    # What an action did, the job's state and a lost host are what a post-mortem of a crash needs too.
    for event in (je.ACTION_OUTCOME, je.STATE, je.HOST_LOST):
        j.write(event, {})
    assert len(synced) == 5


def test_a_tick_commits_its_durable_records_with_one_fsync(tmp_path, monkeypatch):
    # A tick that sends a command to each of 2,048 hosts journals 2,048 durable
    # records: one fsync each took 1.5 s here. Inside batch() they are written and
    # visible at once, and synced together at the end; another thread's durable
    # record (the request loop's) is not held back by the tick's batch.
    import threading

    synced = []
    monkeypatch.setattr(journal.os, "fsync", lambda fd: synced.append(threading.current_thread().name))
    path = tmp_path / "journal.jsonl"
    j = journal.Journal(str(path), clock)
    with j.batch():
        for i in range(5):
            j.write(je.COMMAND, {"i": i})
        with j.batch():  # nested: joins the outer one
            j.write(je.FINDING, {})
        assert synced == [] and len(path.read_text().splitlines()) == 6  # written, not yet synced
        other = threading.Thread(target=j.write, args=(je.COMMAND_DONE, {}), name="loop")
        other.start()
        other.join()
        assert synced == ["loop"]
    assert synced == ["loop", threading.current_thread().name]
    with j.batch():
        j.write(je.RANK_JOINED, {})  # nothing durable: nothing to sync
    assert len(synced) == 2
    j.write(je.FINDING, {})  # outside a batch: synced at once, as always
    assert len(synced) == 3


def test_the_request_loops_durable_records_are_synced_with_the_next_tick(tmp_path, monkeypatch):
    # After a hang at 16,384 ranks every culprit host's stacks come back as command
    # outcomes on the request loop: an fsync each held the loop 2.2 s in 25 while
    # reports queued. Inside deferred() they are written (readable, safe from a
    # crash of the coordinator) and fsync'd when the next batch (tick) ends.
    import threading

    synced = []
    monkeypatch.setattr(journal.os, "fsync", lambda fd: synced.append(threading.current_thread().name))
    path = tmp_path / "journal.jsonl"
    j = journal.Journal(str(path), clock)

    def loop():
        with j.deferred():
            j.write(je.COMMAND_DONE, {"evidence": "stacks"})
            j.write(je.EVIDENCE, {})

    other = threading.Thread(target=loop, name="loop")
    other.start()
    other.join()
    assert synced == [] and len(path.read_text().splitlines()) == 2  # written, not yet synced
    with j.batch():  # the next tick: nothing durable of its own, the loop's records pending
        j.write(je.RANK_JOINED, {})
    assert synced == ["MainThread"]
    with j.batch():
        pass  # nothing pending any more: no fsync
    assert len(synced) == 1
    other = threading.Thread(target=loop, name="loop")
    other.start()
    other.join()
    j.write(je.FINDING, {})  # outside both: synced at once, as always, and the loop's with it
    with j.batch():
        pass
    assert len(synced) == 2
    with j.deferred():
        j.write(je.RANK_JOINED, {})  # not durable: nothing to sync later either
    with j.batch():
        pass
    assert len(synced) == 2


def test_event_names_are_the_golden_ones():
    """The event names are the journal's format, read by tools we do not own: a
    rename must be a deliberate change of tests/golden/journal_events.txt."""
    names = [v for k, v in vars(je).items() if k.isupper() and isinstance(v, str)]
    golden = GOLDEN.read_text().split()
    assert names == golden and golden == list(je.ALL)
    assert set(je.ALL) >= journal.DURABLE


def test_torn_last_line_is_skipped_and_terminated_on_reopen(tmp_path):
    path = tmp_path / "journal.jsonl"
    j = journal.Journal(str(path), clock)
    j.write(je.START, {})
    j.write(je.FINDING, {"kind": "frozen_rank"})
    j.close()
    with open(path, "ab") as fh:  # a kill mid-write
        fh.write(b'{"event":"finding","kind":"dea')
    assert [r["event"] for r in journal.read(str(path))] == [je.START, je.FINDING]
    j = journal.Journal(str(path), clock)  # the next coordinator appends after it
    j.write(je.START, {"again": True})
    j.close()
    recs = journal.read(str(path))
    assert [r["event"] for r in recs] == [je.START, je.FINDING, je.START] and recs[-1]["again"] is True
    assert path.read_bytes().count(b"\n") == 4


def test_garbage_lines_do_not_stop_the_reader(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b'{"event":"start"}\n\x00\xff\n[1,2]\n\n{"event":"stop"}\n')
    assert [r["event"] for r in journal.read(str(path))] == [je.START, je.STOP]


def test_write_after_close_is_a_no_op(tmp_path):
    j = journal.Journal(str(tmp_path / "journal.jsonl"), clock)
    j.close()
    j.write(je.STATE, {})
    assert os.path.getsize(tmp_path / "journal.jsonl") == 0
