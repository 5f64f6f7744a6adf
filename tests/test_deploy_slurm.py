"""The Slurm example (deploy/slurm/train.sbatch): static checks, then the script run
for real on this machine with stand-ins for `srun` and `scontrol` (one "node",
127.0.0.1): a real coordinator, agent and torchrun job start from it, the agent
reports to the coordinator, Prometheus' file_sd targets appear and the token and
targets are removed at the end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "alerts"))
import promcheck

from watchdog.agent import config as agent_config
from watchdog.coordinator import config as coord_config
from watchdog.coordinator import journal_events as je
from watchdog.dev import localjob

SBATCH = promcheck.REPO / "deploy" / "slurm" / "train.sbatch"
TEXT = SBATCH.read_text()

# srun stand-in: drop srun's own --options, honour --output (%j job id, %N node),
# run the command on this machine.
FAKE_SRUN = r"""#!/bin/bash
out=""
while [[ $# -gt 0 && $1 == --* ]]; do
    case $1 in --output=*) out=${1#--output=} ;; esac
    shift
done
if [ -n "$out" ]; then
    out=${out//%j/$SLURM_JOB_ID}; out=${out//%N/$(hostname -s)}
    exec "$@" >"$out" 2>&1
fi
exec "$@"
"""
FAKE_SCONTROL = """#!/bin/bash
[ "$1 $2" = "show hostnames" ] && tr ',' '\\n' <<< "$3"
"""


def test_bash_syntax():
    res = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_daemon_flags_exist_and_no_token_on_a_command_line():
    agent_flags = {f"--{f.name}" for f in agent_config.FLAGS}
    coord_flags = {f"--{f.name}" for f in coord_config.FLAGS}
    coord_call = TEXT[TEXT.index('"$WATCHDOG" coordinator') :].split("&\n")[0]
    agent_call = TEXT[TEXT.index('exec "$0" agent') :].split("&\n")[0]
    used_coord = set(re.findall(r"(--[a-z][a-z.-]+)", coord_call))
    used_agent = set(re.findall(r"(--[a-z][a-z.-]+)", agent_call.split("' ")[0]))
    assert used_coord and used_coord <= coord_flags, used_coord - coord_flags
    assert used_agent and used_agent <= agent_flags, used_agent - agent_flags
    assert not re.search(r"--job\.token(?!-file)", TEXT)
    assert "export WATCHDOG_JOB_TOKEN_FILE=" in TEXT and "umask 077" in TEXT


@pytest.mark.integration
def test_runs_end_to_end_with_stand_ins(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    sd_dir, token_dir, work = tmp_path / "sd", tmp_path / "tokens", tmp_path / "work"
    sd_dir.mkdir()
    work.mkdir()
    venv_bin = Path(sys.executable).parent
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{venv_bin}:{os.environ['PATH']}",
        SLURM_JOB_ID="4242",
        SLURM_JOB_NAME="sbatch-test",
        SLURM_JOB_NODELIST="127.0.0.1",
        SLURM_NNODES="1",
        GPUS_PER_NODE="2",
        TRAIN_SCRIPT=str(localjob.EXAMPLE_SCRIPT),
        WATCHDOG_SD_DIR=str(sd_dir),
        WATCHDOG_TOKEN_DIR=str(token_dir),
        WATCHDOG_RUN_DIR=str(tmp_path / "run"),
        WATCHDOG_AGENT_PORT=str(localjob.free_port()),
        WATCHDOG_COORD_PORT=str(localjob.free_port()),
        RDZV_PORT=str(localjob.free_port()),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    log = open(tmp_path / "sbatch.log", "wb")
    proc = subprocess.Popen(
        ["bash", str(SBATCH), "--steps", "60", "--compute-ms", "40"],
        cwd=work,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        sd_file = sd_dir / "4242.json"
        deadline = time.monotonic() + 60
        while not sd_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        targets = json.loads(sd_file.read_text())
        assert {t["labels"]["watchdog_component"] for t in targets} == {"agent", "coordinator"}
        assert targets[0]["targets"] == [f"127.0.0.1:{env['WATCHDOG_AGENT_PORT']}"]
        token = token_dir / "job-4242.token"
        assert token.exists() and token.stat().st_mode & 0o077 == 0, "the token file must be private"
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(10)
    out = (tmp_path / "sbatch.log").read_text(errors="replace")
    assert rc == 0, out[-3000:]
    assert "done: 60 steps" in out, out[-3000:]
    # The agent reported both ranks to the coordinator, which journaled them.
    journal = work / "watchdog-journal-4242.jsonl"
    records = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    start = next(r for r in records if r["event"] == je.START)
    assert start["job"] == "sbatch-test-4242" and start["world_size"] == 2, start
    assert any(r["event"] == je.HOST_SEEN for r in records), records[:5]
    joined = {r.get("rank") for r in records if r["event"] == je.RANK_JOINED}
    assert joined == {0, 1}, [r for r in records if r["event"] == je.RANK_JOINED]
    coord_log = (work / "watchdog-coordinator-4242.log").read_text()
    assert "refusing" not in coord_log, coord_log[-2000:]
    # Cleaned up: no token, no scrape targets left behind.
    assert not token.exists() and not sd_file.exists()
