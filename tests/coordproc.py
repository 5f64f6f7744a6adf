"""A real coordinator process on loopback for tests: started, waited for, ended."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def coordinator(tmp: Path, *args: str, name: str = "c") -> Iterator[tuple[str, subprocess.Popen]]:
    """Yields (HOST:PORT, process); SIGTERM, then SIGKILL, on the way out."""
    addr = tmp / f"{name}.addr"
    log = tmp / f"{name}.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "watchdog.cli", "coordinator", "--web.listen-address", "127.0.0.1:0"]
            + ["--web.address-file", str(addr), *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_for(lambda: addr.exists() or proc.poll() is not None, 30.0, "coordinator address file", log=log)
        assert addr.exists(), f"coordinator exited {proc.returncode}: {log.read_text()[-2000:]}"
        yield addr.read_text().strip(), proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
