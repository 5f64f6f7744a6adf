"""Another local user on a training host, with write access to the shared run
directory (as the shipped tmpfiles rule gives group rank-watchdog), against real
agent and coordinator processes (docs/hardening.md lists each attack). The other
user is uid 65534: files written here and chowned to it, processes started as it.

The ranks are fake ones writing their slots through the real hook writer
(agent/testing.py), started by a small launcher process of their own, so that an
abort would have a launcher to stop: what is under test is who the monitor lets
speak for a rank, not training."""

from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from waiting import wait_for

import watchdog
from watchdog.agent import testing
from watchdog.contracts import commands
from watchdog.coordinator import testing as ctesting
from watchdog.coordinator.intake.server import REPORT_PATH
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.dev import localjob

pytestmark = pytest.mark.integration

OTHER = 65534  # nobody: another user, no account needed
REPO = str(Path(watchdog.__file__).resolve().parent.parent)
DAY_NS = 86_400 * 1_000_000_000


def metric(url: str, name: str, labels: str = "") -> float:
    text = localjob.http_get(url + "/metrics")
    m = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*{re.escape(labels)}[^}}]*\}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def launcher(run_dir: Path, job: str, env: dict) -> subprocess.Popen:
    """A launcher with two fake ranks as its children (what torchrun is to workers)."""
    code = (
        "import subprocess, sys\n"
        f"ps = [subprocess.Popen([sys.executable, '-m', 'watchdog.agent.testing', '--run-dir', {str(run_dir)!r},"
        f" '--job', {job!r}, '--rank', str(r), '--world-size', '2']) for r in (0, 1)]\n"
        "[p.wait() for p in ps]\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True, stdin=subprocess.DEVNULL)


def slot_files_seen(url: str) -> float:
    text = localjob.http_get(url + "/metrics")
    return sum(float(v) for v in re.findall(r"^watchdog_agent_slots\{[^}]*\} (\S+)$", text, re.M))


def rank_pids(launcher_pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(launcher_pid)], capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def forge_slot(run_dir: Path, job: str, rank: int, pid: int, start_us: int, name: str) -> str:
    """A slot for someone else's rank, created "a day from now", owned by the other user."""
    ident = testing.identity(job, rank, 2, pid=pid, proc_start_us=start_us)
    slot = testing.RankSlot(str(run_dir), ident, wall_ns=time.time_ns() + DAY_NS, name=name)
    slot.heartbeat()
    os.chown(slot.path, OTHER, OTHER)
    return slot.path


def test_another_users_slot_cannot_take_a_rank_page_or_abort_the_job(tmp_path):
    job = "va-" + secrets.token_hex(3)
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(16))
    os.chmod(token, 0o600)
    env = {**os.environ, "WATCHDOG_JOB_TOKEN_FILE": str(token), "PYTHONPATH": REPO}
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[actions]\ndead_rank = "abort"\nfrozen_rank = "abort"\n[limits]\n'
        "min_finding_age_seconds = 0\nabort_grace_seconds = 3\n"
    )
    run_dir, jpath = tmp_path / "run", tmp_path / "journal.jsonl"
    run_dir.mkdir()
    procs: list[localjob.Process] = []
    job_launcher = launcher(run_dir, job, env)
    other_launcher = None
    try:
        coord = localjob.start_coordinator(
            tmp_path, job, 2, jpath, env=env, extra=["--tick.interval-seconds", "0.25", "--policy.file", str(policy)]
        )
        procs.append(coord)
        agent = localjob.start_agent(
            tmp_path, run_dir, job, env=env, extra=["--coordinator.url", coord.url, "--report.interval-seconds", "0.25"]
        )
        procs.append(agent)
        wait_for(lambda: metric(agent.url, "watchdog_agent_slots", 'state="alive"') == 2, 60, "both ranks alive")
        ranks = rank_pids(job_launcher.pid)
        assert len(ranks) == 2

        # 1. rank 0, naming a pid that is not running, created a day ahead.
        gone = subprocess.Popen(["true"])
        gone.wait()
        forge_slot(run_dir, job, 0, gone.pid, int(time.time() * 1e6), "forged-dead.slot")
        # 2. rank 0, naming the other user's own live process, whose parent (the
        # other user's) would be taken for the job's launcher; then that process exits.
        other_launcher = subprocess.Popen(
            ["sh", "-c", "sleep 600 & echo $!; wait; exec sleep 600"],
            user=OTHER,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert other_launcher.stdout is not None
        own = int(other_launcher.stdout.readline())
        forge_slot(run_dir, job, 0, own, testing.identity(pid=own).proc_start_us, "forged-own.slot")

        wait_for(lambda: slot_files_seen(agent.url) == 4, 30, "the agent to see every file", log=agent.log_path)
        subprocess.run(["kill", str(own)], check=True)
        # Give the coordinator time to act on what it sees: 12 reports after the refusals.
        seen = metric(coord.url, "watchdog_coordinator_reports_received_total")
        wait_for(
            lambda: metric(coord.url, "watchdog_coordinator_reports_received_total") >= seen + 12, 30, "12 reports"
        )
        records = journal.read(str(jpath))
        assert not [r for r in records if r["event"] in (je.FINDING, je.ACTION, je.COMMAND)], [
            r for r in records if r["event"] in (je.FINDING, je.ACTION, je.COMMAND)
        ]
        assert job_launcher.poll() is None and all(alive(p) for p in ranks)  # not touched
        assert other_launcher.poll() is None  # the other user's process was not taken for a launcher
        assert metric(agent.url, "watchdog_agent_slots", 'state="alive"') == 2
        assert metric(agent.url, "watchdog_agent_slots", 'state="superseded"') == 0
        assert metric(agent.url, "watchdog_agent_slot_read_errors_total", 'reason="job_owner"') == 2
        log = agent.log()
        assert '"reason": "job_owner"' in log and f'"file_uid": {OTHER}' in log, log[-3000:]
    finally:
        for p in procs:
            p.stop()
        for lp in (job_launcher, other_launcher):
            if lp is not None:
                localjob.Process("launcher", lp, tmp_path / "none.log").stop(group=True)


class ReplayingCoordinator:
    """Answers every report with the commands in ``reply`` (what an attacker who
    captured a signed command and can answer the agent's reports would send)."""

    def __init__(self) -> None:
        self.reports: list[dict] = []
        self.reply: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                outer.reports.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                out = json.dumps({"ok": True, "commands": outer.reply}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


def test_a_signed_command_replayed_after_the_agent_restarted_is_refused(tmp_path):
    token = secrets.token_hex(16)
    env = {**os.environ, "WATCHDOG_JOB_TOKEN": token, "PYTHONPATH": REPO}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    coord = ReplayingCoordinator()
    flags = ["--coordinator.url", coord.url, "--report.interval-seconds", "0.2", "--host.name", "node-r"]
    agent = localjob.start_agent(tmp_path, run_dir, "rp", env=env, extra=flags)
    try:
        first = wait_for(lambda: coord.reports[0] if coord.reports else None, 30, "a report")
        cmd = commands.make(
            job="rp",
            type=commands.SNAPSHOT_SLOTS,
            host="node-r",
            args={"ranks": [commands.target(0, 0, 0)]},
            issued_wall=first["sent_wall"],
            ttl_s=30.0,
        )
        coord.reply = [commands.sign(cmd, token)]
        executed = 'watchdog_agent_commands_executed_total{type="snapshot_slots"'
        wait_for(lambda: executed_total(agent.url) == 1, 30, "the command to run once", log=agent.log_path)
        wait_for(  # the same command in the next reply: refused by the live agent's cache
            lambda: metric(agent.url, "watchdog_agent_commands_refused_total", 'reason="replayed"') > 0, 30, "a replay"
        )
        agent.stop()
        agent = localjob.start_agent(tmp_path, run_dir, "rp", env=env, extra=flags)  # the replay cache is gone
        wait_for(
            lambda: metric(agent.url, "watchdog_agent_commands_refused_total", 'reason="replayed"') > 0,
            30,
            "the replay refused",
            log=agent.log_path,
        )
        assert executed_total(agent.url) == 0, executed
        assert time.time() < cmd["expires_wall"]  # it was still within its expiry
    finally:
        agent.stop()
        coord.close()


def executed_total(url: str) -> float:
    text = localjob.http_get(url + "/metrics")
    return sum(float(v) for v in re.findall(r"^watchdog_agent_commands_executed_total\{[^}]*\} (\S+)$", text, re.M))


def post_report(address: str, job: str, token: str) -> int:
    host, port = address.rsplit(":", 1)
    body = json.dumps(ctesting.report("h9", ctesting.healthy(2), job=job, sent_wall=time.time()).to_dict()).encode()
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(
            "POST", REPORT_PATH, body, {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_scrapes_probes_and_reports_get_through_while_300_idle_sockets_are_held(tmp_path):
    """Sockets opened and never written to: past the agent's cap (256), and past
    the coordinator's descriptor limit (run here under 256 descriptors)."""
    job = "idle-" + secrets.token_hex(3)
    token = secrets.token_hex(16)
    env = {**os.environ, "WATCHDOG_JOB_TOKEN": token, "PYTHONPATH": REPO}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    coord = localjob.start_daemon(
        "coordinator",
        "coordinator",
        ["--job.name", job, "--job.world-size", "2", "--journal", str(tmp_path / "journal.jsonl")],
        tmp_path,
        env,
        prefix=["prlimit", "--nofile=256:256", "--"],
    )
    agent = localjob.start_agent(
        tmp_path, run_dir, job, env=env, extra=["--coordinator.url", coord.url, "--report.interval-seconds", "0.25"]
    )
    held: list[socket.socket] = []
    try:
        for proc in (agent, coord):
            host, port = proc.address.rsplit(":", 1)
            held += [socket.create_connection((host, int(port)), timeout=10) for _ in range(300)]
        for _ in range(3):
            assert get_status(agent.url + "/metrics") == 200
            assert get_status(agent.url + "/healthz") == 200
            assert post_report(coord.address, job, token) == 200
            assert get_status(coord.url + "/metrics") == 200
        assert metric(agent.url, "watchdog_agent_reports_total", 'result="ok"') > 0
    finally:
        for s in held:
            s.close()
        agent.stop()
        coord.stop()


@pytest.mark.parametrize("attack", ["symlink", "foreign"])
def test_the_coordinator_refuses_a_journal_another_user_planted_or_owns(tmp_path, attack):
    target = tmp_path / "root-only"
    target.write_text("root's\n")
    os.chmod(target, 0o600)
    path = tmp_path / "journal.jsonl"
    if attack == "symlink":
        path.symlink_to(target)
        os.lchown(path, OTHER, OTHER)
    else:
        path.write_text('{"event":"state","job_state":"failed"}\n')
        os.chown(path, OTHER, OTHER)
    before = path.read_bytes()
    out = subprocess.run(
        [sys.executable, "-m", "watchdog.cli", "coordinator", "--job.name", "j", "--journal", str(path)],
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1, out
    why = "is a symbolic link" if attack == "symlink" else f"is owned by uid {OTHER}"
    assert f"cannot start: journal {path} {why}" in out.stderr and "refused" in out.stderr, out.stderr
    assert target.read_text() == "root's\n" and path.read_bytes() == before
