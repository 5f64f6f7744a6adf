"""The Slurm examples (deploy/slurm/): static checks, then the scripts run for real on
this machine with stand-ins for `srun` and `scontrol` (one "node", 127.0.0.1):

- train.sbatch with its own agents: a real coordinator, agent and torchrun job start
  from it on ports the kernel picks, the agent reports to the coordinator,
  Prometheus' file_sd targets name the ports bound, and the token and targets are
  removed at the end;
- the site's way: prolog.sh makes the job's run dir (owned by the job's user),
  task-prolog.sh hands it to the tasks, a site-wide agent started before the job
  follows it to its coordinator with the job's own token, and epilog.sh removes the
  slots at the end."""

from __future__ import annotations

import grp
import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "alerts"))
import promcheck

from watchdog.agent import config as agent_config
from watchdog.coordinator import config as coord_config
from watchdog.coordinator.journal import event_names as je
from watchdog.dev import localjob

SBATCH = promcheck.REPO / "deploy" / "slurm" / "train.sbatch"
TEXT = SBATCH.read_text()

SLURM = SBATCH.parent
# srun stand-in: drop srun's own --options, honour --output (%j job id, %N node),
# apply the TaskProlog's exports as slurmd does (FAKE_TASK_PROLOG), run the command
# on this machine.
FAKE_SRUN = r"""#!/bin/bash
out=""
while [[ $# -gt 0 && $1 == --* ]]; do
    case $1 in --output=*) out=${1#--output=} ;; esac
    shift
done
export SLURMD_NODENAME=$SLURM_JOB_NODELIST  # the one "node"
if [ -n "${FAKE_TASK_PROLOG:-}" ]; then
    while read -r word assignment; do
        [ "$word" = export ] && export "$assignment"
    done < <("$FAKE_TASK_PROLOG")
fi
if [ -n "$out" ]; then
    out=${out//%j/$SLURM_JOB_ID}; out=${out//%N/$(hostname -s)}
    exec "$@" >"$out" 2>&1
fi
exec "$@"
"""
FAKE_SCONTROL = """#!/bin/bash
[ "$1 $2" = "show hostnames" ] && tr ',' '\\n' <<< "$3"
"""


@pytest.mark.parametrize("name", ["train.sbatch", "prolog.sh", "task-prolog.sh", "epilog.sh"])
def test_bash_syntax(name: str):
    res = subprocess.run(["bash", "-n", str(SLURM / name)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_no_exclusive_and_ranks_under_watchdog_run():
    """Ports are picked at start, so jobs share nodes; every rank runs under the hook."""
    assert "--exclusive" not in TEXT.replace("no --exclusive", "")
    assert re.search(r'"\$WATCHDOG" run -- torchrun ', TEXT)
    assert "pip install rank-watchdog" in TEXT


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
    bin_dir = stand_ins(tmp_path)
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
        # the ports the daemons bound (port 0): Prometheus finds them there
        (agent_target,) = targets[0]["targets"]
        (coord_target,) = targets[1]["targets"]
        assert agent_target.startswith("127.0.0.1:") and not agent_target.endswith(":0"), agent_target
        assert "watchdog_agent_polls_total" in localjob.http_get(f"http://{agent_target}/metrics")
        assert "watchdog_coordinator" in localjob.http_get(f"http://{coord_target}/metrics")
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


def stand_ins(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_prolog_task_prolog_and_epilog(tmp_path: Path):
    """The job's run dir: made for the job's user (2750, the agents' group), handed to
    the tasks, and removed with the slots at the end; a planted one is replaced."""
    base = tmp_path / "run"
    base.mkdir()
    planted = base / "job-77"
    planted.mkdir()
    (planted / "x.rank0.pid1.slot").write_bytes(b"planted")
    env = dict(
        os.environ,
        SLURM_JOB_ID="77",
        SLURM_JOB_UID=str(os.getuid()),
        WATCHDOG_RUN_BASE=str(base),
        WATCHDOG_GROUP=grp.getgrgid(os.getgid()).gr_name,
    )
    env.pop("WATCHDOG_JOB_NAME", None)
    subprocess.run([str(SLURM / "prolog.sh")], env=env, check=True)
    st = planted.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (os.getuid(), os.getgid(), 0o2750)
    assert list(planted.iterdir()) == [], "what had the job's name before is gone"
    out = subprocess.run([str(SLURM / "task-prolog.sh")], env=env, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [f"export WATCHDOG_RUN_DIR={planted}", "export WATCHDOG_JOB_NAME=slurm-77"]
    named = subprocess.run(
        [str(SLURM / "task-prolog.sh")], env=dict(env, WATCHDOG_JOB_NAME="mine"), capture_output=True, text=True
    ).stdout
    assert named.splitlines() == [f"export WATCHDOG_RUN_DIR={planted}"], "the batch script's job name wins"
    # a node without the agent's directory: nothing prepared, nothing exported, the job still runs
    bare = dict(env, WATCHDOG_RUN_BASE=str(tmp_path / "absent"))
    subprocess.run([str(SLURM / "prolog.sh")], env=bare, check=True)
    assert not (tmp_path / "absent").exists()
    assert subprocess.run([str(SLURM / "task-prolog.sh")], env=bare, capture_output=True, text=True).stdout == ""
    (planted / "job.rank0.pid2.slot").write_bytes(b"slot")
    subprocess.run([str(SLURM / "epilog.sh")], env=env, check=True)
    assert not planted.exists() and base.exists()
    # hostile input: a job id that is not a number is refused, never used in a path
    bad = subprocess.run([str(SLURM / "prolog.sh")], env=dict(env, SLURM_JOB_ID="../x"), capture_output=True, text=True)
    assert bad.returncode != 0 and "must be numbers" in bad.stderr


@pytest.mark.integration
def test_site_agent_prolog_and_sbatch_end_to_end(tmp_path: Path):
    """A node as a site runs it: the Prolog's run dir, one agent started before the
    job (--coordinator.url-from-run-dir, its own token), the sbatch in site mode
    (the coordinator only), the TaskProlog applied to every task, the Epilog."""
    base = tmp_path / "run"
    base.mkdir()
    bin_dir = stand_ins(tmp_path)
    token_dir, work = tmp_path / "tokens", tmp_path / "work"
    work.mkdir()
    venv_bin = Path(sys.executable).parent
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{venv_bin}:{os.environ['PATH']}",
        SLURM_JOB_ID="4243",
        SLURM_JOB_UID=str(os.getuid()),
        SLURM_JOB_NAME="site-test",
        SLURM_JOB_NODELIST="127.0.0.1",
        SLURM_NNODES="1",
        GPUS_PER_NODE="2",
        TRAIN_SCRIPT=str(localjob.EXAMPLE_SCRIPT),
        WATCHDOG_AGENTS="site",
        WATCHDOG_TOKEN_DIR=str(token_dir),
        WATCHDOG_RUN_BASE=str(base),
        WATCHDOG_GROUP=grp.getgrgid(os.getgid()).gr_name,
        FAKE_TASK_PROLOG=str(SLURM / "task-prolog.sh"),
        RDZV_PORT=str(localjob.free_port()),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    for var in ("WATCHDOG_RUN_DIR", "WATCHDOG_JOB_NAME", "WATCHDOG_JOB_TOKEN", "WATCHDOG_JOB_TOKEN_FILE"):
        env.pop(var, None)
    subprocess.run([str(SLURM / "prolog.sh")], env=env, check=True)
    job_dir = base / "job-4243"
    # the site's agent: up before the job, with a site token the job never sees
    agent_env = dict(env, WATCHDOG_JOB_TOKEN="site-token-the-jobs-never-see-000000")
    agent = localjob.start_daemon(
        "site-agent",
        "agent",
        ["--run-dir", str(base), "--coordinator.url-from-run-dir", "true", "--report.interval-seconds", "0.25"],
        tmp_path,
        agent_env,
    )
    try:
        log = open(tmp_path / "sbatch.log", "wb")
        proc = subprocess.Popen(
            ["bash", str(SBATCH), "--steps", "40", "--compute-ms", "40"],
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        try:
            rc = proc.wait(150)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(10)
        out = (tmp_path / "sbatch.log").read_text(errors="replace")
        assert rc == 0 and "done: 40 steps" in out, out[-3000:]
        # the job's files were in its own directory: slots, coordinator, its token (not for every user)
        names = sorted(p.name for p in job_dir.iterdir())
        assert "site-test-4243.coordinator" in names and sum(n.endswith(".slot") for n in names) == 2, names
        assert (job_dir / "site-test-4243.token").stat().st_mode & 0o007 == 0
        journal = work / "watchdog-journal-4243.jsonl"
        records = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
        assert {r.get("rank") for r in records if r["event"] == je.RANK_JOINED} == {0, 1}, records[:8]
        agent_log = agent.log()
        assert '"coordinator found"' in agent_log and '"own_token": true' in agent_log, agent_log[-2000:]
        # never refused (a wrong token is a 401, another job's coordinator a 409); once the
        # job's coordinator stopped, reports fail to connect until the Epilog removes the job
        assert "HTTP 40" not in agent_log, agent_log[-2000:]
    finally:
        agent.stop()
    subprocess.run([str(SLURM / "epilog.sh")], env=env, check=True)
    assert not job_dir.exists(), "the Epilog removes the job's slots"
    assert not (token_dir / "job-4243.token").exists()
