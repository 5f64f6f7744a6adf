"""watchdog.dev.inject on a plain child process: the faults the corpus benchmark injects
do what they say (a stopped process is in state T, a killed one is gone, the noisy
neighbour shares exactly the victim's core and leaves nothing behind)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from waiting import wait_for

from watchdog.dev import inject


@pytest.fixture
def victim():
    # two threads, so pinning must reach every thread, not only the main one
    code = (
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\ntime.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    wait_for(lambda: len(inject.threads(proc.pid)) == 2, timeout_s=10, what="the victim's two threads")
    yield proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait(5)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return stat[stat.rfind(")") + 2]


def test_stop_then_kill(victim):
    at = inject.stop(victim.pid)
    assert abs(at - time.time()) < 5
    wait_for(lambda: _state(victim.pid) == "T", timeout_s=5, what="state T")
    inject.kill(victim.pid)
    assert victim.wait(5) == -signal.SIGKILL


def test_noisy_neighbour_shares_the_victims_core_only(victim):
    cpus = sorted(os.sched_getaffinity(0))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    hog = inject.NoisyNeighbour(cpus[-1], count=2)
    try:
        hog.start(victim.pid, [other.pid])
        assert all(os.sched_getaffinity(t) == {cpus[-1]} for t in inject.threads(victim.pid))
        assert len(hog.procs) == 2 and all(os.sched_getaffinity(p.pid) == {cpus[-1]} for p in hog.procs)
        if len(cpus) > 1:
            assert cpus[-1] not in os.sched_getaffinity(other.pid)
        hogs = list(hog.procs)
    finally:
        hog.stop()
        other.kill()
        other.wait(5)
    assert hog.procs == [] and all(p.poll() is not None for p in hogs)
