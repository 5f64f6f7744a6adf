"""The real agent process with a FIFO named like a slot in its run dir from the
start (issue #14): before the fix it blocked opening it, before /healthz ever
answered, and deleting the FIFO did not help."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from waiting import wait_for

import watchdog

pytestmark = pytest.mark.integration

REPO = str(Path(watchdog.__file__).resolve().parent.parent)


def env():
    e = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
    e.pop("WATCHDOG_JOB_NAME", None)
    return e


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except OSError:
        return 0, ""


def test_a_fifo_in_the_run_dir_at_start_does_not_hang_the_agent(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "evil.rank0.pid1.slot")
    writer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "watchdog.agent.testing",
            "--run-dir",
            str(run),
            "--job",
            "fifo",
            "--rank",
            "0",
            "--world-size",
            "1",
            "--step-seconds",
            "0.1",
        ],
        env=env(),
    )
    addr_file, log_file = tmp_path / "agent.address", tmp_path / "agent.log"
    with open(log_file, "wb") as log:
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "watchdog.cli",
                "agent",
                "--run-dir",
                str(run),
                "--web.listen-address",
                "127.0.0.1:0",
                "--web.address-file",
                str(addr_file),
                "--collector.accelerator",
                "false",
            ],
            env=env(),
            stdout=log,
            stderr=log,
        )
    try:
        addr = wait_for(
            lambda: addr_file.exists() and addr_file.read_text().strip(), 60, "the agent's address", log=log_file
        )
        url = f"http://{addr}"
        wait_for(lambda: get(url + "/healthz")[0] == 200, 60, "/healthz", log=log_file)
        # The poll loop runs: the real rank is exported and the FIFO counted as a bad file.
        wait_for(
            lambda: (
                "watchdog_rank_alive{" in get(url + "/metrics")[1] and 'training_job="fifo"' in get(url + "/metrics")[1]
            ),
            60,
            "the real rank exported",
            log=log_file,
        )
        text = get(url + "/metrics")[1]
        assert 'watchdog_agent_slot_read_errors_total{reason="type"} 1.0' in text
    finally:
        for p in (writer, agent):
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait(30)
        fd = os.open(run / "evil.rank0.pid1.slot", os.O_RDWR | os.O_NONBLOCK)  # frees a reader stuck on it
        os.close(fd)
