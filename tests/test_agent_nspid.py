"""A hostPID agent finds ranks that live in another pid namespace: (last NSpid
entry, start time) -> our pid, cached; signals and stack dumps go to our pid.
Pure tests on a /proc fixture tree, then the real thing under unshare."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import psutil
import pytest

from watchdog.agent import testing
from watchdog.agent.command_channel import handlers as act
from watchdog.agent.command_channel.stacks import StackDumper
from watchdog.agent.processes.nspid import PidMap, parse_nspid
from watchdog.agent.processes.pidpin import Pin
from watchdog.agent.processes.table import ProcessTable, ProcSample
from watchdog.agent.slotfiles import slot_states
from watchdog.agent.slotfiles.local_rank import LocalRank
from watchdog.agent.slotfiles.tracker import SlotTracker
from watchdog.agent.testing import FakeProcess, FakeProcesses
from watchdog.contracts import commands as c
from watchdog.contracts import slot as wire
from watchdog.contracts.evidence import StackDump
from watchdog.procstart import parse_start_ticks, start_us

ROOT = Path(__file__).resolve().parents[1]
BOOT = 1_700_000_000  # btime, s
HZ = 100


class FakeProc:
    """A /proc tree: /proc/stat with btime, /proc/<pid>/{status,stat} with NSpid and starttime."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(exist_ok=True)
        (root / "stat").write_text(f"cpu  1 2 3 4\nbtime {BOOT}\nprocesses 9\n")
        (root / "self").mkdir()  # non-numeric entries are skipped

    def add(self, pid: int, nspid: tuple[int, ...] | None, start_ticks: int, comm: str = "python") -> None:
        d = self.root / str(pid)
        d.mkdir()
        lines = [f"Name:\t{comm}", "State:\tS (sleeping)"]
        if nspid is not None:
            lines.append("NSpid:\t" + "\t".join(map(str, nspid)))
        (d / "status").write_text("\n".join(lines) + "\n")
        fields = ["S", *["0"] * 18, str(start_ticks), "0"]  # fields 3..23; field 22 = starttime
        (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")

    def step_clock(self, seconds: int) -> None:
        """The wall clock stepped (NTP, a VM's time sync): btime in /proc/stat moves with it."""
        (self.root / "stat").write_text(f"cpu  1 2 3 4\nbtime {BOOT + seconds}\nprocesses 9\n")

    def remove(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid))


def us(ticks: int) -> int:
    return BOOT * 1_000_000 + ticks * 1_000_000 // HZ


@pytest.fixture
def proc(tmp_path):
    return FakeProc(tmp_path / "proc")


def pidmap(proc: FakeProc) -> PidMap:
    return PidMap(str(proc.root), clk_tck=HZ)


def test_parsers_read_what_the_kernel_writes():
    assert parse_nspid("Name:\tx\nNSpid:\t4242\t17\t1\n") == (4242, 17, 1)
    assert parse_nspid("Name:\tx\n") is None
    assert parse_start_ticks("7 (a) b) (c) S " + " ".join(["0"] * 18) + " 12345 0\n") == 12345  # ')' in the name
    assert parse_start_ticks("garbage") is None


def test_start_time_from_proc_is_psutils_create_time():
    ours = start_us(os.getpid())
    assert ours is not None
    assert abs(ours - psutil.Process().create_time() * 1e6) < 1_000
    assert start_us(2**22 + 12345) is None  # no such pid


def test_same_namespace_is_a_direct_hit_without_scanning(proc):
    proc.add(100, (100,), 500)
    m = pidmap(proc)
    assert m.host_pid(100, us(500)) == 100
    assert m.scans == 0
    proc.add(101, None, 600)  # an old kernel without NSpid: one namespace
    assert m.host_pid(101, us(600)) == 101


def test_a_rank_in_a_pod_is_found_by_last_nspid_and_start_time(proc):
    proc.add(1, (1,), 1)  # host init: the number the pod's rank recorded, wrong start
    proc.add(5000, (5000, 1), 900)  # the pod's pid 1 (another pod's init)
    proc.add(5001, (5001, 7), 905)  # pod A's pid 7, started at 905
    proc.add(6001, (6001, 7), 950)  # pod B's pid 7: same recorded pid, another start time
    proc.add(7, (7,), 10)  # a host process numbered 7
    m = pidmap(proc)
    assert m.host_pid(7, us(905)) == 5001
    assert m.host_pid(7, us(950)) == 6001
    assert m.host_pid(1, us(900)) == 5000
    assert m.host_pid(7, us(10)) == 7
    assert m.scans == 1  # one index for every miss of this poll


def test_mapping_is_cached_across_polls(proc):
    proc.add(5001, (5001, 7), 905)
    m = pidmap(proc)
    for _ in range(5):
        m.invalidate()  # what ProcessTable.refresh does each poll
        assert m.host_pid(7, us(905)) == 5001
    assert m.scans == 1


def test_gone_and_reused_find_nothing_and_a_new_process_is_found_next_poll(proc):
    proc.add(5001, (5001, 7), 905)
    m = pidmap(proc)
    assert m.host_pid(7, us(1000)) is None  # pid 7 in the pod now is another process
    assert m.host_pid(8, us(905)) is None
    proc.add(5002, (5002, 8), 905)  # started after this poll's scan
    assert m.host_pid(8, us(905)) is None
    m.invalidate()
    assert m.host_pid(8, us(905)) == 5002
    assert m.scans == 2


def test_a_pod_rank_started_after_a_step_of_the_clock_is_found(proc):
    """The hook records its start with the boot time of that moment; a map that kept
    the boot time read at the agent's start found no rank started after a step (its
    recorded pid, in our namespace, is another process or none: reported gone)."""
    proc.add(5001, (5001, 7), 905)
    m = pidmap(proc)
    assert m.host_pid(7, us(905)) == 5001
    proc.step_clock(10)
    proc.add(6001, (6001, 9), 2000)  # started after the step: recorded with btime + 10 s
    m.invalidate()
    assert m.host_pid(9, us(2000) + 10_000_000) == 6001
    assert m.host_pid(9, us(2000)) is None  # not the start it recorded
    m.forget(7, us(905))  # read again: the rank from before the step is still itself
    assert m.host_pid(7, us(905)) == 5001


def test_a_pod_rank_whose_hook_wrote_its_start_ticks_is_found_whatever_the_clock_did(proc):
    """The step came between the rank's start and the agent's first reading (an agent
    restarted since): the start times differ by it, the start in ticks does not."""
    proc.add(5001, (5001, 7), 905)
    proc.step_clock(10)
    m = pidmap(proc)
    assert m.host_pid(7, us(905)) is None  # by start time alone: 10 s off
    assert m.host_pid(7, us(905), start_ticks=905) == 5001
    assert m.host_pid(7, us(905) + 1, start_ticks=906) is None  # another start: not this process


def test_process_table_pins_and_reads_our_pid_and_says_so(proc):
    proc.add(5001, (5001, 7), 905)
    factory = FakeProcesses(FakeProcess(5001, us(905) / 1e6), FakeProcess(7, 12.0))
    table = ProcessTable(factory, pidfd=False, pids=pidmap(proc))
    sample = table.check(7, us(905), 1, resources=True)
    assert sample.alive and table.host_pid(7, us(905)) == 5001
    # the host's own pid 7, another process, keeps its own identity
    assert table.check(7, 12_000_000, 1, resources=True).alive and table.host_pid(7, 12_000_000) == 7


def test_a_vanished_pod_rank_is_gone_not_alive(proc):
    m = pidmap(proc)
    table = ProcessTable(FakeProcesses(), pidfd=False, pids=m)
    assert table.check(7, us(905), 1, resources=True).status == "gone"


def test_tracker_records_the_host_pid_and_finds_the_launcher_by_it(proc, tmp_path):
    proc.add(5001, (5001, 7), 905)
    ident = testing.identity("j", 0, 1, pid=7, proc_start_us=us(905))
    snap = testing.snapshot(
        ident, {wire.H_HEARTBEAT_NS: 5 * 10**9}, path="/run/a.slot", mono_ns=4 * 10**9, wall_ns=time.time_ns()
    )
    parents: list[int] = []

    def parent(pid):
        parents.append(pid)
        return (4000, 1)

    t = SlotTracker(
        "/run",
        procs=ProcessTable(FakeProcesses(FakeProcess(5001, us(905) / 1e6)), pidfd=False, pids=pidmap(proc)),
        read=lambda path, since=0: snap,
        lister=lambda d, now: {"/run/a.slot": 1},
        parent=parent,
    )
    t.poll(5 * 10**9, time.time_ns())
    (v,) = t.views()
    assert v.state == slot_states.ALIVE and v.identity.pid == 7 and v.host_pid == 5001 and v.pid_here == 5001
    assert parents == [5001]


def test_signals_and_stack_dumps_target_our_pid_and_evidence_keeps_the_recorded_one():
    ident = testing.identity("job", 1, 2, pid=7, proc_start_us=7_000_000)
    view = LocalRank(
        "",
        testing.snapshot(ident).header,
        0,
        False,
        ProcSample(True, "running"),
        slot_states.ALIVE,
        0.0,
        (),
        (4000, 5),
        5001,
    )
    sent, dumped = [], []

    def send(pid, signum, check):
        ok, why = check()
        if ok:
            sent.append(pid)
        return ok, why

    class Dumper(StackDumper):  # dumps recorded, py-spy never run
        def __init__(self):
            pass

        def dump(self, host, rank, pid, timeout_s=None):
            dumped.append(pid)
            return StackDump(host=host, rank=rank, pid=pid, ok=True, text="Thread 1\n")

    starts = {5001: 7_000_000, 7: 99, 4000: 5}
    a = act.Actions(
        "node-a",
        lambda job: (view,),
        Dumper(),
        start_us=starts.get,
        send_signal=send,
        pin=cast("Callable[[int], Pin]", testing.NoPin),  # fake pids: NoPin is Pin's interface, nothing pinned
        wall=lambda: 1.0,
        mono_ns=lambda: 1,
    )
    cmd = {
        "id": "x",
        "type": c.SIGNAL,
        "job": "job",
        "target": c.target(1, 7, 7_000_000),
        "args": {"signal": "SIGTERM"},
    }
    out, refusals = a.run(cmd)
    assert out["ok"] and sent == [5001] and refusals == []
    out, _ = a.run({**cmd, "target": c.target(-1, 4000, 5)})  # the launcher: already our pid
    assert out["ok"] and sent[-1] == 4000
    out, _ = a.run({**cmd, "type": c.DUMP_STACKS, "args": {"ranks": [c.target(1, 7, 7_000_000)]}})
    assert dumped == [5001] and out["stacks"][0]["pid"] == 7 and out["stacks"][0]["ok"]


# -- the real thing: a hooked process in its own pid namespace ------------------


def _can_unshare() -> bool:
    if not shutil.which("unshare"):
        return False
    try:
        return (
            subprocess.run(
                ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=20
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


INNER = r"""
import os, sys, time
from watchdog.hook import install
mon = install(run_dir=sys.argv[1], job="ns", patch_collectives=False)
mon.step()
print(os.getpid(), flush=True)
time.sleep(120)
"""


@pytest.mark.integration
@pytest.mark.skipif(sys.platform != "linux" or not _can_unshare(), reason="needs unshare --pid (root)")
def test_a_rank_in_its_own_pid_namespace_is_alive_then_dead_under_its_host_pid(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", INNER, str(run)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert p.stdout is not None
        inner_pid = int(p.stdout.readline())
        assert inner_pid == 1  # pid 1 of its namespace: the host's init has that number
        t = SlotTracker(str(run))
        t.poll(time.monotonic_ns(), time.time_ns())
        (v,) = t.views()
        assert v.identity.pid == 1 and v.state == slot_states.ALIVE
        host = psutil.Process(p.pid).children()[0].pid  # unshare's child: the python in the namespace
        assert v.pid_here == host != 1
        pids = t.procs._pids
        assert pids is not None and pids.scans == 1
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        deadline = time.monotonic() + 10
        while t.views()[0].state != slot_states.DEAD:
            assert time.monotonic() < deadline, "death not seen"
            time.sleep(0.05)
            t.poll(time.monotonic_ns(), time.time_ns())
        assert pids.scans == 1  # no rescan per poll: the mapping is cached, the pidfd saw the death
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        if "t" in locals():
            t.procs.close()
