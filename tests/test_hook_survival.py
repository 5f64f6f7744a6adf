"""After install, nothing may hurt training: a bad run dir, a stale or scribbled
slot, the hook's own bugs. Each is counted, logged once, and survived."""

from __future__ import annotations

import logging
import os
import random
import struct

import pytest

from watchdog.contracts import slot as wire
from watchdog.contracts.slot import Status
from watchdog.hook.marks import recorder as recorder_mod
from watchdog.hook.testing import ENV_VARS, FakeClock, installed, read_monitor, slot_bytes, step_splits
from watchdog.hook.zero_code import collectives


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)


def train(mon, steps=5):
    """A small loop through every hooked path; returns what the loader yielded."""
    seen = []
    for x in mon.wrap_loader(range(steps)):
        with mon.phase("eval"), mon.collective("all_reduce", nbytes=8):
            seen.append(x)
        mon.step()
    return seen


def words_of(mon) -> tuple[int, ...]:
    """Header words straight from memory: no validation (the magic may be gone)."""
    return struct.unpack_from(f"<{wire.HEADER_WORDS}q", slot_bytes(mon))


@pytest.mark.parametrize(
    "make_dir",
    [
        pytest.param(lambda tmp: str(tmp / "a-file" / "run"), id="under-a-regular-file"),
        pytest.param(lambda tmp: "/proc/self", id="existing-dir-refusing-new-files"),
    ],
)
def test_unusable_run_dir_falls_back_to_anonymous_memory(tmp_path, caplog, make_dir):
    (tmp_path / "a-file").write_text("not a directory")
    caplog.set_level(logging.WARNING, logger="watchdog.hook")
    with installed(make_dir(tmp_path), patch_collectives=False) as mon:  # must not raise
        assert mon.slot_path is None
        assert mon.errors == 1
        assert train(mon) == [0, 1, 2, 3, 4]
        w = words_of(mon)  # the anonymous slot is still written, just unseen
        assert w[wire.H_STEP] == 5 and w[wire.H_HOOK_ERRORS] == 1 and w[wire.H_STATUS] == Status.RUNNING
        assert mon.errors == 1
    warnings = [r for r in caplog.records if r.name == "watchdog.hook" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "slot_file" in warnings[0].getMessage()


def test_missing_run_dir_is_created(tmp_path):
    run_dir = tmp_path / "deep" / "er" / "run"
    with installed(run_dir, patch_collectives=False) as mon:
        assert os.path.dirname(mon.slot_path) == str(run_dir)
        train(mon, 2)
        assert read_monitor(mon).header[wire.H_STEP] == 2 and mon.errors == 0


def test_stale_corrupt_slot_at_our_path_is_replaced(tmp_path):
    path = tmp_path / wire.slot_filename("default", 0, os.getpid())
    path.write_bytes(b"\xff" * 100_000)  # wrong size, garbage
    old_inode = path.stat().st_ino
    with installed(tmp_path, patch_collectives=False, ring_capacity=8) as mon:
        assert mon.slot_path == str(path)
        assert path.stat().st_size == wire.slot_size(8)
        train(mon, 3)
        snap = read_monitor(mon)
        assert snap.header[wire.H_STEP] == 3 and len(step_splits(snap)) == 3
        assert mon.errors == 0
    assert path.stat().st_ino != old_inode or path.stat().st_size == wire.slot_size(8)


def test_garbage_written_into_the_live_slot_does_not_break_the_hook(tmp_path):
    with installed(tmp_path, clock=FakeClock(), patch_collectives=False, heartbeat_interval_s=3600) as mon:
        train(mon, 2)
        rng = random.Random(7)
        size = os.path.getsize(mon.slot_path)
        fd = os.open(mon.slot_path, os.O_WRONLY)
        try:
            os.pwrite(fd, rng.randbytes(size), 0)  # someone scribbles over everything
        finally:
            os.close(fd)
        mon.control.poll()  # garbage control words: validated, rejected
        assert train(mon, 3) == [0, 1, 2]
        assert mon.errors == 0
        w = words_of(mon)
        assert w[wire.H_STEP] == 5  # the hook never reads state back: it keeps counting right
        assert w[wire.H_SEQ] % 2 == 0
        assert mon.stats()["ctrl_rejected"] <= 1


def test_failing_bookkeeping_is_counted_then_the_monitor_disables_itself(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="watchdog.hook")
    with installed(tmp_path, patch_collectives=False, max_errors=5, heartbeat_interval_s=3600) as mon:

        def broken(*a, **k):
            raise RuntimeError("bug in the hook")

        monkeypatch.setattr(recorder_mod, "_pack_step", broken)
        for _i in range(3):
            mon.step()  # never raises
        assert mon.errors == 3
        h = read_monitor(mon).header
        assert h[wire.H_HOOK_ERRORS] == 3 and h[wire.H_SEQ] % 2 == 0  # bracket closed again
        assert h.status == Status.RUNNING
        for _i in range(10):
            mon.step()
        assert mon.errors == 5  # disabled at 5: later calls are no-ops, not errors
        snap = read_monitor(mon)
        assert snap.header.status == Status.DISABLED
        # training goes on untouched
        assert train(mon, 4) == [0, 1, 2, 3]
        assert mon.wrap_loader(range(2)) == range(2)
        assert mon.errors == 5
        errors = [r for r in snap.records if r.kind == wire.RecordKind.ERROR]
        assert [r.payload[0] for r in errors] == [1, 2, 3, 4, 5]
    logs = [r.getMessage() for r in caplog.records if r.name == "watchdog.hook"]
    assert sum("where=step" in m for m in logs) == 1  # logged once, not per error
    assert any("disabled" in m for m in logs)
    assert read_monitor(mon).header.status == Status.DISABLED  # close() keeps it


def test_a_failing_loader_mark_never_eats_the_batch(tmp_path, monkeypatch):
    with installed(tmp_path, patch_collectives=False, heartbeat_interval_s=3600) as mon:

        class BadClock:
            calls = 0

            def __call__(self):
                BadClock.calls += 1
                raise OSError("clock")

        monkeypatch.setattr(mon.recorder, "_clock", BadClock())
        assert list(mon.wrap_loader("abc")) == ["a", "b", "c"]
        assert mon.errors == 4  # three batches and the final StopIteration fetch


def test_collective_bookkeeping_failure_still_calls_the_collective(tmp_path, monkeypatch):
    with installed(tmp_path, patch_collectives=False, heartbeat_interval_s=3600) as mon:
        monkeypatch.setattr(mon.recorder.collectives.groups, "add", lambda g: 1 / 0)
        calls = []
        sink = type("Sink", (), {"marks": mon.recorder.collectives})

        def orig(*a):
            calls.append(a)
            return "result"

        fn = collectives.make_collective_wrapper(orig, 1, 5, 0, "t", False, None, sink)
        out = fn(1, 2)
        assert out == "result" and calls == [(1, 2)]
        assert mon.errors == 1


def test_forked_child_never_writes_the_parents_slot(tmp_path):
    with installed(tmp_path, patch_collectives=False, heartbeat_interval_s=3600) as mon:
        train(mon, 2)
        before = read_monitor(mon).header.words
        pid = os.fork()
        if pid == 0:  # child: a DataLoader worker, say
            try:
                train(mon, 3)
                mon.close()
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert status == 0
        after = read_monitor(mon).header
        assert after.words[wire.H_STEP] == before[wire.H_STEP] == 2
        assert after.status == Status.RUNNING
        train(mon, 1)
        assert read_monitor(mon).header[wire.H_STEP] == 3


def test_close_is_idempotent_and_later_calls_are_harmless(tmp_path):
    with installed(tmp_path, patch_collectives=False) as mon:
        loader = mon.wrap_loader(range(3))
        it = iter(loader)
        next(it)
    mon.close()
    assert list(it) == [1, 2]
    mon.step()
    with mon.phase("eval"), mon.collective("all_reduce"):
        pass
    assert mon.errors == 0
    assert wire.read_slot(mon.slot_path).header.status == Status.EXITED


def test_full_disk_is_an_install_time_fallback_not_a_sigbus(tmp_path, monkeypatch):
    """The slot's blocks are written before the file is mapped: a full filesystem
    fails there (then anonymous memory) instead of SIGBUS on a later store."""
    import errno

    from watchdog.hook.slot import slotfile

    def full(fd, data, off):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(slotfile.os, "pwrite", full)
    with installed(tmp_path, patch_collectives=False) as mon:
        assert mon.slot_path is None and mon.errors == 1
        train(mon, 2)
    assert not list(tmp_path.iterdir())  # the half-made file was removed


def test_interpreter_exit_marks_the_slot_exited_and_joins_the_heartbeat(tmp_path):
    """No close(): atexit does it. The heartbeat must not hold up the exit."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = textwrap.dedent(
        f"""
        import watchdog.hook
        mon = watchdog.hook.install(run_dir={str(tmp_path)!r}, patch_collectives=False, heartbeat_interval_s=0.01)
        for _ in mon.wrap_loader(range(3)):
            mon.step()
        print(mon.slot_path)
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    snap = wire.read_slot(out.stdout.strip())
    assert snap.header.status == Status.EXITED
    assert snap.header[wire.H_STEP] == 3 and snap.header[wire.H_HEARTBEAT_COUNT] >= 1
