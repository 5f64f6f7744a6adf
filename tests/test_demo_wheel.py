"""``watchdog demo`` from an installed wheel, outside a checkout: the example job
ships in the package, so the demo finds and runs it with no source tree around.

A fresh venv gets our wheel alone (--no-deps); its dependencies, torch included,
come from this test environment's site-packages through a .pth file, so the test
needs no network and no second torch install. A path a .pth file adds is not
scanned for .pth files itself, so this checkout's editable install stays out.
Every command runs in an empty directory: '' on sys.path cannot import ./watchdog.
"""

from __future__ import annotations

import stat
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from watchdog.dev import scenario

pytestmark = pytest.mark.integration


def test_demo_runs_from_an_installed_wheel(tmp_path, wheel):
    env_dir, elsewhere = tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = str(env_dir / "bin" / "python")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", str(wheel)], check=True, timeout=120
    )
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (Path(site) / "test-env-deps.pth").write_text("".join(f"{p}\n" for p in ours))
    clean = {"PYTHONPATH": ""}  # nothing may reach the checkout

    with zipfile.ZipFile(wheel) as whl:
        shipped = whl.getinfo("watchdog/dev/examples/train_ddp.py")
    assert not stat.S_ISLNK(shipped.external_attr >> 16) and shipped.file_size > 1000, "the example must be a real file"

    where = subprocess.run(
        [py, "-c", "import watchdog.dev.localjob as j; print(j.EXAMPLE_SCRIPT)"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(env_dir) and Path(where).is_file(), where

    res = scenario.run(
        ["kill:1@5"],
        ranks=2,
        steps=200,
        linger_s=1.0,
        timeout_s=90,
        env=clean,
        work_dir=str(tmp_path / "work"),
        watchdog=[str(env_dir / "bin" / "watchdog")],
        cwd=str(elsewhere),
    )
    first = res.first()
    assert first is not None and (first["kind"], first["ranks"]) == ("dead_rank", [1]), res.output[-2000:]
    assert res.faults and res.faults[0]["kind"] == "kill", "the shipped example did not inject its fault"
    assert "train_ddp.py" in res.output
