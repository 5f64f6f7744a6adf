"""A small HTTP/1.1 server on one asyncio event loop, with the lifecycle of
``socketserver`` (``serve_forever`` in a thread, ``shutdown``, ``server_close``,
``server_address``) so the daemon and tests drive it like the stdlib server.

Only what agents, Prometheus and ``watchdog status`` need: Content-Length
bodies (no chunked uploads), kept-alive connections, HEAD. The routing and
every decision are callbacks (``server.py``); this module only moves bytes and
measures how late the loop runs (``on_lag``), which is how far behind request
handling is, because every request is handled on the loop.

Unauthenticated clients cannot exhaust it, as ``watchdog.httpguard`` promises
for the threaded servers (issue #14), with the same counters:

* at most ``max_connections`` connections are open at once. A connection here
  is a socket and a coroutine, not a thread, so the cap is the job's agents plus
  room (``MAX_CONNECTIONS``), not httpguard's 256: a 16,384-rank job keeps
  2,048 agent connections open. The process's descriptor limit is raised to
  hold the cap (``httpguard.fit_fd_limit``; the cap is lowered, with a warning,
  where the hard limit cannot), so idle sockets meet the cap, never EMFILE. At
  the cap a new connection takes the place of the oldest one that has not sent
  a byte (``evicted_idle``); only when none is left is one more answered 503 and
  closed at once (``refused_busy``);
* a connection must send its first byte within ``request_deadline_s`` of its
  accept, and every request has that total deadline (from its first byte to the
  reply written), whatever the client trickles (``deadline_closed``); a
  kept-alive connection (one that has sent a request) on which no byte of a next
  request came in for ``IDLE_TIMEOUT_S`` is closed quietly (idle: an idle
  connection costs a socket and a coroutine, and the connection cap bounds them);
* an accept that fails for lack of descriptors or memory pauses accepting
  (``httpguard.ACCEPT_PAUSE_S``) instead of spinning (``accept_errors``). The
  accept loop is this module's own: asyncio's (3.11) goes on calling accept
  after EMFILE, up to the backlog's length per wake-up, and schedules a retry
  for each failure (measured: 273 failed accepts in 3 s);
* client disconnects and resets are counted (``client_errors``) and logged once
  a minute; other handler errors (``handler_errors``) are logged rate-limited
  with their traceback, and cost their connection only.
"""

# _Connection is LoopServer's own other half (asyncio's Protocol API splits one server in two
# objects): it reads the server's private state and calls its handlers, as a method would.
# ruff: noqa: SLF001

from __future__ import annotations

import asyncio
import heapq
import math
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, cast

from ... import httpguard, logs
from .. import event_loops

HEADER_LIMIT = 64 * 1024  # request line + headers; more is refused (431) and the connection closed
ACCEPT_BATCH = 64  # accepts per readiness event, so a connection storm cannot starve the requests
IDLE_TIMEOUT_S = 300.0  # a kept-alive connection silent this long is closed (agents report every 1-10 s)
MAX_CONNECTIONS = 8192  # 2,048 agents at 16,384 ranks, scrapers, status clients, and room for reconnects
LAG_PROBE_S = 0.1  # backpressure.PROBE_S
EVICT_CANDIDATES = 8  # the oldest silent connections looked at for one eviction
_TIMEOUTS = (TimeoutError, asyncio.TimeoutError)  # distinct classes before 3.11
_HEAD_END = b"\r\n\r\n"


@dataclass
class Request:
    method: str
    target: str
    path: str
    headers: dict[str, str]  # lower-case names
    peer: str
    length: int = 0
    version: str = "HTTP/1.1"


@dataclass
class Response:
    status: int
    body: bytes
    ctype: str = "application/json"
    close: bool = False
    extra: dict[str, str] = field(default_factory=dict)


class LoopServer:
    def __init__(
        self,
        address: tuple[str, int],
        family: int,
        *,
        check_post: Callable[[Request], Response | None],
        post: Callable[[Request, bytes], Response],
        get: Callable[[Request], Response],
        on_body_error: Callable[[Request, int | None], Response],
        body_timeout_s: Callable[[], float],
        on_lag: Callable[[float, float], None] = lambda lag, now: None,
        backlog: int = 4096,
        max_connections: int = MAX_CONNECTIONS,
        request_deadline_s: float = httpguard.REQUEST_DEADLINE_S,
        log_name: str = "watchdog.http",
        event_loop: str = "auto",  # event_loops.CHOICES
        ssl_context: ssl.SSLContext | None = None,  # TLS (webconfig); None: plain HTTP
    ) -> None:
        self.event_loop = event_loops.resolved(event_loop)  # "asyncio" or "uvloop"
        self._ssl = ssl_context
        self._log = logs.get(log_name)
        self.max_connections = httpguard.fit_fd_limit(max_connections, self._log)
        self.request_deadline_s = request_deadline_s
        self._limit = logs.RateLimited(every_s=60.0)
        # Counters (plain ints, read by tests and metrics), as httpguard.GuardedServer's.
        self.refused_busy = self.deadline_closed = self.client_errors = self.handler_errors = self.accept_errors = 0
        self.evicted_idle = 0
        self._sock = socket.create_server(address, family=family, backlog=backlog)
        self.server_address = self._sock.getsockname()
        self._check_post, self._post, self._get = check_post, post, get
        self._on_body_error, self._body_timeout_s, self._on_lag = on_body_error, body_timeout_s, on_lag
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._running = threading.Event()
        self._done = threading.Event()
        self._closing = threading.Event()
        self._conns: set[_Connection] = set()  # every open connection, from its accept to its end
        self._opening: set[asyncio.Task] = set()  # connections whose transport is being made

    # -- lifecycle (socketserver's) ---------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        try:
            if not self._closing.is_set():  # shut down before it started: nothing to serve
                event_loops.run(self.event_loop, self._main())
        finally:
            self._done.set()

    def shutdown(self) -> None:
        """Stop serving and wait for the loop to end (socketserver's contract), also
        when called before ``serve_forever``'s thread got going."""
        self._closing.set()
        if self._loop is not None and self._running.is_set():
            self._loop.call_soon_threadsafe(self._stop.set)  # type: ignore[union-attr]
            self._done.wait(10.0)

    def server_close(self) -> None:
        self._closing.set()
        self._sock.close()

    @property
    def connections(self) -> int:
        return len(self._conns)

    async def _main(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._loop_error)
        self._stop = asyncio.Event()
        fd = self._sock.fileno()
        if fd < 0:
            return  # closed before the loop started
        self._sock.setblocking(False)
        loop.add_reader(fd, self._accept)
        probe = asyncio.ensure_future(self._probe_lag())
        self._running.set()
        if self._closing.is_set():  # shutdown() ran between the checks: it did not see us running
            self._stop.set()
        try:
            await self._stop.wait()
        finally:
            probe.cancel()
            loop.remove_reader(fd)
            for task in list(self._opening):
                task.cancel()
            await asyncio.gather(*self._opening, return_exceptions=True)
            for c in list(self._conns):
                c.abort()

    # -- accept: our own loop, because asyncio's (3.11) keeps calling accept after an
    # EMFILE and schedules a retry per failure instead of pausing once ---------------------

    def _accept(self) -> None:
        loop = self._loop
        assert loop is not None
        for _ in range(ACCEPT_BATCH):
            try:
                conn, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if not httpguard.accept_failed(self, exc):
                    self.note_handler_error(exc, "")
                    return
                # The connections being served free theirs; the socket stays readable meanwhile.
                loop.remove_reader(self._sock.fileno())
                loop.call_later(httpguard.ACCEPT_PAUSE_S, self._resume_accept)
                return
            peer = addr[0] if isinstance(addr, tuple) else ""
            if len(self._conns) >= self.max_connections and not self._evict_fresh():
                self._refuse(conn, peer)
                continue
            c = _Connection(self, peer)
            self._conns.add(c)  # counted against the cap from its accept, before its transport exists
            task = loop.create_task(self._open(c, conn, peer))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)

    async def _open(self, c: _Connection, conn: socket.socket, peer: str) -> None:
        try:
            if self._ssl is None:
                await self._loop.connect_accepted_socket(lambda: c, conn)  # type: ignore[union-attr]
            else:  # the handshake on the loop, bounded like a request
                await self._loop.connect_accepted_socket(  # type: ignore[union-attr]
                    lambda: c, conn, ssl=self._ssl, ssl_handshake_timeout=self.request_deadline_s
                )
        except OSError as exc:
            self._conns.discard(c)
            conn.close()
            self.note_client_error(exc, peer)
        except BaseException:
            self._conns.discard(c)
            conn.close()
            raise

    def _resume_accept(self) -> None:
        if not self._closing.is_set() and self._sock.fileno() >= 0:
            self._loop.add_reader(self._sock.fileno(), self._accept)  # type: ignore[union-attr]

    def _evict_fresh(self) -> bool:
        """Drop the oldest connection that has not sent a byte (an agent's kept-alive
        connection, between two reports, is never one), to make room; False if none.
        One whose bytes wait unread in its socket (a loop running late) is spared."""
        oldest = heapq.nsmallest(EVICT_CANDIDATES, (c for c in self._conns if c.fresh), key=lambda c: c.since)
        victim = next((c for c in oldest if not c.bytes_waiting()), None)
        if victim is None:
            return False
        self._conns.discard(victim)
        victim.abort()
        self.evicted_idle += 1
        self.log_once(
            "evict",
            "idle connection closed: the connection cap was reached and a new client came",
            max_connections=self.max_connections,
            evicted=self.evicted_idle,
        )
        return True

    def _refuse(self, conn: socket.socket, peer: str) -> None:
        httpguard.refuse_busy(self, conn, peer)
        conn.close()

    async def _probe_lag(self) -> None:
        # time.monotonic, not loop.time: uvloop's is libuv's, in ms and read once per
        # loop iteration, and the lag is compared with the handlers' monotonic stamps.
        while True:
            t = time.monotonic()
            await asyncio.sleep(LAG_PROBE_S)
            now = time.monotonic()
            self._on_lag(max(0.0, now - t - LAG_PROBE_S), now)

    # -- guard: counters and rate-limited logs -------------------------------------------

    def _past_deadline(self) -> bool:
        self.deadline_closed += 1
        self.log_once(
            "deadline",
            "connection closed: request not completed within its deadline",
            deadline_s=self.request_deadline_s,
            closed=self.deadline_closed,
        )
        return False

    def note_client_error(self, exc: BaseException, peer: str) -> None:
        httpguard.client_gone(self, exc, peer)

    def note_handler_error(self, exc: BaseException, peer: str) -> None:
        self.handler_errors += 1
        first, suppressed = self._limit.should_log(f"handler:{type(exc).__name__}", time.monotonic())
        if first:
            self._log.error(
                "request handler failed", peer=peer, error=repr(exc)[:300], suppressed=suppressed, exc_info=exc
            )

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The loop's exception handler: what asyncio would print with a traceback
        (a transport's error on a client that went away) is counted and rate-limited."""
        exc = context.get("exception")
        if isinstance(exc, (ConnectionError, *_TIMEOUTS)):
            self.note_client_error(exc, "")
        elif exc is not None:
            self.note_handler_error(exc, "")
        else:
            self.log_once("loop", "event loop error", message=str(context.get("message", ""))[:300])

    def log_once(self, key: str, event: str, **kw: Any) -> None:
        first, suppressed = self._limit.should_log(key, time.monotonic())
        if first:
            self._log.warning(event, suppressed=suppressed, **kw)


class _Connection(asyncio.Protocol):
    """One client connection, served from the transport's callbacks: no task, no
    stream reader and no timeout context per request. With streams each request
    cost four timeouts (a timer handle each) and a future per read: at 2,048
    agents reporting once a second the server alone took ~125 us of CPU a
    request, against ~70 us for this (measured: server CPU per request, loopback).

    One timer per connection keeps every limit. It is set for the earliest time
    something may have to be done (a request's deadline, its body's, the idle
    limit) and, when it fires, looks at the state and sets itself again. A
    request that arrives whole between two wake-ups moves no timer at all: the
    steady state arms one timer per connection every ``IDLE_TIMEOUT_S``.

    Requests are served in order, one at a time, each as soon as it is all in.
    While the transport's write buffer is over its high-water mark (a client
    that does not read its replies) nothing more is read or served, as a
    stream's ``drain`` did; the request deadline then closes it."""

    def __init__(self, server: LoopServer, peer: str) -> None:
        self._srv = server
        self._peer = peer
        loop = server._loop
        assert loop is not None  # made on the loop, by the accept callback
        self._loop: asyncio.AbstractEventLoop = loop
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()  # bytes read and not yet served
        self._req: Request | None = None  # its head read, its body awaited
        self._deadline = 0.0  # of the request in progress (or of the last one, its reply maybe still in the buffer)
        self._body_by = 0.0  # when the awaited body must be in
        self._last = 0.0  # when the last reply was handed over (or the connection made): idle since
        self._closing = False  # a closing reply went out, or the connection is being dropped: nothing more is read
        self.fresh = True  # no byte received yet: must send one within the request deadline of its accept
        self.since = loop.time()  # accepted at
        self._paused = False  # the write buffer is full: serve nothing until it drains
        self._timer: asyncio.TimerHandle | None = None
        self._wake = math.inf  # when the timer fires

    # -- the transport's callbacks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not subclass asyncio.Transport: no isinstance).
        self._transport = cast(asyncio.Transport, transport)
        if self._closing:  # evicted while its transport was being made
            self._transport.abort()
            return
        self._last = self._loop.time()
        self._arm(min(self.since + self._srv.request_deadline_s, self._last + IDLE_TIMEOUT_S))  # first byte, idle

    def connection_lost(self, exc: Exception | None) -> None:
        self._srv._conns.discard(self)
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        if exc is not None:  # a reset or a broken pipe; a close (either side's) reports None
            self._srv.note_client_error(exc, self._peer)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return  # after a reply that closes: an unread body must not be parsed as the next request
        now = self._loop.time()
        self.fresh = False
        if not self._buf and self._req is None:
            # A request's first byte: time it waited in the socket buffer for a busy loop
            # to read it is ours, not the client's (at 16,384 ranks on half a core, reports
            # waited 20-30 s there, and a deadline counted from the last reply cut them).
            self._deadline = now + self._srv.request_deadline_s
        self._buf += data
        self._serve(now)

    def eof_received(self) -> bool:
        if self._closing:
            return False
        if self._req is not None:  # the body ended before its Content-Length: answered, then closed
            try:
                self._send(self._req, self._srv._on_body_error(self._req, len(self._buf)), close=True)
            except Exception as exc:  # noqa: BLE001 - a bug costs this connection, never the loop
                self._failed(exc)
            return True  # the transport stays open for the reply; _send closes it after
        if self._buf:  # inside a request head
            self._srv.note_client_error(asyncio.IncompleteReadError(bytes(self._buf), None), self._peer)
        return False  # between requests: the normal end of a connection

    def pause_writing(self) -> None:
        self._paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self._transport is not None and not self._closing:
            self._transport.resume_reading()
            self._serve(self._loop.time())

    # -- serving -----------------------------------------------------------------------------

    def _serve(self, now: float) -> None:
        """Serve every request that is all in, then make sure the timer will look again."""
        srv = self._srv
        try:
            while not self._closing and not self._paused:
                req = self._req
                if req is None:
                    if not self._buf:
                        break
                    end = self._buf.find(_HEAD_END)
                    if end < 0 and len(self._buf) <= HEADER_LIMIT:
                        break  # the head is not all in yet
                    if end < 0 or end > HEADER_LIMIT:
                        self._refuse(Response(431, b'{"error":"request headers too large"}', close=True))
                        break
                    head = bytes(self._buf[: end + 4])
                    del self._buf[: end + 4]
                    req = _parse(head, self._peer)
                    if req is None:
                        self._refuse(Response(400, b'{"error":"malformed request"}', close=True))
                        break
                    if req.method == "POST":
                        resp = srv._check_post(req)
                        if resp is None:  # read the body
                            req.length = int(req.headers["content-length"])
                            self._req = req
                            self._body_by = min(now + srv._body_timeout_s(), self._deadline)
                            continue
                    elif req.method in ("GET", "HEAD"):
                        resp = srv._get(req)
                    else:
                        resp = Response(501, b'{"error":"method not supported"}', close=True)
                else:
                    if len(self._buf) < req.length:
                        break  # the body is not all in yet
                    body = bytes(self._buf[: req.length])
                    del self._buf[: req.length]
                    self._req = None
                    resp = srv._post(req, body)
                closes = req.headers.get("connection", "").lower() == "close" or req.version == "HTTP/1.0"
                self._send(req, resp, close=resp.close or closes)
                if self._buf:  # the next request's first bytes came with this one
                    self._deadline = self._loop.time() + srv.request_deadline_s
        except Exception as exc:  # noqa: BLE001 - a bug costs this connection, never the loop
            self._failed(exc)
            return
        if not self._closing and self._busy():
            self._arm(min(self._deadline, self._body_by) if self._req is not None else self._deadline)

    def _busy(self) -> bool:
        """A request under way: bytes of it in, or its reply not yet all written."""
        t = self._transport
        return (
            bool(self._buf)
            or self._req is not None
            or self._paused
            or (t is not None and t.get_write_buffer_size() > 0)
        )

    def _send(self, req: Request, resp: Response, close: bool) -> None:
        assert self._transport is not None
        head = _head(resp, close)
        self._transport.write(head if req.method == "HEAD" else head + resp.body)
        self._last = self._loop.time()
        if close:
            self._closing = True
            self._transport.close()  # after the buffered reply is written

    def _refuse(self, resp: Response) -> None:
        assert self._transport is not None
        self._transport.write(_head(resp, True) + resp.body)
        self._closing = True
        self._transport.close()

    def _failed(self, exc: BaseException) -> None:
        self._srv.note_handler_error(exc, self._peer)
        self.abort()

    def abort(self) -> None:
        """Drop the connection now, unwritten reply and all."""
        self._closing = True
        if self._transport is not None:
            self._transport.abort()

    def bytes_waiting(self) -> bool:
        """Bytes in the socket the loop has not read yet. Under uvloop timers run
        before reads within an iteration, and a starved loop can be tens of seconds
        late (docs/benchmarks.md): a request's first bytes may be in, just not read."""
        sock = self._transport.get_extra_info("socket") if self._transport is not None else None
        if sock is None:
            return False
        try:  # a dup of the descriptor: uvloop hands out a pseudo-socket without recv
            with socket.socket(fileno=os.dup(sock.fileno())) as dup:
                return bool(dup.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except (OSError, AttributeError, ValueError):
            return False

    # -- the one timer -----------------------------------------------------------------------

    def _arm(self, when: float) -> None:
        if when >= self._wake:
            return  # it fires earlier, and then sets itself for this
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._wake = self._loop.call_at(when, self._on_timer), when

    def _on_timer(self) -> None:
        self._timer, self._wake = None, math.inf
        if self._closing:
            return
        now = self._loop.time()
        try:
            if not self._busy():
                if self.fresh:  # not a byte since the accept: a held socket, not a client
                    if self.bytes_waiting():  # a late loop has not read them yet: the request has begun
                        self.fresh = False
                        self._deadline = now + self._srv.request_deadline_s
                        self._arm(self._deadline)
                    elif now >= self.since + self._srv.request_deadline_s:
                        self._srv._past_deadline()
                        self.abort()
                    else:
                        self._arm(self.since + self._srv.request_deadline_s)
                elif now - self._last >= IDLE_TIMEOUT_S:  # an idle kept-alive connection, not a slow client
                    self._closing = True
                    assert self._transport is not None
                    self._transport.close()
                else:
                    self._arm(self._last + IDLE_TIMEOUT_S)
            elif now >= self._deadline:  # a trickled head or body, or a reply not read
                self._srv._past_deadline()
                self.abort()
            elif self._req is not None and not self._paused and now >= self._body_by:
                self._send(self._req, self._srv._on_body_error(self._req, None), close=True)  # 408
            else:
                self._arm(min(self._deadline, self._body_by) if self._req is not None else self._deadline)
        except Exception as exc:  # noqa: BLE001 - a bug costs this connection, never the loop
            self._failed(exc)


def _head(resp: Response, close: bool) -> bytes:
    """The status line and headers of ``resp``."""
    reason = HTTPStatus(resp.status).phrase if resp.status in HTTPStatus._value2member_map_ else ""
    lines = [
        f"HTTP/1.1 {resp.status} {reason}",
        "Server: watchdog-coordinator",
        f"Content-Type: {resp.ctype}",
        f"Content-Length: {len(resp.body)}",
    ]
    lines += [f"{k}: {v}" for k, v in resp.extra.items()]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _parse(head: bytes, peer: str) -> Request | None:
    try:
        text = head.decode("latin-1")
        first, *rest = text[:-4].split("\r\n")
        method, target, version = first.split(" ")
    except ValueError:
        return None
    if not version.startswith("HTTP/1."):
        return None
    headers: dict[str, str] = {}
    for line in rest:
        name, sep, value = line.partition(":")
        if not sep:
            return None
        headers[name.strip().lower()] = value.strip()
    return Request(method, target, target.split("?", 1)[0], headers, peer, version=version)
