"""A nonzero exit is a failure: the pure parts, table-driven. How a ``SystemExit``
code becomes an exit status, how a rank's end is classified from the hook's
status and the exit status, and the one line a finding says about it."""

from __future__ import annotations

import os

import pytest

from watchdog import wire
from watchdog.agent import deathcause, track
from watchdog.agent.procs import ProcSample
from watchdog.hook import crashrecord, exitcall

GONE = ProcSample(status="gone", alive=False)
ALIVE = ProcSample(status="running", alive=True)
EXITED, FAILED, RUNNING = wire.Status.EXITED, wire.Status.FAILED, wire.Status.RUNNING


@pytest.mark.parametrize(
    "code,status",
    [(None, 0), (0, 0), (1, 1), (3, 3), (256, 0), (-1, 255), (True, 1), (False, 0), ("no data", 1), ([1], 1)],
)
def test_a_systemexit_code_gives_cpythons_exit_status(code, status):
    assert exitcall.exit_status(code) == status


@pytest.mark.parametrize(
    "call,code,failed,label",
    [
        (exitcall.SYS_EXIT, 1, True, "sys.exit(1)"),
        (exitcall.SYS_EXIT, None, False, "sys.exit()"),
        (exitcall.SYS_EXIT, 0, False, "sys.exit(0)"),
        (exitcall.SYS_EXIT, "no data", True, "sys.exit('no data')"),
        (exitcall.OS_EXIT, 3, True, "os._exit(3)"),
        (exitcall.OS_EXIT, 0, False, "os._exit(0)"),
        (exitcall.OS_EXIT, "x", False, "os._exit('x')"),  # os._exit refuses it (TypeError): not an exit
    ],
)
def test_an_exit_call_is_a_failure_when_its_status_is_not_zero(call, code, failed, label):
    ex = exitcall.note(call, code)
    assert (ex.failed, ex.label()) == (failed, label)


def test_the_exception_being_handled_is_the_cause_but_a_systemexit_is_not():
    try:
        raise ValueError("bad batch")
    except ValueError:
        assert exitcall.handled()[0] is ValueError
    try:
        raise SystemExit(1)
    except SystemExit:
        assert exitcall.handled() == (None, None, None)
    assert exitcall.handled() == (None, None, None)


@pytest.mark.parametrize(
    "hook,proc,exit_code,state",
    [
        (EXITED, GONE, None, track.EXITED),  # status not read: the hook's clean exit stands
        (EXITED, GONE, 0, track.EXITED),
        (EXITED, GONE, 1, track.DEAD),  # raise SystemExit(1): the hook saw a normal shutdown
        (EXITED, GONE, -9, track.DEAD),  # killed after atexit
        (EXITED, ALIVE, None, track.EXITED),  # shutting down
        (FAILED, GONE, 1, track.DEAD),
        (FAILED, GONE, None, track.DEAD),
        (RUNNING, GONE, None, track.DEAD),
        (RUNNING, ALIVE, None, track.ALIVE),
    ],
)
def test_a_rank_is_dead_when_gone_unless_it_exited_cleanly_with_status_zero(hook, proc, exit_code, state):
    assert track.rank_state(hook, proc, exit_code) == state


@pytest.mark.parametrize(
    "hook,state,reported",
    [
        (EXITED, track.EXITED, "exited"),
        (EXITED, track.DEAD, "failed"),  # the exit status overrules the hook
        (FAILED, track.DEAD, "failed"),
        (RUNNING, track.DEAD, "running"),  # SIGKILLed: the coordinator sees alive=false
        (RUNNING, track.ALIVE, "running"),
    ],
)
def test_the_reported_status_is_exited_only_for_a_clean_exit(hook, state, reported):
    assert track.reported_status(hook, state) == reported


def exit_wait(code: int) -> int:
    return code << 8  # the wait status of a normal exit with that code


def crash(tmp_path, exc: BaseException | None, call: str, status: int) -> str:
    slot = str(tmp_path / "r.slot")
    tb = None
    if exc is not None:
        try:
            raise exc
        except BaseException as e:  # noqa: BLE001 - any exception is a cause
            tb = e.__traceback__
    assert crashrecord.write(slot, type(exc) if exc else None, exc, tb, "MainThread", {"call": call, "status": status})
    return slot


@pytest.mark.parametrize(
    "exc,call,status,wait,hook,summary,code",
    [
        # hydra / click: the exception being handled, then sys.exit(1); the zombie was read
        (
            ValueError("bad batch"),
            "sys.exit(1)",
            1,
            exit_wait(1),
            "failed",
            "ValueError: bad batch at test_exit_status.py:",
            1,
        ),
        # the zombie was reaped first: the status the rank asked for
        (ValueError("bad batch"), "sys.exit(1)", 1, None, "failed", "exit 1 by sys.exit(1)", 1),
        (None, "os._exit(3)", 3, None, "failed", "exit 3 by os._exit(3)", 3),
        (None, "sys.exit('no data')", 1, exit_wait(1), "failed", "exit 1 by sys.exit('no data')", 1),
    ],
)
def test_the_finding_names_the_cause_and_the_exit_status(tmp_path, exc, call, status, wait, hook, summary, code):
    out = deathcause.explain(wait_status=wait, hook_status=hook, slot_path=crash(tmp_path, exc, call, status))
    assert summary in out["summary"] and f"exit {code} by {call}" in out["summary"], out
    assert (out["exit_code"], out["exit_call"]) == (code, call)
    assert ("exception" in out) == (exc is not None)


@pytest.mark.parametrize(
    "wait,hook,summary",
    [
        (exit_wait(4), "exited", "exit 4 (a SystemExit or C-level exit with a nonzero status)"),
        (exit_wait(0), "exited", "exit 0"),
        (9, "running", "exit -9 (SIGKILL)"),
    ],
)
def test_without_a_record_the_exit_status_alone_is_said(tmp_path, wait, hook, summary):
    out = deathcause.explain(wait_status=wait, hook_status=hook, slot_path=str(tmp_path / "none.slot"), kmsg=os.devnull)
    assert out["summary"] == summary


def test_a_hostile_exit_field_is_dropped_and_the_rest_read(tmp_path):
    slot = str(tmp_path / "r.slot")
    rec = crashrecord.describe(None, None, None, "MainThread", {"call": "sys.exit(1)", "status": 999})
    assert crashrecord.write_record(slot, rec)
    got = crashrecord.read_crash(slot)
    assert got is not None and "exit" not in got
