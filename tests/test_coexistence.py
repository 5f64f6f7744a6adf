"""Our import name is shared with PyPI's filesystem library `watchdog`.

Build our wheel, install it into fresh virtualenvs together with PyPI's
`watchdog` in both orders, and import both public APIs. The venvs have no
torch, which also proves the agent and coordinator import without it.

The same wheel (one build per module: CI time) also proves the packaging
promises: every console script answers ``--version`` with the distribution's
version, and the hook installs light: a plain ``pip install rank-watchdog`` (what
training images do) pulls in nothing, imports and records with the standard library
alone, and a daemon's command there names the extra that brings its dependencies.
"""

from __future__ import annotations

import subprocess
import sys
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
    # No pip of its own (ensurepip costs seconds per venv): this environment's pip installs into it.
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = str(env_dir / "bin" / "python")
    installs = [[f"{wheel}[all]"], ["watchdog"]]
    if order == "theirs-first":
        installs.reverse()
    for spec in installs:
        subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q", *spec], check=True, timeout=300)
    # cwd outside the checkout: '' on sys.path would otherwise import ./watchdog.
    out = subprocess.run([py, "-c", CHECK], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "both-ok" in out.stdout
    if order == "ours-first":
        _agent_runs_without_torch(env_dir, tmp_path)
    # The console scripts must be ours (PyPI watchdog ships `watchmedo`, not `watchdog`); `rank-watchdog`
    # is the same CLI under a name Debian's hardware watchdog daemon (/usr/sbin/watchdog) cannot shadow.
    for script in ("watchdog", "rank-watchdog"):
        helptext = subprocess.run(
            [str(env_dir / "bin" / script), "--help"], capture_output=True, text=True, cwd=tmp_path
        )
        assert helptext.returncode == 0, f"{script}: {helptext.stderr}"
        assert "agent" in helptext.stdout and "coordinator" in helptext.stdout, script
    if order == "ours-first":
        _every_console_script_tells_the_version(env_dir, tmp_path)


def test_wheel_metadata_names_the_license_it_ships(wheel):
    """pyproject says Apache-2.0: the wheel carries that expression and the license text itself."""
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = zf.read(meta).decode()
        (lic,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        text = zf.read(lic).decode()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = zf.read(entry_points).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert "Classifier: Operating System :: POSIX :: Linux" in metadata
    assert "Project-URL: Documentation," in metadata
    assert "watchdog = watchdog.cli:main" in scripts and "rank-watchdog = watchdog.cli:main" in scripts


SCRIPTS = r"""
from importlib import metadata
dist = metadata.distribution("rank-watchdog")
print(dist.version)
for ep in dist.entry_points:
    if ep.group == "console_scripts":
        print(ep.name)
"""


def _every_console_script_tells_the_version(env_dir: Path, cwd: Path) -> list[str]:
    """``--version`` of each console script of the installed distribution (``watchdog``,
    and any other the distribution declares) is ``rank-watchdog <its metadata version>``."""
    out = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", SCRIPTS], capture_output=True, text=True, check=True, cwd=cwd
    )
    version, *scripts = out.stdout.split()
    assert "watchdog" in scripts
    for name in scripts:
        got = subprocess.run(
            [str(env_dir / "bin" / name), "--version"], capture_output=True, text=True, cwd=cwd, timeout=60
        )
        assert got.returncode == 0, got.stderr
        assert got.stdout.strip() == f"rank-watchdog {version}", name
    return scripts


LIGHT_HOOK = r"""
import importlib.util, os, sys
for heavy in ("torch", "psutil", "structlog", "prometheus_client", "pynvml"):
    assert importlib.util.find_spec(heavy) is None, f"{heavy} is installed: not a light environment"
from watchdog import wire
from watchdog.hook import install
mon = install(run_dir=sys.argv[1], job="light", host="h", rank=0, world_size=1)
for _ in range(3):
    mon.step()
path = mon.slot_path
mon.close()
snap = wire.read_slot(path)
ident = snap.header.identity
assert (ident.job, ident.pid) == ("light", os.getpid()), ident
assert ident.proc_start_us > 0, "no start time: the agent could not guard against pid reuse"
assert snap.header[wire.H_STEP] == 3, snap.header[wire.H_STEP]
assert not [m for m in ("psutil", "structlog", "prometheus_client") if m in sys.modules]
print("light-ok", ident.proc_start_us)
"""


def test_the_hook_installs_and_records_without_any_dependency(tmp_path, wheel):
    """``pip install rank-watchdog``, no extra: the plain package is the hook, which
    needs nothing but the standard library (torch only for its torch features, psutil
    not at all). Installed without an index, so any dependency would fail the install."""
    env_dir = tmp_path / "light"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = str(env_dir / "bin" / "python")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-index", str(wheel)],
        check=True,
        timeout=300,
    )
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", py, "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert [line.split("==")[0] for line in listed.stdout.split()] == ["rank-watchdog"], listed.stdout
    out = subprocess.run(
        [py, "-c", LIGHT_HOOK, str(tmp_path / "run")], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "light-ok" in out.stdout
    # (that the stdlib start time equals psutil's: tests/test_agent_nspid.py)
    # the console script is there too, and tells the version without the agent's dependencies
    assert _every_console_script_tells_the_version(env_dir, tmp_path)
    # a daemon's command names the extra to install instead of a traceback
    # (the demo starts both daemons, so it names the extra that brings both)
    for command, extra in (("agent", "agent"), ("coordinator", "coordinator"), ("slots", "agent"), ("demo", "all")):
        got = subprocess.run(
            [str(env_dir / "bin" / "watchdog"), command], capture_output=True, text=True, cwd=tmp_path, timeout=60
        )
        assert got.returncode == 2 and "Traceback" not in got.stderr, (command, got.stderr)
        assert f"pip install 'rank-watchdog[{extra}]'" in got.stderr, (command, got.stderr)
    # and `watchdog run`, the training side, works there
    ran = subprocess.run(
        [str(env_dir / "bin" / "watchdog"), "run", "--", py, "-c", "print('ranked')"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "WATCHDOG_RUN_DIR": str(tmp_path / "run")},
    )
    assert ran.returncode == 0 and "ranked" in ran.stdout, ran.stderr


def _agent_runs_without_torch(env_dir: Path, tmp_path: Path) -> None:
    """Not just importable: the agent serves /metrics from a venv with no torch."""
    import time
    import urllib.request

    addr_file = tmp_path / "agent.address"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = subprocess.Popen(
        [
            str(env_dir / "bin" / "watchdog"),
            "agent",
            "--run-dir",
            str(run_dir),
            "--web.listen-address",
            "127.0.0.1:0",
            "--web.address-file",
            str(addr_file),
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        assert proc.stderr is not None
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
