"""The exit of each rank process is timed precisely enough to tell the first
death from the ranks torchrun tears down right after it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from waiting import wait_for

from watchdog.agent.processes.deathwatch import DeathWatch
from watchdog.agent.processes.table import ProcessTable

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs pidfds (Linux >= 5.3)")


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_exits_are_ordered_to_the_millisecond():
    a, b = sleeper(), sleeper()
    watch = DeathWatch()
    fds = [os.pidfd_open(p.pid) for p in (a, b)]
    try:
        watch.watch("a", fds[0])
        watch.watch("b", fds[1])
        time.sleep(0.05)  # let the thread register both
        a.kill()
        a.wait()
        time.sleep(0.02)  # torchrun's teardown after a death takes longer than this
        b.kill()
        b.wait()
        assert wait_for(lambda: watch.exit_ns("a") and watch.exit_ns("b"), 5.0)
        b_ns, a_ns = watch.exit_ns("b"), watch.exit_ns("a")
        assert b_ns is not None and a_ns is not None
        gap_ms = (b_ns - a_ns) / 1e6
        assert 10 <= gap_ms <= 1000, gap_ms
    finally:
        watch.close()
        for fd in fds:
            os.close(fd)


def test_process_table_reports_when_the_process_died_not_when_it_was_polled():
    p = sleeper()
    table = ProcessTable()
    start_us = round(__import__("psutil").Process(p.pid).create_time() * 1e6)
    try:
        assert table.check(p.pid, start_us, time.monotonic_ns(), resources=True).alive
        time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait()
        died = time.monotonic_ns()
        time.sleep(0.3)  # the agent polls later than the death
        table.refresh()
        sample = table.check(p.pid, start_us, time.monotonic_ns(), resources=False)
        assert not sample.alive
        assert abs(sample.gone_ns - died) < 100e6, (sample.gone_ns - died) / 1e6  # not the poll's 300 ms later
    finally:
        table.close()
