"""The agent's commands against real processes: py-spy dumps of a sleeping Python
process and of a SIGSTOPped one (non-blocking, left stopped), a pidfd signal with
an identity check, and the whole agent path (reply -> verify -> worker -> ack in
the next report) with a real slot-writing rank."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from watchdog.agent import testing
from watchdog.agent.command_channel import handlers as act
from watchdog.agent.command_channel.inbox import CommandHandler
from watchdog.agent.command_channel.outbox import Outbox
from watchdog.agent.command_channel.stacks import BLOCKING, NONBLOCKING, StackDumper, find_py_spy, proc_state
from watchdog.agent.processes.table import ProcSample
from watchdog.agent.reporting.sender import Sender
from watchdog.agent.slotfiles import slot_states
from watchdog.agent.slotfiles.local_rank import LocalRank
from watchdog.agent.slotfiles.tracker import SlotTracker
from watchdog.contracts import commands as c
from watchdog.contracts.evidence import StackDump

PY_SPY = find_py_spy()
needs_py_spy = pytest.mark.skipif(PY_SPY is None, reason="py-spy not installed (pip install py-spy)")

SLEEPER = """
import sys, time
def stuck_in_named_function():
    print("ready", flush=True)
    while True:
        time.sleep(3600)
stuck_in_named_function()
"""


@pytest.fixture
def sleeper():
    procs = []

    def start():
        p = subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            os.kill(p.pid, signal.SIGCONT)
        p.wait(5)


def wait_state(pid, want, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while proc_state(pid) != want and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc_state(pid)


@needs_py_spy
def test_dump_of_a_sleeping_process_shows_the_function(sleeper):
    p = sleeper()
    d = StackDumper(PY_SPY).dump("h", 0, p.pid)
    assert d.ok, d.error
    assert d.method == BLOCKING and "stuck_in_named_function" in d.text and d.duration_s < 10
    assert p.poll() is None  # paused for the dump only


@needs_py_spy
def test_stopped_process_gets_a_nonblocking_dump_and_stays_stopped(sleeper):
    p = sleeper()
    os.kill(p.pid, signal.SIGSTOP)
    assert wait_state(p.pid, "T") == "T"
    dumper = StackDumper(PY_SPY)
    # What py-spy 0.4 does with a T-state process when asked to pause it: it fails.
    ok, _, error = dumper._once(p.pid, BLOCKING)
    assert not ok and "suspend" in error.lower(), error
    d = dumper.dump("h", 3, p.pid)
    assert d.ok, d.error
    assert d.method == NONBLOCKING and "stuck_in_named_function" in d.text
    assert proc_state(p.pid) == "T"  # the dump did not resume it


def test_missing_py_spy_is_a_clear_error_not_a_crash(sleeper):
    p = sleeper()
    d = StackDumper("").dump("h", 0, p.pid)
    assert not d.ok and "py-spy not found" in d.error and d.text == ""
    d = StackDumper("/nonexistent/py-spy").dump("h", 0, p.pid)
    assert not d.ok and "cannot run py-spy" in d.error


def test_a_failed_nonblocking_read_of_a_stopped_rank_is_tried_once_more():
    calls = []

    def flaky(argv, **kw):  # py-spy's non-blocking read sometimes misses the interpreter on its first try
        calls.append(argv)
        if len(calls) == 1:
            return subprocess.CompletedProcess(argv, 1, stdout="", stderr="Error: Failed to find a python interpreter")
        return subprocess.CompletedProcess(argv, 0, stdout="Thread 1 (idle)\n  main (train.py:3)\n", stderr="")

    d = StackDumper("py-spy", run=flaky, state=lambda pid: "T", denied=lambda pid: False).dump("h", 0, 1)
    assert d.ok and d.method == NONBLOCKING and "train.py:3" in d.text
    assert len(calls) == 2 and all("--nonblocking" in argv for argv in calls)

    def broken(argv, **kw):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 1, stdout="", stderr="Error: boom")

    calls.clear()
    d = StackDumper("py-spy", run=broken, state=lambda pid: "T", denied=lambda pid: False).dump("h", 0, 1)
    assert not d.ok and "boom" in d.error and len(calls) == 2  # once more, not forever


def test_dump_timeout_and_text_cap_with_a_fake_runner():
    def slow(argv, **kw):
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    d = StackDumper("py-spy", run=slow, state=lambda pid: "S", timeout_s=0.5).dump("h", 0, 1)
    assert not d.ok and "timed out after 0.5 s" in d.error

    def big(argv, **kw):
        return subprocess.CompletedProcess(argv, 0, stdout="x" * 100_000, stderr="")

    d = StackDumper("py-spy", run=big, state=lambda pid: "S", max_bytes=1000).dump("h", 0, 1)
    assert d.ok and len(d.text) < 1200 and "truncated" in d.text
    d = StackDumper("py-spy", run=big, state=lambda pid: None).dump("h", 0, 1)
    assert not d.ok and "gone" in d.error


def test_signal_through_pidfd_checks_identity_first(sleeper):
    p = sleeper()
    ident = testing.identity("job", 0, 1, pid=p.pid)
    snap = testing.snapshot(ident)
    view = LocalRank("", snap.header, 0, False, ProcSample(True, "sleeping"), slot_states.ALIVE, 0.0, ())
    a = act.Actions("node-a", lambda job: (view,), StackDumper(""))
    wrong = c.target(0, p.pid, ident.proc_start_us + 5_000_000)  # as if the pid had been reused
    out, refusals = a.run(
        c.make(
            job="job",
            type=c.SIGNAL,
            host="node-a",
            target=wrong,
            args={"signal": "SIGTERM"},
            issued_wall=time.time(),
            ttl_s=30,
        )
    )
    assert not out["ok"] and refusals == [c.WRONG_IDENTITY]
    time.sleep(0.2)
    assert p.poll() is None
    out, refusals = a.run(
        c.make(
            job="job",
            type=c.SIGNAL,
            host="node-a",
            args={"signal": "SIGTERM"},
            target=c.target(0, p.pid, ident.proc_start_us),
            issued_wall=time.time(),
            ttl_s=30,
        )
    )
    assert out["ok"], out
    assert p.wait(5) == -signal.SIGTERM


@needs_py_spy
def test_agent_path_reply_to_ack_with_a_real_rank(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rank = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "watchdog.agent.testing",
            "--run-dir",
            str(run_dir),
            "--job",
            "job",
            "--rank",
            "0",
            "--world-size",
            "1",
            "--step-seconds",
            "0.05",
        ]
    )
    try:
        tracker = SlotTracker(str(run_dir), job="job")
        deadline = time.monotonic() + 10
        while not tracker.views() and time.monotonic() < deadline:
            tracker.poll(time.monotonic_ns(), time.time_ns())
            time.sleep(0.05)
        [v] = tracker.views()
        outbox = Outbox()
        h = CommandHandler(
            host="node-a",
            token="tok",
            loopback=False,
            outbox=outbox,
            actions=act.Actions("node-a", tracker.incarnations, StackDumper(PY_SPY)),
        )
        t = c.target(0, v.identity.pid, v.identity.proc_start_us)
        replies = [
            [
                c.sign(
                    c.make(
                        job="job",
                        type=c.DUMP_STACKS,
                        host="node-a",
                        args={"ranks": [t]},
                        issued_wall=time.time(),
                        ttl_s=30,
                    ),
                    "tok",
                ),
                c.sign(
                    c.make(
                        job="job",
                        type=c.SNAPSHOT_SLOTS,
                        host="node-a",
                        args={"ranks": [t]},
                        issued_wall=time.time(),
                        ttl_s=30,
                    ),
                    "forged",
                ),
            ],
        ]
        sent = []

        def post(url, payload, token, timeout):
            sent.append(json.loads(json.dumps(payload)))
            return {"ok": True, "commands": replies.pop(0) if replies else []}

        s = Sender(
            url="http://coord:1",
            token="tok",
            job="job",
            host="node-a",
            agent_id="a",
            interval_s=1.0,
            timeout_s=1.0,
            views=tracker.views,
            post=post,
            handle_commands=h,
            outbox=outbox,
        )
        s.send_once()
        assert h.wait_idle(15.0)
        s.send_once()
        s.send_once()
        assert sent[0]["acks"] == []
        acks = {a["id"]: a for a in sent[1]["acks"]}
        assert len(acks) == 2 and sent[2]["acks"] == []  # delivered once
        done = next(a for a in acks.values() if a["type"] == c.DUMP_STACKS)
        refused = next(a for a in acks.values() if a["type"] == c.SNAPSHOT_SLOTS)
        [stack] = [StackDump.from_dict(x) for x in done["stacks"]]
        assert done["ok"] and stack.ok and stack.rank == 0 and "fake_rank (watchdog/agent/testing.py" in stack.text
        assert refused["refused"] == c.BAD_SIGNATURE and h.refused[c.BAD_SIGNATURE] == 1
        h.stop()
    finally:
        rank.kill()
        rank.wait(5)
