"""Process identity by (pid, start time), and every psutil failure mode."""

import os
import subprocess
import sys

import psutil
import pytest

from watchdog.agent.processes.table import ProcessTable
from watchdog.agent.testing import FakeProcess, FakeProcesses

START_S = 1000.0
START_US = int(START_S * 1e6)


def table(*procs):
    return ProcessTable(FakeProcesses(*procs))


def test_alive_and_resources_sampled_only_when_asked():
    t = table(FakeProcess(7, START_S, cpu=(2.0, 1.0), rss=123))
    s = t.check(7, START_US, 5, resources=False)
    assert s.alive and s.status == "sleeping" and s.sampled_ns == 0
    s = t.check(7, START_US, 6, resources=True)
    assert (s.cpu_seconds, s.rss_bytes, s.sampled_ns) == (3.0, 123, 6)
    s = t.check(7, START_US, 7, resources=False)
    assert (s.cpu_seconds, s.rss_bytes, s.sampled_ns) == (3.0, 123, 6)  # carried over


def test_pid_reuse_is_not_alive():
    # Same pid, started 1 s after the rank's process: another program.
    t = table(FakeProcess(7, START_S + 1.0))
    s = t.check(7, START_US, 1, resources=True)
    assert not s.alive and s.status == "reused"


def test_start_time_within_tolerance_is_the_same_process():
    t = table(FakeProcess(7, START_S + 0.015))
    assert t.check(7, START_US, 1, resources=True).alive


def test_pid_reused_later_is_caught_by_is_running():
    p = FakeProcess(7, START_S)
    t = table(p)
    assert t.check(7, START_US, 1, resources=False).alive
    p.running = False  # pid reaped and reused: only is_running() (re-reads the start time) tells
    assert t.check(7, START_US, 2, resources=False).alive  # the documented window: until the next sample
    s = t.check(7, START_US, 3, resources=True)
    assert not s.alive and s.status == "gone"
    p.running = True
    assert not t.check(7, START_US, 4, resources=False).alive  # an identity never comes back


def test_unknown_pid_is_gone():
    s = table().check(99, START_US, 1, resources=True)
    assert not s.alive and s.status == "gone"


@pytest.mark.parametrize("fail_at", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("exc", [psutil.NoSuchProcess(7), psutil.ZombieProcess(7)])
def test_process_vanishing_at_any_call(fail_at, exc):
    p = FakeProcess(7, START_S, rss=55, fail_at=fail_at, exc=exc)
    t = table(p)
    samples = [t.check(7, START_US, i, resources=True) for i in range(3)]
    assert not samples[-1].alive
    assert samples[-1].status in ("gone", "zombie")
    assert t.errors == 0  # a death is not an error


def test_access_denied_counts_and_keeps_alive():
    p = FakeProcess(7, START_S, rss=55)
    t = table(p)
    assert t.check(7, START_US, 1, resources=True).rss_bytes == 55
    p.fail_at, p.exc = p.calls + 1, psutil.AccessDenied(7)
    s = t.check(7, START_US, 2, resources=True)
    assert s.alive and s.status == "unknown" and s.rss_bytes == 55
    assert t.errors == 1


def test_zombie_status_is_dead():
    assert not table(FakeProcess(7, START_S, status_=psutil.STATUS_ZOMBIE)).check(7, START_US, 1, resources=True).alive


def test_stopped_is_alive_and_flagged():
    s = table(FakeProcess(7, START_S, status_=psutil.STATUS_STOPPED)).check(7, START_US, 1, resources=True)
    assert s.alive and s.stopped


def test_real_psutil_self_and_a_reaped_child():
    t = ProcessTable()
    me = psutil.Process()
    s = t.check(os.getpid(), int(me.create_time() * 1e6), 1, resources=True)
    assert s.alive and s.rss_bytes > 0 and s.cpu_seconds > 0
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start_us = int(psutil.Process(child.pid).create_time() * 1e6)
    child.wait()
    assert not t.check(child.pid, start_us, 2, resources=True).alive


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd_open on this platform")
def test_pidfd_sees_a_sigkill_at_once_and_a_sigstop_at_the_next_sample():
    import signal
    import time

    t = ProcessTable()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start_us = int(psutil.Process(child.pid).create_time() * 1e6)
        assert t.check(child.pid, start_us, 1, resources=True).alive
        child.send_signal(signal.SIGSTOP)
        time.sleep(0.05)
        assert not t.check(child.pid, start_us, 2, resources=False).stopped  # /proc not read between samples
        assert t.check(child.pid, start_us, 3, resources=True).stopped
        child.kill()  # a zombie until we reap it: the pidfd fires on exit, not on reap
        time.sleep(0.05)
        t.refresh()
        s = t.check(child.pid, start_us, 4, resources=False)
        assert not s.alive and s.status == "gone"
        assert t._fds == {}  # closed
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("pid", [0, -5, 2**31, 2**63 - 1])
def test_a_pid_no_process_can_have_is_gone_not_an_error(pid):
    # A corrupt or forged slot's pid: found by the slot fuzzer, where 2**56 made
    # os.pidfd_open raise OverflowError and cost the slot its poll.
    table = ProcessTable()
    s = table.check(pid, 1, 0, resources=True)
    assert (s.alive, s.status) == (False, "gone") and table.errors == 0
