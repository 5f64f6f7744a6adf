"""Unauthenticated clients against both HTTP servers (issue #14, "network"): a
connection cap, a total deadline per request, a legitimate report served while
200 slow clients hold sockets, no spinning accept loop at the descriptor limit,
disconnects counted and logged once instead of a traceback each, and the agent's
listen backlog. Real sockets on 127.0.0.1; waits are generous (wait_for), no
tight timing asserts."""

from __future__ import annotations

import errno
import http.client
import json
import socket
import subprocess
import sys
import threading
import time

import pytest
from prometheus_client import CollectorRegistry
from waiting import wait_for

from watchdog import httpguard
from watchdog.agent.server import Server as AgentServer
from watchdog.coordinator import event_loops
from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config
from watchdog.coordinator.intake import server
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.service import Coordinator

TOKEN = "a-token-of-32-characters-or-so!!"


@pytest.fixture(params=event_loops.CHOICES[1:])
def coord_server(tmp_path, request):
    """The coordinator's server on each event loop it can run (uvloop is a dependency: never skipped)."""
    made = []

    def make(**kw):
        c = Coordinator(
            Config(job="job", token=TOKEN, journal=str(tmp_path / "j.jsonl")),
            Journal(str(tmp_path / "j.jsonl"), lambda: (time.time(), time.monotonic())),
        )
        srv = server.make_server("127.0.0.1", 0, c, TOKEN, 1 << 20, event_loop=request.param, **kw)
        th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        th.start()
        made.append((srv, th, c))
        return srv

    yield make
    for srv, th, c in made:
        srv.shutdown()
        srv.server_close()
        th.join(5)
        c.journal.close()


def report_body() -> bytes:
    return json.dumps(t.report("a", t.healthy()).to_dict()).encode()


def post_report(srv, timeout=30.0):
    host, port = srv.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    raw = report_body()
    conn.request(
        "POST", server.REPORT_PATH, raw, {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    status = resp.status
    resp.read()
    conn.close()
    return status


def slow_client(srv, first=b"POST /api/v1/report HTTP/1.1\r\nHost: x\r\n"):
    s = socket.create_connection(srv.server_address[:2], timeout=30)
    s.sendall(first)
    return s


def closed_by_server(s, within_s=30.0) -> bool:
    s.settimeout(within_s)
    try:
        while True:
            data = s.recv(4096)
            if not data:
                return True
            if b" 503 " in data or b" 408 " in data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_a_trickling_client_is_cut_at_the_request_deadline(coord_server):
    """The per-read timeout alone let a client sending a byte every few seconds
    hold its thread for ever."""
    srv = coord_server(request_deadline_s=1.0)
    s = slow_client(srv)
    stop = threading.Event()

    def trickle():  # one header byte every 0.2 s: every single read is quick
        try:
            while not stop.wait(0.2):
                s.sendall(b"X")
        except OSError:
            pass

    th = threading.Thread(target=trickle, daemon=True)
    th.start()
    try:
        assert closed_by_server(s, within_s=20.0), "still connected long after the request deadline"
        assert wait_for(lambda: srv.deadline_closed >= 1, timeout_s=10)
    finally:
        stop.set()
        th.join(5)
        s.close()


def test_connections_beyond_the_cap_are_refused(coord_server):
    srv = coord_server(max_connections=10)
    held = [slow_client(srv) for _ in range(10)]
    try:
        assert wait_for(lambda: srv.connections >= 10, timeout_s=10)
        extra = [slow_client(srv, first=b"") for _ in range(5)]
        assert all(closed_by_server(s, within_s=20.0) for s in extra)
        assert srv.refused_busy >= 5
        for s in extra:
            s.close()
    finally:
        for s in held:
            s.close()
    assert wait_for(lambda: _served(srv), timeout_s=30)  # capacity comes back once they leave


def _served(srv) -> bool:
    try:
        return post_report(srv, timeout=5) == 200
    except OSError:
        return False


def test_a_report_is_served_while_200_slow_clients_hold_sockets(coord_server):
    srv = coord_server()
    held = [slow_client(srv) for _ in range(200)]
    try:
        assert post_report(srv) == 200
    finally:
        for s in held:
            s.close()


# The coordinator in a process of its own with 64 descriptors: the test's
# connections use them up, accept fails with EMFILE, and the server must pause
# (asyncio stops accepting for a second) rather than retry at once for ever.
_OUT_OF_FDS_SERVER = """
import resource, sys, threading, time
from watchdog.coordinator.intake import server
from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.service import Coordinator
journal = sys.argv[1]
c = Coordinator(Config(job="job", journal=journal), Journal(journal, lambda: (time.time(), time.monotonic())))
srv = server.make_server("127.0.0.1", 0, c, "", 1 << 20, event_loop=sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
threading.Thread(target=srv.serve_forever, daemon=True).start()
print("PORT", srv.server_address[1], flush=True)
sys.stdin.readline()  # the test holds its connections, then says go
time.sleep(3.0)
print("COUNTS", srv.accept_errors, srv.connections, flush=True)
sys.stdin.readline()
srv.shutdown()
"""


def _line(proc, tag: str) -> list[str]:
    """The fields of the child's next line starting with ``tag`` (its log lines go to stdout too)."""
    for line in proc.stdout:
        if line.startswith(tag + " "):
            return line.split()[1:]
    raise AssertionError(f"the server exited before printing {tag} (rc {proc.poll()})")


@pytest.mark.integration
@pytest.mark.parametrize("loop", event_loops.CHOICES[1:])
def test_the_accept_loop_pauses_instead_of_spinning_when_out_of_descriptors(tmp_path, loop):
    proc = subprocess.Popen(
        [sys.executable, "-c", _OUT_OF_FDS_SERVER, str(tmp_path / "j.jsonl"), loop],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    held: list[socket.socket] = []
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port = int(_line(proc, "PORT")[0])
        for _ in range(100):  # more than its descriptors: the kernel queues the rest in the backlog
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        proc.stdin.write("go\n")
        proc.stdin.flush()
        errors, open_now = map(int, _line(proc, "COUNTS"))
        # One failed accept per pause (0.1 s): 30 in 3 s, not a retry per wake-up (asyncio: hundreds).
        assert 1 <= errors <= 60, errors
        assert 0 < open_now < 64
        proc.stdin.write("end\n")
        proc.stdin.flush()
        proc.wait(timeout=30)
    finally:
        for s in held:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_client_disconnects_are_counted_and_logged_once_not_printed(coord_server, capsys):
    srv = coord_server()
    for _ in range(100):
        srv.note_client_error(ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), "203.0.113.9")
    err = capsys.readouterr()
    assert "Traceback" not in err.err and "Traceback" not in err.out
    assert srv.client_errors == 100
    assert (err.err + err.out).count("client disconnected mid-request") == 1


def test_a_real_reset_mid_reply_prints_no_traceback(coord_server, capfd):
    srv = coord_server()
    for _ in range(20):  # ask for /metrics and reset the connection without reading the reply
        s = socket.create_connection(srv.server_address[:2], timeout=10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 50)
        s.close()
    assert post_report(srv) == 200
    time.sleep(0.5)
    assert "Traceback" not in capfd.readouterr().err


def test_the_agent_listens_with_the_coordinators_backlog_and_serves_100_scrapes_at_once():
    srv = AgentServer(("127.0.0.1", 0), CollectorRegistry())
    srv.start()
    try:
        assert srv._httpd.request_queue_size >= 128  # the stdlib default is 5
        host, port = srv.address.rsplit(":", 1)
        results: list[int] = []
        lock = threading.Lock()

        def scrape():
            try:
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                conn.request("GET", "/metrics")
                status = conn.getresponse().status
                conn.close()
            except OSError:
                status = 0
            with lock:
                results.append(status)

        threads = [threading.Thread(target=scrape) for _ in range(100)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert results.count(200) == 100
    finally:
        srv.stop()


def idle_client(address) -> socket.socket:
    """Connected, never a byte sent: a held socket."""
    return socket.create_connection(address[:2], timeout=30)


def test_a_connection_that_never_sends_a_byte_is_closed_at_the_request_deadline(coord_server):
    srv = coord_server(request_deadline_s=1.0)
    s = idle_client(srv.server_address)
    try:
        assert closed_by_server(s, within_s=20.0), "an idle socket held past the deadline from its accept"
        assert wait_for(lambda: srv.deadline_closed >= 1, timeout_s=10)
    finally:
        s.close()


def test_at_the_cap_a_new_client_takes_the_place_of_a_silent_socket_not_of_a_request(coord_server):
    srv = coord_server(max_connections=10)
    busy = [slow_client(srv) for _ in range(5)]  # inside a request: never evicted
    idle = [idle_client(srv.server_address) for _ in range(5)]
    try:
        assert wait_for(lambda: srv.connections >= 10, timeout_s=10)
        assert post_report(srv, timeout=10) == 200
        assert srv.evicted_idle >= 1 and srv.refused_busy == 0
        assert not any(closed_by_server(s, within_s=0.2) for s in busy)
    finally:
        for s in busy + idle:
            s.close()


def test_the_agents_scrapes_and_probes_get_through_past_its_cap_of_silent_sockets():
    registry = CollectorRegistry()
    srv = AgentServer(("127.0.0.1", 0), registry)
    srv.start()
    host, port = srv.address.rsplit(":", 1)
    held = [idle_client((host, int(port))) for _ in range(httpguard.MAX_CONNECTIONS + 44)]
    try:
        for path in ("/metrics", "/healthz", "/metrics"):
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            conn.request("GET", path)
            assert conn.getresponse().status == 200
            conn.close()
    finally:
        for s in held:
            s.close()
        srv.stop()


_FIT = """
import resource, sys
from watchdog import httpguard
soft, hard = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
cap = httpguard.fit_fd_limit(8192)
print(cap, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


@pytest.mark.parametrize(
    "soft, hard, cap, soft_after",
    [
        (1024, 20000, 8192, 8192 + httpguard.RESERVE_FDS),  # raised to hold the cap
        (1024, 4096, 4096 - httpguard.RESERVE_FDS, 4096),  # the hard limit is lower: the cap fits it
        (200, 200, 16, 200),  # never below a usable few
    ],
)
def test_the_descriptor_limit_is_raised_for_the_cap_or_the_cap_lowered_to_fit(soft, hard, cap, soft_after):
    out = subprocess.run(
        [sys.executable, "-c", _FIT, str(soft), str(hard)], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == [str(cap), str(soft_after)], out.stderr
