"""A rank that crashes on an uncaught exception must not pass for a clean exit:
the coordinator would otherwise not call it a death."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from watchdog.contracts import crash_record as crashrecord
from watchdog.contracts import slot as wire

SCRIPT = """
import sys
from watchdog.hook import install
mon = install(run_dir=sys.argv[1], job="crash")
mon.step()
if sys.argv[2] == "crash":
    raise RuntimeError("boom in training")
"""


@pytest.mark.parametrize("how,status", [("crash", wire.Status.FAILED), ("clean", wire.Status.EXITED)])
def test_exit_status_in_the_slot(tmp_path, how, status):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), how], capture_output=True, text=True, timeout=60)
    (path,) = wire.list_slot_files(str(tmp_path))
    assert wire.Status(wire.read_slot(path).header.status) is status
    if how == "crash":
        assert out.returncode == 1
        assert "RuntimeError: boom in training" in out.stderr  # the usual traceback still printed
    else:
        assert out.returncode == 0 and "Traceback" not in out.stderr


RECORDED = """
import os, signal, sys, threading
from watchdog.hook import install
mon = install(run_dir=sys.argv[1], job="crash", patch_collectives=False)  # no torch: fast
mon.step()
how = sys.argv[2]
if how == "thread":
    t = threading.Thread(target=lambda: {}["missing"], name="loader-thread")
    t.start(); t.join()
    sys.exit(0)
if how == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
def train_step(x):
    return 1 / x
train_step(0)
"""


def run_recorded(tmp_path, how):
    out = subprocess.run(
        [sys.executable, "-c", RECORDED, str(tmp_path), how], capture_output=True, text=True, timeout=60
    )
    (path,) = wire.list_slot_files(str(tmp_path))
    return out, path


def test_uncaught_exception_is_recorded_beside_the_slot(tmp_path):
    from watchdog.contracts import crash_record as crashrecord

    out, path = run_recorded(tmp_path, "raise")
    assert out.returncode == 1 and "ZeroDivisionError: division by zero" in out.stderr  # still printed as usual
    rec = crashrecord.read_crash(path)
    assert rec is not None, out.stderr
    assert (rec["type"], rec["message"], rec["where"], rec["function"]) == (
        "ZeroDivisionError",
        "division by zero",
        "<string>:14",
        "train_step",
    )
    assert rec["thread"] == "MainThread" and "1 / x" not in rec["traceback"]  # -c has no source lines
    assert "ZeroDivisionError" in rec["traceback"]
    assert not os.path.exists(crashrecord.fatal_path(path))  # no fatal signal: no empty file left behind


def test_an_exception_in_another_thread_is_recorded_with_the_thread_name(tmp_path):
    from watchdog.contracts import crash_record as crashrecord

    out, path = run_recorded(tmp_path, "thread")
    assert out.returncode == 0 and "KeyError" in out.stderr  # threading's own report still printed
    rec = crashrecord.read_crash(path)
    assert rec is not None
    assert (rec["type"], rec["thread"]) == ("KeyError", "loader-thread"), rec
    assert wire.Status(wire.read_slot(path).header.status) is wire.Status.EXITED  # the rank itself ended cleanly


def test_a_fatal_signal_leaves_every_threads_stack(tmp_path):
    from watchdog.contracts import crash_record as crashrecord

    out, path = run_recorded(tmp_path, "segv")
    assert out.returncode == -11
    text = crashrecord.read_fatal(path)
    assert "Fatal Python error: Segmentation fault" in text and "<module>" in text, text


def test_the_users_faulthandler_is_left_alone(tmp_path):
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    out = subprocess.run(
        [sys.executable, "-c", RECORDED, str(tmp_path), "segv"], capture_output=True, text=True, timeout=60, env=env
    )
    (path,) = wire.list_slot_files(str(tmp_path))
    assert "Fatal Python error" in out.stderr  # where the user asked for it
    assert not os.path.exists(path + ".fatal")


def test_hostile_crash_files_are_refused(tmp_path):
    from watchdog.contracts import crash_record as crashrecord

    slot = str(tmp_path / "x.slot")
    (tmp_path / "x.slot").write_bytes(b"")  # its records are believed only from the slot's owner
    for raw in (b"", b"not json", b"[1, 2]", b'{"type": 3}', b"{" + b" " * (crashrecord.MAX_BYTES + 10) + b"}"):
        (tmp_path / "x.slot.crash").write_bytes(raw)
        assert crashrecord.read_crash(slot) is None, raw
    (tmp_path / "x.slot.crash").write_bytes(b'{"type": "E", "message": ["x"], "pid": true}')
    rec = crashrecord.read_crash(slot)
    assert rec is not None and rec["message"] == "" and rec["pid"] == 0


def test_a_crash_record_left_by_an_earlier_process_with_the_same_name_is_cleared_at_install(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", RECORDED, str(tmp_path), "raise"], capture_output=True, text=True, timeout=60
    )
    (path,) = wire.list_slot_files(str(tmp_path))
    assert os.path.exists(path + ".crash"), out.stderr
    pid = int(path.rsplit(".pid", 1)[1].split(".")[0])
    again = (
        f"import sys, os\nos.getpid = lambda: {pid}\nfrom watchdog.hook import install\n"
        "install(run_dir=sys.argv[1], job='crash', patch_collectives=False).close()\n"
    )
    subprocess.run([sys.executable, "-c", again, str(tmp_path)], check=True, timeout=60)
    assert not os.path.exists(path + ".crash")


EXITS = """
import os, sys, threading
from watchdog.hook import install
mon = install(run_dir=sys.argv[1], job="exits", patch_collectives=False)  # no torch: fast
mon.step()
how = sys.argv[2]
def load_batch():
    raise ValueError("bad batch")
if how == "thread":  # sys.exit in another thread ends only that thread
    t = threading.Thread(target=sys.exit, args=(1,)); t.start(); t.join()
elif how == "caught":  # a probe that exits, caught; training goes on
    try:
        sys.exit(2)
    except SystemExit:
        pass
    mon.step()
elif how == "raise":
    raise SystemExit(4)
elif how == "exit0":
    sys.exit(0)
elif how == "caught_then_crash":  # the uncaught exception, not the caught exit, ends it
    try:
        sys.exit(2)
    except SystemExit:
        pass
    load_batch()
elif how != "clean":
    try:
        load_batch()
    except ValueError:
        print("caught, exiting", file=sys.stderr)
        {"exit1": lambda: sys.exit(1), "str": lambda: sys.exit("no data"), "os": lambda: os._exit(3)}[how]()
"""


@pytest.mark.parametrize(
    "how,rc,status,exc,call",
    [
        # hydra, click, many trainers: print the exception, sys.exit(1)
        ("exit1", 1, wire.Status.FAILED, "ValueError", "sys.exit(1)"),
        ("str", 1, wire.Status.FAILED, "ValueError", "sys.exit('no data')"),
        ("os", 3, wire.Status.FAILED, "ValueError", "os._exit(3)"),
        ("clean", 0, wire.Status.EXITED, None, None),
        ("exit0", 0, wire.Status.EXITED, None, None),
        ("caught", 0, wire.Status.EXITED, None, None),
        ("thread", 0, wire.Status.EXITED, None, None),
        # Not seen from inside (no call to wrap): the agent's read of the exit status decides
        ("raise", 4, wire.Status.EXITED, None, None),
        ("caught_then_crash", 1, wire.Status.FAILED, "ValueError", ""),
    ],
)
def test_a_failing_exit_call_is_recorded_with_the_exception_it_handled(tmp_path, how, rc, status, exc, call):
    out = subprocess.run([sys.executable, "-c", EXITS, str(tmp_path), how], capture_output=True, text=True, timeout=60)
    assert out.returncode == rc, out.stderr
    (path,) = wire.list_slot_files(str(tmp_path))
    assert wire.Status(wire.read_slot(path).header.status) is status
    rec = crashrecord.read_crash(path)
    if call is None:
        assert rec is None, rec
        return
    assert rec is not None and rec.get("exit") == ({"call": call, "status": rc} if call else None), rec
    assert (rec["type"], rec["function"]) == (exc, "load_batch"), rec


LIGHTNING_SIGTERM = """
import sys
from lightning.pytorch.utilities.exceptions import SIGTERMException
from watchdog.hook import install
from watchdog.hook.lightning import WatchdogCallback
mon = install(run_dir=sys.argv[1], job="exits", patch_collectives=False)
cb = WatchdogCallback(monitor=mon)
mon.step()
exc = SIGTERMException()  # what Lightning's loops raise after a SIGTERM
cb.on_exception(None, None, exc)  # Lightning calls its callbacks, then re-raises
raise exc
"""


def test_lightnings_sigterm_exit_is_a_failure_even_with_status_zero(tmp_path):
    pytest.importorskip("lightning")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    out = subprocess.run(
        [sys.executable, "-c", LIGHTNING_SIGTERM, str(tmp_path)], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr  # Lightning's own status outside torchelastic
    (path,) = wire.list_slot_files(str(tmp_path))
    assert wire.Status(wire.read_slot(path).header.status) is wire.Status.FAILED
    rec = crashrecord.read_crash(path)
    assert rec is not None and rec["type"] == "SIGTERMException", rec
    assert rec["exit"] == {"call": "raise SIGTERMException()", "status": 0}, rec
