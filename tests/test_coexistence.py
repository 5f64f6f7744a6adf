"""Our import name is shared with PyPI's filesystem library `watchdog`.

Build our wheel, install it into fresh virtualenvs together with PyPI's
`watchdog` in both orders, and import both public APIs. The venvs have no
torch, which also proves the agent and coordinator import without it.
"""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CHECK = r"""
import sys
from watchdog.observers import Observer          # PyPI watchdog
from watchdog.events import FileSystemEventHandler
import watchdog.wire, watchdog.report, watchdog.hook, watchdog.agent.main, watchdog.cli
assert Observer is not None and FileSystemEventHandler is not None
assert watchdog.wire.VERSION >= 1
assert "torch" not in sys.modules, "agent/coordinator must not import torch"
mon = watchdog.hook.install(enabled=False)  # the hook imports without torch too
mon.step()
print("both-ok")
"""


@pytest.mark.parametrize("order", ["ours-first", "theirs-first"])
def test_both_packages_import_in_one_env(tmp_path, wheel, order):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = str(env_dir / "bin" / "python")
    installs = [[str(wheel)], ["watchdog"]]
    if order == "theirs-first":
        installs.reverse()
    for spec in installs:
        subprocess.run([py, "-m", "pip", "install", "-q", *spec], check=True, timeout=300)
    # cwd outside the checkout: '' on sys.path would otherwise import ./watchdog.
    out = subprocess.run([py, "-c", CHECK], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "both-ok" in out.stdout
    if order == "ours-first":
        _agent_runs_without_torch(env_dir, tmp_path)
    # The console script must be ours (PyPI watchdog ships `watchmedo`, not `watchdog`).
    helptext = subprocess.run([str(env_dir / "bin" / "watchdog"), "--help"], capture_output=True, text=True,
                              cwd=tmp_path)
    assert "agent" in helptext.stdout and "coordinator" in helptext.stdout


def _agent_runs_without_torch(env_dir: Path, tmp_path: Path) -> None:
    """Not just importable: the agent serves /metrics from a venv with no torch."""
    import time
    import urllib.request

    addr_file = tmp_path / "agent.address"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = subprocess.Popen([str(env_dir / "bin" / "watchdog"), "agent", "--run-dir", str(run_dir),
                             "--web.listen-address", "127.0.0.1:0", "--web.address-file", str(addr_file)],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (addr_file.exists() and addr_file.read_text().strip()):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "agent did not start"
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://{addr_file.read_text().strip()}/metrics", timeout=5) as r:
            body = r.read().decode()
        assert "watchdog_agent_polls_total" in body
    finally:
        proc.terminate()
        proc.wait(10)
