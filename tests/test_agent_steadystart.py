"""A step of the wall clock does not turn a rank into "another process": the
start time the agent first read for a process is the one it reads from then on
(``agent/processes/steadystart.py``), while a reused pid is read afresh."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from watchdog import procstart
from watchdog.agent.command_channel import handlers as command_handlers
from watchdog.agent.processes import steadystart
from watchdog.agent.processes.ownership import parent_identity
from watchdog.agent.processes.table import START_TOLERANCE_US
from watchdog.agent.slotfiles import slot_states
from watchdog.agent.slotfiles.tracker import SlotTracker
from watchdog.contracts import commands
from watchdog.contracts import slot as wire
from watchdog.hook.lifecycle import installer as lifecycle
from watchdog.hook.testing import RankSlot


def _stat(root, pid: int, ticks: int) -> None:
    (root / str(pid)).mkdir(exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{pid} (py thon) S 1 {' '.join(['0'] * 17)} {ticks} 0 0\n")


def _boot(root, seconds: int) -> None:
    (root / "stat").write_text(f"cpu 1 2 3\nbtime {seconds}\nprocesses 9\n")


def _later(boot_us: int | None) -> int:
    """The boot time read, 10 s later: the wall clock stepped."""
    assert boot_us is not None
    return boot_us + 10_000_000


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(steadystart, "_FIRST", {})


def test_the_first_reading_of_a_process_is_kept_and_a_reused_pid_is_read_afresh(tmp_path):
    hz = procstart.clock_ticks()
    _boot(tmp_path, 1000)
    _stat(tmp_path, 42, 5 * hz)
    assert steadystart.start_us(42, str(tmp_path)) == 1005_000_000
    _boot(tmp_path, 1001)  # the wall clock stepped 1 s: the boot time in /proc/stat moved with it
    assert procstart.start_us(42, str(tmp_path)) == 1006_000_000
    assert steadystart.start_us(42, str(tmp_path)) == 1005_000_000  # the same process: as first read
    _stat(tmp_path, 42, 9 * hz)  # the pid now belongs to a process that started later
    assert steadystart.start_us(42, str(tmp_path)) == 1010_000_000
    assert steadystart.start_us(7, str(tmp_path)) is None  # no such process


def test_what_is_kept_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(steadystart, "MAX_KEPT", 3)
    _boot(tmp_path, 1000)
    for pid in range(1, 11):
        _stat(tmp_path, pid, pid)
        steadystart.start_us(pid, str(tmp_path))
    assert len(steadystart._FIRST) == 3 and (str(tmp_path), 10, 10) in steadystart._FIRST  # the newest are kept


def test_a_rank_and_its_launcher_stay_themselves_across_a_step_of_the_clock(monkeypatch):
    """What a CI run saw: the boot time in /proc/stat 1 s, then 10 s off; every signal
    of a restart refused as wrong_identity. Here the boot time read is moved 10 s."""
    from psutil import _pslinux

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        first = command_handlers.process_start_us(child.pid)
        launcher = parent_identity(child.pid)
        assert first is not None and launcher[0] > 1
        assert abs(first - int(psutil.Process(child.pid).create_time() * 1e6)) <= START_TOLERANCE_US
        # The step, as every reader of /proc/stat's btime sees it: ours and psutil's.
        real, real_psutil = procstart.boot_time_us, _pslinux.boot_time
        monkeypatch.setattr(procstart, "boot_time_us", lambda root="/proc": _later(real(root)))
        monkeypatch.setattr(_pslinux, "boot_time", lambda: real_psutil() + 10.0)
        assert procstart.start_us(child.pid) == first + 10_000_000  # what a fresh reading says now
        assert abs(int(psutil.Process(child.pid).create_time() * 1e6) - first - 10_000_000) <= START_TOLERANCE_US
        target = {"pid": child.pid, "proc_start_us": first}
        assert commands.identity_ok(target, command_handlers.process_start_us(child.pid), START_TOLERANCE_US) == (
            True,
            "",
        )
        assert parent_identity(child.pid) == launcher
    finally:
        child.kill()
        child.wait()
    assert command_handlers.process_start_us(child.pid) is None  # gone: no reading, as before


def test_a_zombie_is_its_rank_after_a_step_of_the_clock(tmp_path):
    """The exit status is read from the zombie only if it is the rank's process: by the
    start time first read for it, not one recomputed from a boot time that moved."""
    from watchdog.agent.processes import deathcause

    hz = procstart.clock_ticks()
    _boot(tmp_path, 1000)
    _stat(tmp_path, 42, 5 * hz)
    start = steadystart.start_us(42, str(tmp_path))  # the process table's first match
    assert start is not None
    _boot(tmp_path, 1010)  # the wall clock stepped 10 s
    fields = ["Z", "1"] + ["0"] * 17 + [str(5 * hz)] + ["0"] * 29 + ["9"]  # field 22 starttime, field 52 exit_code
    (tmp_path / "42" / "stat").write_text(f"42 (py thon) {' '.join(fields)}\n")
    assert deathcause.zombie_status(42, str(tmp_path), start_us=start) == 9
    assert deathcause.zombie_status(42, str(tmp_path), start_us=start - 5_000_000) is None  # another process's


def _ident(pid: int, rank: int, ticks: int) -> wire.Identity:
    start = int(psutil.Process(pid).create_time() * 1e6)
    return wire.Identity("job", "h", rank, rank, 4, pid, start, proc_start_ticks=ticks)


def test_the_hook_writes_its_start_in_clock_ticks():
    """Beside its start time: the part of it that no step of the wall clock moves."""
    ticks = procstart.parse_start_ticks(procstart.read_text(f"/proc/{os.getpid()}/stat") or "")
    assert ticks and lifecycle._proc_start_ticks(os.getpid()) == ticks
    assert lifecycle._proc_start_ticks(2**22 + 12345) == 0  # unreadable: 0, never an exception
    buf = bytearray(wire.slot_size(8))
    wire.init_slot(buf, _ident(os.getpid(), 0, ticks), 8, wall_ns=1, mono_ns=1)
    assert wire.decode_header(bytes(buf[: wire.RING_OFFSET])).identity.proc_start_ticks == ticks


def test_an_agent_first_reading_a_rank_after_a_clock_step_knows_it_by_its_ticks(tmp_path, monkeypatch):
    """An agent restarted in a long job, on a VM whose clock stepped since the ranks
    started: its first reading of each rank is seconds off the start the hook recorded.
    A rank whose hook wrote its start ticks is still alive and itself (signals included);
    one from an older hook, without them, is what every rank was before: "reused"."""
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    slots: list[RankSlot] = []
    try:
        new, old = kids
        ident = _ident(new.pid, 0, procstart.start_ticks(new.pid) or 0)
        recorded = ident.proc_start_us
        slots += [RankSlot(str(tmp_path), ident), RankSlot(str(tmp_path), _ident(old.pid, 1, 0))]
        real = procstart.boot_time_us
        monkeypatch.setattr(procstart, "boot_time_us", lambda root="/proc": _later(real(root)))
        t = SlotTracker(str(tmp_path))
        t.poll(time.monotonic_ns(), time.time_ns())
        by_rank = {v.identity.rank: v for v in t.views()}
        assert by_rank[0].proc.alive and by_rank[0].state == slot_states.ALIVE
        assert by_rank[1].proc.status == "reused"  # an older hook's rank: the limit that remains
        assert command_handlers.process_start_us(new.pid) == recorded  # the hook's reading, vouched for
        target = {"pid": new.pid, "proc_start_us": recorded}
        assert commands.identity_ok(target, command_handlers.process_start_us(new.pid), START_TOLERANCE_US) == (
            True,
            "",
        )
    finally:
        for slot in slots:
            slot.close()
        for k in kids:
            k.kill()
            k.wait()
