"""The coordinator over real HTTP: in a thread on 127.0.0.1:0, and as the
``watchdog coordinator`` process."""

from __future__ import annotations

import http.client
import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from waiting import wait_for

from watchdog.agent import testing as agent_testing
from watchdog.agent.processes.table import ProcSample
from watchdog.agent.reporting.sender import JsonPoster, Sender
from watchdog.agent.slotfiles import slot_states
from watchdog.agent.slotfiles.local_rank import LocalRank
from watchdog.coordinator import testing as t
from watchdog.coordinator.cli.status import main as status_main
from watchdog.coordinator.config import Config
from watchdog.coordinator.daemon import Daemon
from watchdog.coordinator.intake import server
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "tok-123"
HISTORY = t.steps(1, 50, step_s=0.1)


@pytest.fixture
def daemon(tmp_path, monkeypatch):
    monkeypatch.setattr(server, "BODY_TIMEOUT_S", 0.5)
    cfg = Config(
        listen=("127.0.0.1", 0),
        job="job",
        world_size=8,
        token=TOKEN,
        journal=str(tmp_path / "journal.jsonl"),
        tick_s=0.25,
        max_body_bytes=64 * 1024,
        address_file=str(tmp_path / "addr"),
    )
    d = Daemon(cfg).start()
    yield d
    d.stop()


def post(d, raw: bytes, headers=None, path="/api/v1/report"):
    host, port = d.address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    hdrs = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json", "Content-Length": str(len(raw))}
    hdrs.update(headers or {})
    conn.putrequest("POST", path, skip_accept_encoding=True)
    for k, v in hdrs.items():
        if v is not None:
            conn.putheader(k, v)
    conn.endheaders()
    if raw:
        conn.send(raw)
    resp = conn.getresponse()
    status, body = resp.status, json.loads(resp.read() or b"null")
    conn.close()
    return status, body


def get(d, path, token=TOKEN):
    req = urllib.request.Request(f"http://{d.address}{path}")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def metric(d, name, **labels):
    return d.coordinator.registry.get_sample_value(name, labels)


def report_bytes(states, seq=1, host="host0"):
    # Stamped when sent, as an agent does: the coordinator reads how long reports queued from it.
    return json.dumps(t.report(host, states, seq=seq, sent_wall=time.time()).to_dict()).encode()


def test_address_file_has_the_bound_port(daemon, tmp_path):
    assert (tmp_path / "addr").read_text().strip() == daemon.address
    assert not daemon.address.endswith(":0")


def test_the_start_line_says_which_event_loop_serves(daemon, tmp_path):
    start = next(r for r in journal.read(str(tmp_path / "journal.jsonl")) if r["event"] == je.START)
    assert start["event_loop"] == "uvloop"  # auto, and uvloop is a dependency


def test_good_and_bad_reports_over_http(daemon):
    ok = {"ok": True, "commands": [], "report_versions": [1, 2], "step_summary_config": [2, 128, 50, 20, 4]}
    assert post(daemon, report_bytes([t.rank(r) for r in range(4)])) == (200, ok)
    cases = [
        (b"{not json", {}, 400, "bad_json"),
        (report_bytes([t.rank(0)], seq=2), {"Authorization": "Bearer wrong"}, 401, "unauthorized"),
        (report_bytes([t.rank(0)], seq=2), {"Authorization": None}, 401, "unauthorized"),
        (json.dumps({**t.report("x", []).to_dict(), "v": 3}).encode(), {}, 400, "version"),
        (json.dumps({**t.report("x", []).to_dict(), "v": 2}).encode(), {}, 400, "schema"),  # v2 without field lists
        (json.dumps({"v": 1, "job": "job"}).encode(), {}, 400, "schema"),
        (json.dumps(t.report("x", [], job="other").to_dict()).encode(), {}, 409, "wrong_job"),
        (b"", {"Content-Length": str(10 * 1024 * 1024)}, 413, "too_large"),  # refused before reading
        (b"", {"Content-Length": None}, 411, "no_length"),
        (b"{}", {"Content-Length": "50"}, 408, "timeout"),  # promised more than it sent
    ]
    for raw, headers, status, reason in cases:
        before = metric(daemon, "watchdog_coordinator_reports_rejected_total", reason=reason)
        got, body = post(daemon, raw, headers)
        assert got == status, (reason, body)
        assert isinstance(body["error"], str) and body["error"]
        assert metric(daemon, "watchdog_coordinator_reports_rejected_total", reason=reason) == before + 1, reason
    # Still serving, nothing lost.
    assert post(daemon, report_bytes([t.rank(r) for r in range(4)], seq=2))[0] == 200
    assert metric(daemon, "watchdog_coordinator_reports_received_total") == 2
    assert get(daemon, "/healthz")[0] == 200
    assert post(daemon, b"{}", path="/nope")[0] == 404


def test_an_agent_sends_version_2_once_the_coordinator_says_it_reads_it(daemon):
    """The real sender and poster against the real server: version 1 first, then
    version 2, every report accepted and folded."""

    def view(rank):
        ident = agent_testing.identity("job", rank, 8, pid=100 + rank, proc_start_us=1)
        snap = agent_testing.snapshot(ident, path=f"/run/job.{rank}.slot")
        return LocalRank(snap.path, snap.header, 0, False, ProcSample(True, "running"), slot_states.ALIVE, 0.0, ())

    sent = []
    sender = Sender(
        url=f"http://{daemon.address}",
        token=TOKEN,
        job="job",
        host="h0",
        agent_id="a0",
        interval_s=1.0,
        timeout_s=5.0,
        views=lambda: [view(r) for r in range(4)],
    )
    real_post = sender._post
    assert isinstance(real_post, JsonPoster)

    def post(url, payload, token, timeout):
        sent.append(payload["v"])
        return real_post(url, payload, token, timeout)

    sender._post = post
    try:
        for _ in range(3):
            sender.send_once()
    finally:
        real_post.close()
    assert sent == [1, 2, 2] and (sender.ok, sender.failed) == (3, 0)
    assert sorted(r for r in daemon.coordinator.view.ranks) == [0, 1, 2, 3]
    assert metric(daemon, "watchdog_coordinator_reports_received_total") == 3


def test_status_needs_the_token_and_metrics_do_not(daemon):
    post(daemon, report_bytes([t.rank(r) for r in range(4)]))
    assert get(daemon, "/api/v1/status", token=None)[0] == 401
    status, raw = get(daemon, "/api/v1/status")
    doc = json.loads(raw)
    assert status == 200 and doc["job"] == "job" and doc["world_size"] == 8
    assert [r["health"] for r in doc["ranks"]] == ["ok"] * 4 + ["missing"] * 4
    status, raw = get(daemon, "/metrics", token=None)
    assert status == 200 and b"watchdog_coordinator_reports_received_total 1.0" in raw


def test_hang_reports_end_in_a_journaled_finding_naming_the_culprit(daemon, tmp_path):
    def states(age):
        out = []
        for r in range(8):
            if r == 5:  # stuck in its data loader, never entered all-reduce #812
                out.append(
                    t.rank(
                        r,
                        step=811,
                        step_age_s=age + 0.5,
                        in_data_wait=True,
                        data_wait_age_s=age,
                        collective=t.coll(seq=811, done_seq=811),
                        recent_steps=HISTORY,
                    )
                )
            else:
                out.append(
                    t.rank(
                        r,
                        step=811,
                        step_age_s=age + 0.1,
                        collective=t.coll(seq=812, outstanding=1, since_s=age),
                        recent_steps=HISTORY,
                    )
                )
        return out

    for seq, age in enumerate((11.0, 12.0), start=1):
        for h in (0, 1):
            assert post(daemon, report_bytes(states(age)[4 * h : 4 * h + 4], seq=seq, host=f"host{h}"))[0] == 200
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not metric(
        daemon, "watchdog_coordinator_findings_total", kind="collective_hang"
    ):
        time.sleep(0.05)
    recs = [r for r in journal.read(daemon.cfg.journal) if r["event"] == je.FINDING]
    assert [(r["kind"], r["ranks"], r["hosts"]) for r in recs] == [("collective_hang", [5], ["host1"])]
    assert "rank 5 (host host1, pid 1005) never entered all_reduce #812" in recs[0]["reason"]
    assert recs[0]["t_wall"] > 1e9 and recs[0]["onset_wall"] < recs[0]["detected_wall"]

    out = io.StringIO()
    assert status_main(["--coordinator.url", daemon.address, "--job.token", TOKEN], out=out) == 0
    table = out.getvalue()
    assert "collective_hang" in table and "data" in table and "host1" in table
    lines = [ln for ln in table.splitlines() if ln.startswith("5 ")]
    assert lines and "collective_hang" in lines[0]
    out = io.StringIO()
    assert status_main(["--coordinator.url", f"http://{daemon.address}", "--job.token", TOKEN, "--json"], out=out) == 0
    assert json.loads(out.getvalue())["findings"][0]["kind"] == "collective_hang"


def test_status_cli_errors(daemon, capsys):
    assert status_main(["--coordinator.url", daemon.address]) == 1  # no token: 401
    assert "HTTP 401" in capsys.readouterr().err
    assert status_main(["--coordinator.url", "127.0.0.1:1", "--timeout-seconds", "1"]) == 1
    assert "cannot reach" in capsys.readouterr().err


def run_cli(*args, timeout=30):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATCHDOG_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "watchdog.cli", "coordinator", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def test_refuses_non_loopback_without_token(tmp_path):
    out = run_cli("--web.listen-address", "0.0.0.0:0", "--journal", str(tmp_path / "j"))
    assert out.returncode == 2 and "without a job token" in out.stderr
    assert not (tmp_path / "j").exists()


def test_bad_flag_value_exits_2(tmp_path):
    out = run_cli("--tick.interval-seconds", "-1", "--journal", str(tmp_path / "j"))
    assert out.returncode == 2 and "--tick.interval-seconds" in out.stderr


def test_process_start_report_stop(tmp_path):
    addr = tmp_path / "addr"
    token_file = tmp_path / "token"
    token_file.write_text("secret\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "watchdog.cli",
            "coordinator",
            "--web.listen-address",
            "127.0.0.1:0",
            "--web.address-file",
            str(addr),
            "--job.world-size",
            "2",
            "--journal",
            str(tmp_path / "j.jsonl"),
            "--job.token-file",
            str(token_file),
            "--tick.interval-seconds",
            "0.25",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not addr.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert proc.stderr is not None
        assert addr.exists(), proc.stderr.read() if proc.poll() is not None else "no address file"
        url = f"http://{addr.read_text().strip()}/api/v1/report"
        body = json.dumps(t.report("h", [t.rank(0, world_size=2)]).to_dict()).encode()
        req = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={"Authorization": "Bearer secret", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert json.load(resp) == {
                "ok": True,
                "commands": [],
                "report_versions": [1, 2],
                "step_summary_config": [2, 128, 50, 20, 4],
            }
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    events = [r["event"] for r in journal.read(str(tmp_path / "j.jsonl"))]
    assert events[:2] == [je.START, je.CONFIG] and je.RANK_JOINED in events and events[-1] == je.STOP
    config = next(r for r in journal.read(str(tmp_path / "j.jsonl")) if r["event"] == je.CONFIG)["config"]
    assert config["token"] == "<set>" and "secret" not in json.dumps(config)
    logged = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any(e.get("event") == "config" for e in logged) and "secret" not in err


def test_every_tick_records_its_duration_and_its_own_cpu(daemon):
    """The tick's CPU apart from its duration: under a busy request loop the
    duration is mostly waiting, and an operator must be able to tell the two."""

    def counts():
        m = daemon.coordinator.registry.get_sample_value
        return (
            m("watchdog_coordinator_tick_duration_seconds_count") or 0,
            m("watchdog_coordinator_tick_cpu_seconds_count") or 0,
        )

    wait_for(lambda: counts()[1] >= 2, 10.0, "two ticks")
    ticks, cpu_ticks = counts()
    assert abs(ticks - cpu_ticks) <= 1  # observed together, each tick
    m = daemon.coordinator.registry.get_sample_value
    assert m("watchdog_coordinator_tick_cpu_seconds_sum") <= m("watchdog_coordinator_tick_duration_seconds_sum") + 0.01
