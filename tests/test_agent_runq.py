"""The run-queue shares the agent reports per rank (/proc schedstat): what a
noisy neighbour on the rank's core takes from it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from watchdog.agent.processes import table as procs
from watchdog.agent.processes.table import ProcessTable, ProcSample
from watchdog.agent.slotfiles import slot_states
from watchdog.dev import inject

S = 1_000_000_000


def _s(t_s: float, oncpu: float, runq: float) -> ProcSample:
    return ProcSample(True, "running", sampled_ns=int(t_s * S), oncpu_s=oncpu, runq_s=runq)


@pytest.mark.parametrize(
    "window,shares",
    [
        ([], (0.0, 0.0)),
        ([_s(10, 5.0, 1.0)], (0.0, 0.0)),
        ([_s(10, 5.0, 1.0), _s(14, 7.0, 3.0)], (0.0, 0.0)),  # 4 s: too short to say
        ([_s(10, 5.0, 1.0), _s(20, 10.0, 6.0)], (0.5, 0.5)),  # one hog on its core: half waits
        ([_s(0, 5.0, 1.0), _s(10, 14.0, 1.1), _s(20, 23.0, 1.2)], (0.9, 0.01)),  # a core of its own
        ([_s(10, 0.0, 0.0), _s(20, 0.0, 0.0)], (0.0, 0.0)),  # no schedstat
    ],
)
def test_shares_over_the_window(window, shares):
    assert slot_states.runq_shares(window) == pytest.approx(shares)


def test_schedstat_of_a_process_that_is_not_there_is_nothing(tmp_path):
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "schedstat").write_text("garbage\n")
    assert procs.schedstat(7, str(tmp_path)) == (0.0, 0.0)
    assert procs.schedstat(8, str(tmp_path)) == (0.0, 0.0)
    (tmp_path / "7" / "schedstat").write_text("2500000000 1500000000 42\n")
    assert procs.schedstat(7, str(tmp_path)) == (2.5, 1.5)


@pytest.mark.integration
@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/schedstat"), reason="no schedstat in this kernel")
def test_a_hog_on_the_rank_core_shows_as_its_run_queue_wait():
    """A busy process (the rank) and a hog pinned to its core, read by the agent's
    own process table: half or more of the rank's runnable time waits, whatever else
    the host runs (other load on that core only adds to it)."""
    rank = subprocess.Popen([sys.executable, "-c", inject.HOG_CODE], stdin=subprocess.DEVNULL)
    hog = inject.NoisyNeighbour(max(os.sched_getaffinity(0)), 1)
    table = ProcessTable()
    try:
        start_us = int(procs.psutil.Process(rank.pid).create_time() * 1e6)
        hog.start(rank.pid)
        window = []
        t_end = time.monotonic() + 6.0
        while time.monotonic() < t_end:
            window.append(table.check(rank.pid, start_us, time.monotonic_ns(), resources=True))
            time.sleep(0.5)
        oncpu, runq = slot_states.runq_shares(window)
        assert oncpu > 0 and runq / (runq + oncpu) >= 0.4, (oncpu, runq)
    finally:
        hog.stop()
        rank.kill()
        rank.wait(5)
        table.close()
