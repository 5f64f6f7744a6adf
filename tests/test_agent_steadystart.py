"""A step of the wall clock does not turn a rank into "another process": the
start time the agent first read for a process is the one it reads from then on
(``agent/steadystart.py``), while a reused pid is read afresh."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from watchdog import commands
from watchdog.agent import actions, steadystart
from watchdog.agent.procs import START_TOLERANCE_US
from watchdog.agent.slots import parent_identity


def _stat(root, pid: int, ticks: int) -> None:
    (root / str(pid)).mkdir(exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{pid} (py thon) S 1 {' '.join(['0'] * 17)} {ticks} 0 0\n")


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(steadystart, "_FIRST", {})


def test_the_first_reading_of_a_process_is_kept_and_a_reused_pid_is_read_afresh(tmp_path):
    _stat(tmp_path, 42, 1000)
    assert steadystart.steady(42, 5_000_000, str(tmp_path)) == 5_000_000
    assert steadystart.steady(42, 6_000_000, str(tmp_path)) == 5_000_000  # the clock stepped by 1 s
    _stat(tmp_path, 42, 2000)  # the pid now belongs to a process that started later
    assert steadystart.steady(42, 25_000_000, str(tmp_path)) == 25_000_000
    assert steadystart.steady(7, 9, str(tmp_path)) == 9  # unreadable: as read


def test_what_is_kept_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(steadystart, "MAX_KEPT", 3)
    for pid in range(1, 11):
        _stat(tmp_path, pid, pid)
        steadystart.steady(pid, pid * 1_000_000, str(tmp_path))
    assert len(steadystart._FIRST) == 3
    assert steadystart.steady(10, 0, str(tmp_path)) == 10_000_000  # the newest are kept


def test_a_rank_and_its_launcher_stay_themselves_across_a_step_of_the_clock(monkeypatch):
    """What a CI run saw: the boot time in /proc/stat 1 s, then 10 s off; every signal
    of a restart refused as wrong_identity. Here the step is psutil's boot time moved."""
    from psutil import _pslinux

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        first = actions.process_start_us(child.pid)
        launcher = parent_identity(child.pid)
        assert first is not None and launcher[0] > 1
        real = _pslinux.boot_time
        monkeypatch.setattr(_pslinux, "boot_time", lambda: real() + 10.0)
        assert int(psutil.Process(child.pid).create_time() * 1e6) == pytest.approx(first + 10_000_000, abs=2)
        target = {"pid": child.pid, "proc_start_us": first}
        assert commands.identity_ok(target, actions.process_start_us(child.pid), START_TOLERANCE_US) == (True, "")
        assert parent_identity(child.pid) == launcher
    finally:
        child.kill()
        child.wait()
    # Gone: no reading at all, as before.
    assert actions.process_start_us(child.pid) is None
