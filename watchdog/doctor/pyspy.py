"""py-spy: present where the agent looks for it, and runs."""

from __future__ import annotations

import subprocess

from watchdog.agent.command_channel.stacks import find_py_spy

from .check import AGENT, FIX, OK, Host, Result

INSTALL = "pip install py-spy in the agent's environment, or point --stacks.py-spy at the binary"


class PySpy:
    name = "py_spy"
    roles = frozenset({AGENT})

    def check(self, host: Host) -> Result:
        path = find_py_spy(host.py_spy)
        if path is None:
            where = host.py_spy or "beside this interpreter or on PATH"
            return Result(self.name, FIX, f"py-spy not found ({where}): no stacks for hangs or aborts", INSTALL)
        try:
            proc = subprocess.run(
                [path, "--version"], capture_output=True, text=True, timeout=host.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Result(self.name, FIX, f"{path} does not run: {exc}", INSTALL)
        out = (proc.stdout or proc.stderr).strip().splitlines()
        if proc.returncode != 0:
            return Result(self.name, FIX, f"{path} --version exited {proc.returncode}: {' / '.join(out[:2])}", INSTALL)
        return Result(self.name, OK, f"{path}: {out[0] if out else 'runs'}")
