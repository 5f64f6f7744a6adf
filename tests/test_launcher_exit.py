"""The launcher's exit told to the coordinator by ``watchdog run`` (launcherexit.py):
the handler refuses bad input with a clear 4xx and a counter, and accepts the word
into the view and the journal; ``watchdog run`` waits for its command, posts how it
ended and ends the same way (a real ``watchdog run`` process, a capturing server)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from watchdog import jobtoken, launcherexit
from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config
from watchdog.coordinator.intake.api import ReportHandler
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal.jsonl import Journal, iter_records
from watchdog.coordinator.service import Coordinator
from watchdog.hook.zero_code import run_cli

TOKEN = "s3cret-token-for-the-launcher"
AUTH = {"Authorization": f"Bearer {jobtoken.bearer(TOKEN)}"}


@pytest.fixture
def coord(tmp_path):
    path = str(tmp_path / "j.jsonl")
    c = Coordinator(Config(job="job", token=TOKEN, journal=path), Journal(path, lambda: (time.time(), 0.0)))
    yield c
    c.journal.close()


def _msg(**kw) -> bytes:
    return json.dumps({"v": 1, "job": "job", "host": "hostb", "pid": 4242, "status": 1, **kw}).encode()


def test_an_exit_is_journaled_and_becomes_the_hosts_evidence(coord):
    handler = ReportHandler(coord, TOKEN)
    assert handler.handle_launcher_exit(AUTH, _msg(host="nowhere"), 9.0)[0] == 200  # journaled, nothing to tell
    coord.accept(t.report("hostb", [t.rank(0)]), 9.5)
    status, reply, _ = handler.handle_launcher_exit(AUTH, _msg(), 10.0)
    assert (status, reply) == (200, {"ok": True})
    assert list(coord.view_at(10.0).launcher_exits) == ["hostb"]  # only hosts that reported are kept
    ex = coord.view_at(10.0).launcher_exits["hostb"]
    assert (ex.pid, ex.status, ex.at) == (4242, 1, 10.0)
    coord.journal.close()
    recs = [r for r in iter_records(coord.journal.path) if r["event"] == je.LAUNCHER_EXITED]
    assert [(r["host"], r["pid"], r["status"]) for r in recs] == [("nowhere", 4242, 1), ("hostb", 4242, 1)]


@pytest.mark.parametrize(
    "headers,body,status,reason",
    [
        ({}, _msg(), 401, "unauthorized"),
        (AUTH, b"{not json", 400, "bad_json"),
        (AUTH, b"[]", 400, "schema"),
        (AUTH, _msg(v=2), 400, "schema"),
        (AUTH, _msg(v=True), 400, "schema"),
        (AUTH, _msg(pid=0), 400, "schema"),
        (AUTH, _msg(pid="4242"), 400, "schema"),
        (AUTH, _msg(status=256), 400, "schema"),
        (AUTH, _msg(status=1.0), 400, "schema"),
        (AUTH, _msg(host=""), 400, "schema"),
        (AUTH, _msg(host="h" * 300), 400, "schema"),
        (AUTH, _msg(job="another"), 409, "wrong_job"),
    ],
)
def test_bad_input_is_refused_and_counted(coord, headers, body, status, reason):
    got, reply, why = ReportHandler(coord, TOKEN).handle_launcher_exit(headers, body, 10.0)
    assert (got, why) == (status, reason) and reply["error"]
    assert coord.registry.get_sample_value("watchdog_coordinator_reports_rejected_total", {"reason": reason}) == 1
    assert coord.view_at(10.0).launcher_exits == {}


class _Capture(BaseHTTPRequestHandler):
    got: ClassVar[list] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.got.append((self.path, self.headers.get("Authorization"), json.loads(body)))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"ok":true}')

    def log_message(self, *args):
        pass


@pytest.fixture
def capture():
    _Capture.got = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Capture.got
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("script,rc,status", [("exit 3", 3, 3), ("exit 0", 0, 0), ("kill -9 $$", -9, -9)])
def test_watchdog_run_tells_the_coordinator_how_its_command_ended_and_ends_the_same_way(
    tmp_path, capture, script, rc, status
):
    url, got = capture
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    env = {
        **os.environ,
        run_cli.COORDINATOR_URL_ENV: url,
        "WATCHDOG_JOB_NAME": "job",
        "WATCHDOG_HOST_NAME": "hostb",
        "WATCHDOG_JOB_TOKEN_FILE": str(token),
    }
    argv = [sys.executable, "-m", "watchdog.cli", "run", "--", "sh", "-c", f"echo $WATCHDOG_RUN_PID; {script}"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == rc, proc.stderr
    ((path, auth, msg),) = got
    assert path == launcherexit.PATH and auth == f"Bearer {jobtoken.bearer(TOKEN)}"
    assert launcherexit.parse(msg) == launcherexit.Exit("job", "hostb", int(proc.stdout.split()[0]), status)


def test_without_a_coordinator_url_watchdog_run_execs_and_tells_nobody(capture):
    _, got = capture
    env = {k: v for k, v in os.environ.items() if k != run_cli.COORDINATOR_URL_ENV}
    argv = [sys.executable, "-m", "watchdog.cli", "run", "--", "sh", "-c", "echo $$ $WATCHDOG_RUN_PID; exit 4"]
    proc = subprocess.run(argv, env={**env, "WATCHDOG_JOB_NAME": "job"}, capture_output=True, text=True, timeout=60)
    shell, root = proc.stdout.split()
    assert proc.returncode == 4 and shell == root and got == []  # the command is the process itself


def test_watchdog_run_passes_sigterm_on_to_its_command(tmp_path, capture):
    """A scheduler's (or kubelet's) SIGTERM to ``watchdog run`` reaches the launcher."""
    url, got = capture
    env = {**os.environ, run_cli.COORDINATOR_URL_ENV: url, "WATCHDOG_JOB_NAME": "job", "WATCHDOG_HOST_NAME": "h"}
    script = "trap 'exit 7' TERM; echo ready; while :; do sleep 0.05; done"
    argv = [sys.executable, "-m", "watchdog.cli", "run", "--", "sh", "-c", script]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 7
    finally:
        proc.kill()
        proc.wait(10)
    assert [launcherexit.parse(m).status for _, _, m in got] == [7]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["v", "job", "host", "pid", "status", "extra"]), value=_JSON, raw=st.binary(max_size=64))
def test_fuzz_any_body_is_accepted_or_cleanly_refused(coord, key, value, raw):
    handler = ReportHandler(coord, TOKEN)
    for body in (raw, json.dumps({**json.loads(_msg()), key: value}).encode()):
        status, reply, reason = handler.handle_launcher_exit(AUTH, body, 10.0)
        assert status in (200, 400, 409) and (status == 200 or reason in ("bad_json", "schema", "wrong_job")), reply
