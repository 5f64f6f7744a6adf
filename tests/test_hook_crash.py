"""A rank that crashes on an uncaught exception must not pass for a clean exit:
the coordinator would otherwise not call it a death."""

from __future__ import annotations

import subprocess
import sys

import pytest

from watchdog import wire

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
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), how], capture_output=True, text=True,
                         timeout=60)
    (path,) = wire.list_slot_files(str(tmp_path))
    assert wire.Status(wire.read_slot(path).header.status) is status
    if how == "crash":
        assert out.returncode == 1
        assert "RuntimeError: boom in training" in out.stderr  # the usual traceback still printed
    else:
        assert out.returncode == 0 and "Traceback" not in out.stderr
