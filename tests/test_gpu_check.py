"""benchmarks/gpu_check.py is the one prepared GPU script: on a machine without a
usable GPU (this one) it must say so and exit 0, never fail or hang."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "gpu_check.py"


def test_gpu_check_skips_cleanly_without_a_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():  # pragma: no cover - a GPU machine runs the real thing
        pytest.skip("a GPU is here: run benchmarks/gpu_check.py itself")
    res = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "no usable CUDA device" in res.stdout and "skipped" in res.stdout
