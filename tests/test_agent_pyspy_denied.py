"""py-spy denied (no ptrace rights): the evidence says why.

With py-spy 0.4 and CAP_SYS_PTRACE really dropped (setpriv), py-spy's error already
ends in "Permission denied (os error 13)" and the agent adds the hint: that case was
handled and this proves it. The agent now also checks the rights itself
(``ptrace_denied``), so a py-spy whose words do not mention permissions ("Failed to
get process executable name. Check that the process is running.") is still explained.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from watchdog.agent.command_channel.stacks import PTRACE_HINT, StackDumper, find_py_spy, ptrace_denied

SETPRIV = shutil.which("setpriv")
DROP_PTRACE = [SETPRIV or "setpriv", "--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace"]
needs_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or SETPRIV is None or find_py_spy() is None,
    reason="needs root, setpriv (util-linux) and py-spy to drop CAP_SYS_PTRACE for real",
)

_DUMP = """
import dataclasses, json, sys
from watchdog.agent.command_channel.stacks import StackDumper, ptrace_denied
pid = int(sys.argv[1])
print(json.dumps({"denied": ptrace_denied(pid), **dataclasses.asdict(StackDumper().dump("h", 0, pid))}))
"""


@needs_setpriv
def test_without_cap_sys_ptrace_the_dump_says_the_rights_are_missing():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        out = subprocess.run(
            [*DROP_PTRACE, sys.executable, "-c", _DUMP, str(sleeper.pid)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        dump = json.loads(out.stdout)
        assert dump["denied"] is True and dump["ok"] is False
        assert PTRACE_HINT in dump["error"], dump["error"]
        assert not ptrace_denied(sleeper.pid)  # this (root) process has the rights: the check is not always true
    finally:
        sleeper.kill()
        sleeper.wait(5)


def test_a_denied_dump_names_the_missing_rights_and_keeps_py_spys_words():
    def run(argv, **kw):
        return subprocess.CompletedProcess(argv, 1, "", "Error: Failed to get process executable name.\n")

    dumper = StackDumper("/bin/true", run=run, state=lambda pid: "S", denied=lambda pid: True)
    d = dumper.dump("h", 3, 4242)
    assert not d.ok and d.error.startswith("no ptrace rights over pid 4242") and "executable name" in d.error
    d = StackDumper("/bin/true", run=run, state=lambda pid: "S", denied=lambda pid: False).dump("h", 3, 4242)
    assert "ptrace" not in d.error  # some other failure: not blamed on rights
