"""Files the monitor writes or believes in a directory another user can write to:
links planted at the names it uses, files another user wrote (chowned to uid
65534 here: another user, no account needed). docs/hardening.md lists each."""

from __future__ import annotations

import json
import os
from typing import cast

import pytest

from watchdog import sharedfile
from watchdog.agent.command_channel.handlers import Actions
from watchdog.agent.command_channel.stacks import StackDumper
from watchdog.contracts import commands
from watchdog.contracts import slot as wire
from watchdog.hook import rollback

OTHER = 65534
NO_DUMPER = cast(StackDumper, None)  # a rollback never dumps stacks


@pytest.fixture
def shared(tmp_path):
    """A run directory shaped like /run/rank-watchdog: writable by others, sticky."""
    d = tmp_path / "run"
    d.mkdir()
    os.chmod(d, 0o1777)
    return d


def rollback_cmd(job="train", step=120):
    return commands.make(
        job=job,
        type=commands.ROLLBACK,
        host="h",
        args={"before_step": step, "action": "a-1"},
        issued_wall=1.0,
        ttl_s=30,
    )


def test_the_agent_never_writes_through_a_link_planted_at_the_rollback_names(tmp_path, shared):
    secret = tmp_path / "root-only"
    secret.write_text("root's")
    os.chmod(secret, 0o600)
    name = wire.rollback_filename("train")
    for planted in (name + ".tmp", f".{name}.tmp", name):  # the old temporary name, a guess, the final name
        os.symlink(secret, shared / planted)
        os.lchown(shared / planted, OTHER, OTHER)
    out = Actions("h", lambda job: (), NO_DUMPER, run_dir=str(shared)).rollback(rollback_cmd())
    assert out["ok"], out
    assert secret.read_text() == "root's"  # not followed
    assert not (shared / name).is_symlink() and json.loads((shared / name).read_text())["before_step"] == 120
    assert sorted(p.name for p in shared.iterdir()) == sorted({name, name + ".tmp", f".{name}.tmp"})  # no leftovers


def test_another_users_rollback_file_is_not_believed(shared):
    path = shared / wire.rollback_filename("train")
    path.write_text(json.dumps({"job": "train", "before_step": 1, "action": "evil"}))
    assert rollback.requested(run_dir=str(shared), job="train") == rollback.Rollback(1, "evil")  # ours: believed
    os.chown(path, OTHER, OTHER)
    assert rollback.requested(run_dir=str(shared), job="train") is None
    assert rollback.requested(run_dir=str(shared), job="train", trusted_uids=frozenset({OTHER})) is not None


def test_a_linked_rollback_file_is_not_believed(tmp_path, shared):
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps({"job": "train", "before_step": 1, "action": "evil"}))  # root's own, even
    os.symlink(real, shared / wire.rollback_filename("train"))
    assert rollback.requested(run_dir=str(shared), job="train") is None


def _written_by_another_user(p):
    p.write_bytes(b"x" * 100)
    os.chown(p, OTHER, OTHER)


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda p: os.mkfifo(p), "not a regular file"),
        (_written_by_another_user, "owned by uid 65534"),
        (lambda p: p.write_bytes(b"x" * 100), "over 10"),
    ],
)
def test_sharedfile_read_says_why_it_does_not_believe_a_file(tmp_path, make, why):
    p = tmp_path / "f"
    make(p)
    with pytest.raises(sharedfile.Untrusted, match=why):
        sharedfile.read(str(p), frozenset({0}), max_bytes=10)


def test_a_flight_recorder_dump_is_written_past_planted_links_and_read_only_from_the_slots_owner(tmp_path, shared):
    from watchdog.agent.command_channel import flight_recorder_dump
    from watchdog.hook.completion import flight_recorder

    secret = tmp_path / "root-only"
    secret.write_text("root's")
    slot = shared / "job.rank0.pid1.slot"
    slot.write_bytes(b"")
    dump = wire.fr_dump_filename(str(slot))
    os.symlink(secret, dump + f".tmp{os.getpid()}")  # the temporary name the hook used
    flight_recorder.write_dump(dump, b"entries")
    assert secret.read_text() == "root's" and flight_recorder_dump.read_dump_file(dump) == b"entries"
    os.chown(dump, OTHER, OTHER)  # planted by another user before the hook wrote it
    with pytest.raises(sharedfile.Untrusted, match="owned by uid 65534"):
        flight_recorder_dump.read_dump_file(dump)


def test_a_ranks_last_words_are_never_written_through_a_link_nor_read_from_a_fifo_or_another_user(tmp_path, shared):
    from watchdog.contracts import crash_record as crashrecord
    from watchdog.hook.lifecycle import crash_writer

    secret = tmp_path / "checkpoint.pt"
    secret.write_text("weights")
    slot = shared / "job.rank0.pid7.slot"
    slot.write_bytes(b"")
    for path in (crashrecord.crash_path(str(slot)), crashrecord.fatal_path(str(slot))):
        os.symlink(secret, path)
        os.lchown(path, OTHER, OTHER)
    fatal = crash_writer.FatalDump()
    assert not fatal.enable(str(slot))  # not through the link (faulthandler stays off)
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        assert crash_writer.write(str(slot), RuntimeError, exc, exc.__traceback__, "MainThread")
    assert secret.read_text() == "weights"
    crash = crashrecord.read_crash(str(slot))
    assert crash is not None and crash["message"] == "boom"
    os.chown(crashrecord.crash_path(str(slot)), OTHER, OTHER)  # another user's record: not the rank's words
    assert crashrecord.read_crash(str(slot)) is None
    os.unlink(crashrecord.fatal_path(str(slot)))
    os.mkfifo(crashrecord.fatal_path(str(slot)))  # would block the agent's poll (and a rank's install)
    assert crashrecord.read_fatal(str(slot)) == ""
    assert not fatal.enable(str(slot))
