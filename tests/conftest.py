"""Fixtures shared by several test modules."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """Our wheel, built once per session from this checkout's files: what users install.

    Built from a copy of the files git knows (edits included), not in place:
    setuptools reuses ./build/lib, where a module deleted since an earlier build
    lingers and would ship in the wheel."""
    src = tmp_path_factory.mktemp("src")
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, listed):
        path = ROOT / rel
        if path.is_symlink() or path.is_file():  # a file deleted but not yet staged is still listed
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / rel, follow_symlinks=False)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        check=True,
        timeout=300,
    )
    (whl,) = out.glob("rank_watchdog-*.whl")
    return whl
