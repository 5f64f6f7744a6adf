"""Why a rank died, from what the agent can observe: the zombie's wait status,
the memory cgroup's oom_kill counter, the kernel's OOM line, the hook's crash
record. Real child processes (this test is their parent, so they stay zombies
until reaped) and fixture trees for cgroups and the kernel log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
from waiting import wait_for

from watchdog.agent.processes import deathcause
from watchdog.agent.processes.table import ProcessTable


def zombie(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code])
    wait_for(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE, timeout_s=30)
    return proc


def test_the_wait_status_of_a_zombie_says_exit_code_or_signal():
    for code, expected in (
        ("import sys; sys.exit(3)", (3, "")),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", (-9, "SIGKILL")),
    ):
        proc = zombie(code)
        try:
            status = deathcause.zombie_status(proc.pid)
            assert status is not None and deathcause.decode(status) == expected
            start = round(psutil.Process(proc.pid).create_time() * 1e6)
            assert deathcause.zombie_status(proc.pid, start_us=start) == status
            assert deathcause.zombie_status(proc.pid, start_us=start - 5_000_000) is None  # another process's pid
        finally:
            proc.wait()
        assert deathcause.zombie_status(proc.pid) is None  # reaped: gone with it


def test_the_process_table_reads_the_exit_status_at_the_exit_through_the_deathwatch():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    table = ProcessTable()
    try:
        start = round(psutil.Process(proc.pid).create_time() * 1e6)
        assert table.check(proc.pid, start, time.monotonic_ns(), resources=True).alive
        os.kill(proc.pid, signal.SIGKILL)
        watch = table._deathwatch
        assert watch is not None
        wait_for(lambda: watch.info((proc.pid, start)) is not None, timeout_s=30)
        proc.wait()  # reaped: only what the deathwatch read at the exit is left
        status = table.exit_status(proc.pid, start)
        assert status is not None
        assert deathcause.decode(status) == (-9, "SIGKILL")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        table.close()


def fake_proc(tmp_path, pid: int, cgroup: str) -> str:
    (tmp_path / "proc" / str(pid)).mkdir(parents=True)
    (tmp_path / "proc" / str(pid) / "cgroup").write_text(cgroup)
    return str(tmp_path / "proc")


def test_oom_counter_of_the_memory_cgroup_v2_and_v1(tmp_path):
    cg = tmp_path / "cg"
    (cg / "job" / "rank1").mkdir(parents=True)
    (cg / "job" / "rank1" / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    proc = fake_proc(tmp_path, 7, "0::/job/rank1\n")
    assert deathcause.oom_counter_file(7, proc, str(cg)) == str(cg / "job" / "rank1" / "memory.events")
    assert deathcause.oom_kills(deathcause.oom_counter_file(7, proc, str(cg))) == 1
    (cg / "memory" / "r2").mkdir(parents=True)
    (cg / "memory" / "r2" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
    proc = fake_proc(tmp_path, 8, "4:memory:/r2\n1:cpu:/\n0::/\n")
    assert deathcause.oom_kills(deathcause.oom_counter_file(8, proc, str(cg))) == 4
    assert deathcause.oom_counter_file(9, proc, str(cg)) == ""  # no such process
    assert deathcause.oom_kills("") is None


def crash_file(tmp_path, **rec) -> str:
    slot = str(tmp_path / "job.rank1.pid7.slot")
    (tmp_path / "job.rank1.pid7.slot").write_bytes(b"")  # the record is believed from the slot's owner only
    (tmp_path / "job.rank1.pid7.slot.crash").write_text(json.dumps({"type": "ZeroDivisionError", **rec}))
    return slot


def test_explain_composes_the_line_a_person_reads(tmp_path):
    slot = crash_file(
        tmp_path,
        message="division by zero",
        where="train.py:120",
        thread="MainThread",
        traceback="Traceback ...\nZeroDivisionError: division by zero\n",
    )
    d = deathcause.explain(wait_status=1 << 8, hook_status="failed", slot_path=slot)
    assert d["summary"] == "ZeroDivisionError: division by zero at train.py:120, exit 1"
    assert d["exit_code"] == 1 and d["exception"]["where"] == "train.py:120" and "Traceback" in d["traceback"]


def test_an_uncaught_exception_reaped_before_its_status_was_read_says_pythons_exit_1(tmp_path):
    """torchrun reaps a rank milliseconds after its exit; on a loaded host the agent may read
    the zombie too late. An uncaught exception in the main thread fixes the status at 1."""

    def unread(hook_status="failed", **rec):
        fields = {"message": "bad batch", "where": "hf_loop.py:46", "thread": "MainThread", **rec}
        slot = crash_file(tmp_path, **fields)
        return deathcause.explain(wait_status=None, hook_status=hook_status, slot_path=slot, kmsg="/nonexistent")

    d = unread()
    assert d["exit_code"] == 1
    assert d["summary"] == (
        "ZeroDivisionError: bad batch at hf_loop.py:46, exit 1 (as Python exits after an uncaught exception;"
        " its launcher reaped it before this host read the status)"
    )
    # What was read wins.
    slot = crash_file(tmp_path, message="bad batch", where="hf_loop.py:46", thread="MainThread")
    assert deathcause.explain(wait_status=signal.SIGTERM, hook_status="failed", slot_path=slot)["exit_code"] == -15
    # Nothing is inferred where Python's status is not fixed by the exception.
    assert "exit_code" not in unread(thread="worker-2")  # a thread's exception does not end the process
    assert "exit_code" not in unread(type="KeyboardInterrupt")  # re-raised as SIGINT
    assert "exit_code" not in unread(hook_status="running")  # the hook did not see it fail
    assert unread(exit={"call": "os._exit", "status": 3})["exit_code"] == 3  # asked for another


def test_explain_an_oom_kill_from_the_cgroup_and_the_kernel(tmp_path):
    events = tmp_path / "memory.events"
    events.write_text("oom_kill 1\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,2,-;Memory cgroup out of memory: Killed process 4242 (python) total-vm:278724kB\n")
    d = deathcause.explain(
        wait_status=signal.SIGKILL,
        hook_status="running",
        slot_path=str(tmp_path / "none.slot"),
        oom=deathcause.OomBaseline(str(events), 0),
        host_pid=4242,
        kmsg=str(kmsg),
    )
    assert d["summary"].startswith(
        "exit -9 (SIGKILL), OOM-killed by the kernel (cgroup memory.events oom_kill 0 -> 1; "
        "kernel: Memory cgroup out of memory: Killed process 4242 (python)"
    ), d
    # Another process's OOM kill, counter unchanged: not this rank's.
    d = deathcause.explain(
        wait_status=signal.SIGKILL,
        hook_status="running",
        slot_path="",
        oom=deathcause.OomBaseline(str(events), 1),
        host_pid=4243,
        kmsg=str(kmsg),
    )
    assert d == {"exit_code": -9, "signal": "SIGKILL", "summary": "exit -9 (SIGKILL)"}


def test_explain_without_an_exit_status_says_what_the_hook_saw(tmp_path):
    assert deathcause.explain(wait_status=None, hook_status="running", slot_path="", kmsg="/nonexistent") == {}
    d = deathcause.explain(wait_status=None, hook_status="failed", slot_path="", kmsg="/nonexistent")
    assert d["summary"] == "uncaught exception (hook status failed)"
    slot = crash_file(tmp_path, message="x", where="loader.py:3", thread="worker-2")
    d = deathcause.explain(wait_status=signal.SIGTERM, hook_status="running", slot_path=slot)
    assert d["summary"] == "last exception ZeroDivisionError: x at loader.py:3 (in thread worker-2), exit -15 (SIGTERM)"


def test_an_oom_kill_counted_in_a_shared_cgroup_is_not_blamed_on_a_rank_whose_exit_is_unknown(tmp_path):
    events = tmp_path / "memory.events"
    events.write_text("oom_kill 1\n")
    d = deathcause.explain(
        wait_status=None,
        hook_status="running",
        slot_path="",
        oom=deathcause.OomBaseline(str(events), 0),
        host_pid=4243,
        kmsg="/nonexistent",
    )
    assert (
        d["summary"] == "its memory cgroup recorded an OOM kill (cgroup memory.events oom_kill 0 -> 1), possibly of "
        "another process"
    )
    d = deathcause.explain(
        wait_status=signal.SIGTERM,
        hook_status="running",
        slot_path="",
        oom=deathcause.OomBaseline(str(events), 0),
        host_pid=4243,
        kmsg="/nonexistent",
    )
    assert d["summary"] == "exit -15 (SIGTERM)"  # torchrun's teardown of a victim: no OOM look at all


def test_a_long_wrapped_exception_message_is_cut_in_the_summary_and_kept_in_the_evidence(tmp_path):
    message = "Got the following error when running the callback: " + "x" * 300 + "\nTraceback (most recent...)\n"
    slot = crash_file(tmp_path, type="RuntimeError", message=message, where="graph.py:979", thread="MainThread")
    d = deathcause.explain(wait_status=signal.SIGTERM, hook_status="failed", slot_path=slot)
    line = d["summary"].split(" at graph.py:979")[0]
    assert line.startswith("RuntimeError: Got the following error") and line.endswith("…") and len(line) < 200
    assert d["exception"]["message"] == message
