"""The scale benchmark's path stays working: a real coordinator process under
a few simulated agents speaking the real protocol finds the frozen rank, and
only it, and prints the table; so does the replay of reports made first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]


def _run(*flags: str) -> tuple[subprocess.CompletedProcess, dict]:
    """scale.py at 32 ranks (4 simulated hosts) with ``flags``: the process and its one row."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--ranks", "32", "--core", "-1", "--json", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 1, out.stdout + out.stderr
    row = rows[0]
    assert row["culprit_ok"] and row["false"] == 0 and row["errors"] == 0, row
    assert row["hang_s"] is not None and row["hang_s"] < 15
    return out, row


def test_scale_benchmark_at_small_n():
    out, row = _run("--procs", "1", "--steady-seconds", "8", "--after-seconds", "9")
    assert row["reports_per_s"] > 0 and row["bytes_per_report"] > 0 and row["metrics_kb"] > 0
    # No client_python *_created series beside the counters: at 16,384 ranks they were a third of the series.
    assert row["series"] > 0 and row["created_series"] == 0, row
    assert "rep p99 ms" in out.stdout and out.returncode == 0


def test_scale_replay_at_small_n():
    """The replay (reports made first, sent on time) drives the same coordinator to
    the same findings, and checks itself: every report went on time and every reply
    in the steady window was the one its reports were made on."""
    out, row = _run("--procs", "2", "--steady-seconds", "4", "--after-seconds", "8", "--replay")
    made, size, _ = row["made"]
    assert made >= 4 * 14 and size > made * 1000, row  # 4 hosts, ~16 s each, a report a second
    assert row["reports_per_s"] == 4 and row["unlike"] == 0 and row["late_p99_ms"] < 1000, row
    assert "# 32 ranks:" in out.stdout and out.returncode == 0
