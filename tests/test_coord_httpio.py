"""The coordinator's HTTP server (``httpio``) on real sockets: requests however
they are cut into segments, pipelined, HEAD, the error replies, the idle and
write limits. The guards against hostile clients are in test_http_guard.py."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time

import pytest
from waiting import wait_for

from watchdog.coordinator import event_loops
from watchdog.coordinator.intake import httpio
from watchdog.coordinator.intake.httpio import LoopServer, Request, Response

BIG = b"m" * (8 << 20)  # more than a socket's buffers hold: a client that does not read fills them


@pytest.fixture(params=event_loops.CHOICES[1:])
def serve(request):
    """A server on each event loop the coordinator can run (uvloop is a dependency: never skipped)."""
    made = []

    def make(body_timeout_s: float = 10.0, **kw):
        seen: list[tuple[str, str, bytes]] = []

        def post(req: Request, body: bytes) -> Response:
            seen.append((req.method, req.path, body))
            return Response(200, b'{"got":%d}' % len(body))

        def get(req: Request) -> Response:
            seen.append((req.method, req.path, b""))
            if req.path == "/stall":  # the loop held, as a long tick's share of the interpreter holds it
                time.sleep(1.5)
            if req.path == "/loop":  # which loop runs the handlers: uvloop.Loop or asyncio's
                return Response(200, type(asyncio.get_running_loop()).__module__.split(".")[0].encode(), "text/plain")
            return Response(200, BIG if req.path == "/big" else b"hello", "text/plain")

        def check_post(req: Request) -> Response | None:
            if "content-length" not in req.headers:
                return Response(411, b'{"error":"length"}', close=True)
            return None

        srv = LoopServer(
            ("127.0.0.1", 0),
            socket.AF_INET,
            check_post=check_post,
            post=post,
            get=get,
            on_body_error=lambda req, got: Response(
                408 if got is None else 400, b'{"error":"body %s of %d"}' % (str(got).encode(), req.length), close=True
            ),
            body_timeout_s=lambda: body_timeout_s,
            event_loop=request.param,
            **kw,
        )
        th = threading.Thread(target=srv.serve_forever, daemon=True)
        th.start()
        made.append((srv, th))
        return srv, seen

    yield make
    for srv, th in made:
        srv.shutdown()
        srv.server_close()
        th.join(5)


def connect(srv) -> socket.socket:
    return socket.create_connection(srv.server_address[:2], timeout=10)


def replies(s: socket.socket, n: int) -> list[tuple[int, bytes]]:
    """The next ``n`` replies on ``s``: (status, body)."""
    out: list[tuple[int, bytes]] = []
    buf = b""
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            assert chunk, f"closed after {len(out)} replies"
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        length = next(int(v) for k, _, v in (x.partition(":") for x in lines[1:]) if k.lower() == "content-length")
        while len(buf) < length:
            chunk = s.recv(65536)
            assert chunk
            buf += chunk
        out.append((int(lines[0].split()[1]), buf[:length]))
        buf = buf[length:]
    return out


def closed(s: socket.socket, within_s: float = 10.0) -> bool:
    s.settimeout(within_s)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def post(body: bytes, extra: str = "") -> bytes:
    return b"POST /r HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n" % (len(body), extra.encode()) + body


def test_the_server_runs_on_the_event_loop_asked_for(serve, request):
    srv, _ = serve()
    asked = request.node.callspec.params["serve"]
    assert srv.event_loop == asked
    with connect(srv) as s:
        s.sendall(b"GET /loop HTTP/1.1\r\nHost: x\r\n\r\n")
        assert replies(s, 1) == [(200, asked.encode())]


def test_auto_is_uvloop_where_it_is_installed_and_asyncio_where_not(monkeypatch):
    assert event_loops.resolved("auto") == "uvloop"  # a dependency of the package
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed: its import fails
    assert event_loops.resolved("auto") == "asyncio"
    with pytest.raises(ValueError, match="uvloop is not installed"):
        event_loops.parse("uvloop")
    with pytest.raises(ValueError, match="must be one of auto, asyncio, uvloop"):
        event_loops.parse("trio")


def test_a_request_cut_into_single_bytes_is_served_whole(serve):
    srv, seen = serve()
    with connect(srv) as s:
        for b in post(b'{"a":1}'):
            s.sendall(bytes([b]))
        assert replies(s, 1) == [(200, b'{"got":7}')]
    assert seen == [("POST", "/r", b'{"a":1}')]


def test_pipelined_requests_are_answered_in_order_on_one_connection(serve):
    srv, seen = serve()
    with connect(srv) as s:
        s.sendall(post(b"1") + b"GET /g HTTP/1.1\r\nHost: x\r\n\r\n" + post(b"333"))
        assert replies(s, 3) == [(200, b'{"got":1}'), (200, b"hello"), (200, b'{"got":3}')]
        s.sendall(post(b""))  # and the connection is kept for the next one
        assert replies(s, 1) == [(200, b'{"got":0}')]
    assert [m for m, _, _ in seen] == ["POST", "GET", "POST", "POST"]


def test_head_gets_the_headers_only(serve):
    srv, _ = serve()
    with connect(srv) as s:
        s.sendall(b"HEAD /g HTTP/1.1\r\nHost: x\r\n\r\nGET /g HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(10)
        data = b""
        while data.count(b"\r\n\r\n") < 2 or not data.endswith(b"hello"):
            data += s.recv(65536)
        head_reply, get_reply = data.split(b"HTTP/1.1 200", 2)[1:]
        assert b"Content-Length: 5" in head_reply and not head_reply.rstrip().endswith(b"hello")
        assert get_reply.endswith(b"hello")


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / SPDY/3\r\n\r\n", 400),
        (b"GET /g HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"DELETE /g HTTP/1.1\r\nHost: x\r\n\r\n", 501),
        (b"POST /r HTTP/1.1\r\nHost: x\r\n\r\n", 411),  # the caller's check, before any body is read
        (b"GET /g HTTP/1.1\r\nX: " + b"a" * (httpio.HEADER_LIMIT + 10), 431),  # no end of head in sight
    ],
)
def test_bad_requests_get_their_error_and_the_connection_closes(serve, raw, status):
    srv, seen = serve()
    with connect(srv) as s:
        s.sendall(raw + post(b"never read"))  # what follows a refused request is not served
        assert replies(s, 1)[0][0] == status
        assert closed(s)
    assert ("POST", "/r", b"never read") not in seen


def test_connection_close_and_http_1_0_close_after_the_reply(serve):
    srv, _ = serve()
    for raw in (post(b"x", "Connection: close\r\n"), b"GET /g HTTP/1.0\r\n\r\n"):
        with connect(srv) as s:
            s.sendall(raw)
            assert replies(s, 1)[0][0] == 200
            assert closed(s)


def test_a_body_that_ends_early_or_never_comes(serve):
    srv, _ = serve(body_timeout_s=0.3)
    with connect(srv) as s:  # the client half-closes after 3 of 10 bytes
        s.sendall(b"POST /r HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        s.shutdown(socket.SHUT_WR)
        assert replies(s, 1) == [(400, b'{"error":"body 3 of 10"}')]
        assert closed(s)
    with connect(srv) as s:  # or goes quiet: answered when the body's time is up
        s.sendall(b"POST /r HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        assert replies(s, 1) == [(408, b'{"error":"body None of 10"}')]
        assert closed(s)


def test_an_idle_connection_is_closed_quietly(serve, monkeypatch):
    monkeypatch.setattr(httpio, "IDLE_TIMEOUT_S", 0.5)
    srv, _ = serve()
    with connect(srv) as s:
        s.sendall(post(b"1"))
        assert replies(s, 1)[0][0] == 200
        assert closed(s, within_s=10.0)
    assert srv.deadline_closed == 0 and srv.client_errors == 0
    assert wait_for(lambda: srv.connections == 0, timeout_s=10)


def test_a_client_that_does_not_read_its_replies_is_cut_at_the_deadline(serve):
    srv, _ = serve(request_deadline_s=1.0)
    s = connect(srv)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 3)  # never read
        assert wait_for(lambda: srv.deadline_closed >= 1, timeout_s=20)
        with connect(srv) as other:  # and everyone else is served meanwhile
            other.sendall(post(b"ok"))
            assert replies(other, 1)[0][0] == 200
    finally:
        s.close()
    assert wait_for(lambda: srv.connections == 0, timeout_s=10)


def test_a_request_whose_bytes_wait_unread_behind_a_late_loop_is_not_taken_for_a_silent_socket(serve):
    """A connection must send its first byte within the request deadline of its
    accept; bytes that came in time but that a busy loop has not read yet count
    (under uvloop a due timer runs before the reads of the same iteration)."""
    srv, seen = serve(request_deadline_s=1.0)
    with connect(srv) as quiet, connect(srv) as staller:
        assert wait_for(lambda: srv.connections >= 2, timeout_s=10)
        staller.sendall(b"GET /stall HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_for(lambda: ("GET", "/stall", b"") in seen, 10, "the loop held")
        quiet.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # in time, read only after the deadline
        assert replies(quiet, 1)[0] == (200, b"hello")
        assert replies(staller, 1)[0][0] == 200
    assert srv.deadline_closed == 0
