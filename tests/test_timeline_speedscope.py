"""The folded file from ``watchdog timeline --stacks`` read by a real flame-graph
viewer: speedscope from the npm registry, its own release page in headless
Chromium, loaded the way its CLI loads a file (``#localProfilePath=`` a script
calling ``speedscope.loadFileFromBase64``), shown in its sandwich view, whose
table of frames with totals is plain DOM we can read.

Needs npm with the registry reachable and chromium; skipped with the reason
otherwise. About 5 s."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import headless
import pytest

from watchdog.timeline import main, testing

SPEEDSCOPE = "speedscope@1.25.0"


@pytest.fixture(scope="module")
def speedscope(tmp_path_factory) -> Path:
    if headless.chromium() is None:
        pytest.skip("chromium not installed (.ci/setup installs it)")
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm not installed: cannot fetch speedscope from the npm registry")
    where = tmp_path_factory.mktemp("speedscope")
    try:
        proc = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(where), SPEEDSCOPE],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("npm install speedscope timed out: registry unreachable?")
    page = where / "node_modules" / "speedscope" / "dist" / "release" / "index.html"
    if proc.returncode != 0 or not page.exists():
        pytest.skip(f"npm install {SPEEDSCOPE} failed (registry unreachable?): {proc.stderr.strip()[-300:]}")
    return page


def test_speedscope_imports_the_folded_stacks_with_every_frame_and_count(speedscope, tmp_path):
    journal = testing.hang_journal(tmp_path / "j.jsonl", 64, culprit=5)
    assert main.main([str(journal), "--stacks", str(tmp_path / "out")]) == 0
    [folded] = (tmp_path / "out").iterdir()
    loader = tmp_path / "profile.js"  # what speedscope's own CLI writes
    loader.write_text(
        f"speedscope.loadFileFromBase64({json.dumps(folded.name)}, "
        f"{json.dumps(base64.b64encode(folded.read_bytes()).decode())})"
    )
    url = f"{speedscope.as_uri()}#localProfilePath={loader}&view=sandwich"
    browser = headless.chromium()
    assert browser is not None  # the fixture skipped without one
    proc = subprocess.run(
        [
            browser,
            *headless.FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert "Importing as collapsed stack format" in proc.stderr, proc.stderr[-2000:]
    cells = (
        re.sub(r"(\s*\|\s*)+", " | ", re.sub(r"<[^>]+>", " | ", proc.stdout)).replace("&lt;", "<").replace("&gt;", ">")
    )
    assert f"<title>{folded.name} - speedscope" in proc.stdout
    # Sandwich table rows: total | self | frame. Counts are ranks.
    assert "62 (97%) | 62 (97%) | _engine_run_backward (torch/autograd/graph.py:825)" in cells, cells[:1500]
    assert "1 (1.6%) | 1 (1.6%) | _recv_bytes (multiprocessing/connection.py:430)" in cells
    assert "1 (1.6%) | 1 (1.6%) | _save (torch/serialization.py:1124)" in cells
    assert "64 (100%) | 0 (<0.01%) | <module> (train.py:246)" in cells
