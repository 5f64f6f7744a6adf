"""The journal is what a restarted coordinator rebuilds its decisions from: nobody
else may write it (journal.py's "Trust"). Another user is uid 65534 here (files
chowned to it, no account needed)."""

from __future__ import annotations

import json
import os

import pytest

from watchdog.contracts.journal import line as journal_line
from watchdog.coordinator.config import Config
from watchdog.coordinator.control import replay as recover
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.coordinator.journal.jsonl import Journal, JournalRefused
from watchdog.coordinator.policy_file import Policy
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.vocabularies import JobState

TOKEN = "0123456789abcdef0123456789abcdef"
KEY = TOKEN.encode()
WALL0 = 1_700_000_000.0
FORGED = b'{"event":"state","job_state":"failed"}\n'


def clock():
    return (WALL0, 5.0)


def signed(record: dict, key: bytes = KEY) -> bytes:
    return journal_line.sign(journal_line.line(record), key)


@pytest.mark.parametrize(
    "raw, key, verdict",
    [
        (signed({"event": "start", "job": "j"}), KEY, True),
        (signed({"event": "start", "job": "j"}), b"another token", False),  # written with another token
        (signed({"event": "start", "job": "j"}).replace(b'"j"', b'"k"'), KEY, False),  # a value changed
        (signed({"event": "start", "job": "j"}).rstrip(b"\n"), KEY, True),  # the last line, no newline
        (journal_line.line({"event": "start", "job": "j"}), KEY, None),  # unsigned
        (FORGED, KEY, None),
        (b'{"event":"state","mac":"' + b"0" * 32 + b'"}\n', KEY, False),  # a guessed MAC
        (b'{"event":"state","mac":"short"}\n', KEY, None),
        (b"", KEY, None),
    ],
)
def test_a_line_mac_verifies_only_for_its_key_and_its_bytes(raw, key, verdict):
    assert journal_line.verify(raw, key) is verdict


def test_a_signed_line_is_the_unsigned_line_plus_one_last_field():
    record = {"event": "finding", "t_wall": 1.5, "ranks": [0, 1], "reason": "dead rank ü"}
    plain = journal_line.line(record)
    line = journal_line.sign(plain, KEY)
    assert line.startswith(plain[:-2] + b',"mac":"') and line.endswith(b'"}\n')
    assert json.loads(line) == {**record, "mac": line[-35:-3].decode()}


def test_replay_skips_lines_appended_without_the_token_and_reads_journals_without_macs(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_bytes(journal_line.line({"event": je.START, "job": "old"}))  # written before MACs (or without a token)
    j = Journal(str(path), clock, TOKEN)
    j.write(je.START, {"job": "job"})
    j.close()
    with open(path, "ab") as fh:  # what another user with write access appended
        fh.write(FORGED)
        fh.write(b'{"event":"state","job_state":"failed","mac":"' + b"0" * 32 + b'"}\n')
    ignored: list[int] = []
    records = list(journal.iter_records(str(path), TOKEN, ignored))
    assert [(r["event"], r.get("job")) for r in records] == [(je.START, "old"), (je.START, "job")]
    assert ignored == [3, 4] and "mac" not in records[1]
    assert [r["event"] for r in journal.read(str(path))][-1] == je.STATE  # without the key: read as written
    policy = Policy(actions={"dead_rank": "abort"}, min_finding_age_s=0)
    assert recover.replay(journal.read(str(path)), 10.0, WALL0 + 10, "job", policy).job.state is JobState.FAILED
    assert recover.replay(records, 10.0, WALL0 + 10, "job", policy).job.state is JobState.RUNNING


def test_a_restarted_coordinator_ignores_an_appended_line_and_says_so(tmp_path, capsys):
    path = str(tmp_path / "journal.jsonl")
    j = Journal(path, clock, TOKEN)
    j.write(je.START, {"job": "job"})
    j.close()
    with open(path, "ab") as fh:
        fh.write(FORGED)
    policy = Policy(actions={"dead_rank": "abort"}, min_finding_age_s=0)
    coord = Coordinator(
        Config(journal=path, job="job", world_size=2, policy=policy, token=TOKEN), Journal(path, clock, TOKEN)
    )
    coord.recover(10.0, WALL0 + 10.0)
    assert coord.control.state is JobState.RUNNING
    coord.journal.close()
    said = capsys.readouterr()
    assert "journal_lines_ignored" in said.out + said.err


def test_a_symlinked_journal_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "root-only"
    target.write_text("root's\n")
    os.chmod(target, 0o600)
    link = tmp_path / "journal.jsonl"
    link.symlink_to(target)
    os.lchown(link, 65534, 65534)
    with pytest.raises(JournalRefused, match="is a symbolic link"):
        Journal(str(link), clock)
    assert target.read_text() == "root's\n"


@pytest.mark.parametrize(
    "owner, mode, why",
    [
        (65534, 0o600, "owned by uid 65534"),
        (None, 0o666, "writable by every user"),
    ],
)
def test_a_journal_another_user_owns_or_may_write_is_refused(tmp_path, owner, mode, why):
    path = tmp_path / "journal.jsonl"
    path.write_bytes(journal_line.line({"event": je.START, "job": "job"}))
    os.chmod(path, mode)
    if owner is not None:
        os.chown(path, owner, owner)
    with pytest.raises(JournalRefused, match=why):
        Journal(str(path), clock)
    assert path.read_bytes() == journal_line.line({"event": je.START, "job": "job"})  # not written


def test_an_own_private_journal_is_opened_and_appended():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "j")
        Journal(path, clock).close()
        j = Journal(path, clock)
        j.write(je.START, {"job": "job"})
        j.close()
        assert [r["event"] for r in journal.read(path)] == [je.START]
