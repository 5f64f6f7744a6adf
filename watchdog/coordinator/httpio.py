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

* at most ``max_connections`` connections are open at once; one more is
  answered 503 and closed at once (``refused_busy``). A connection here is a
  socket and a coroutine, not a thread, so the cap is the job's agents plus
  room (``MAX_CONNECTIONS``), not httpguard's 256: a 16,384-rank job keeps
  2,048 agent connections open;
* every request has a total deadline (``request_deadline_s``, from its first
  byte to the reply written), whatever the client trickles
  (``deadline_closed``); a kept-alive connection on which no byte of a next
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

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, TypeVar

from .. import httpguard, logs

HEADER_LIMIT = 64 * 1024  # request line + headers; more is refused (431) and the connection closed
ACCEPT_BATCH = 64  # accepts per readiness event, so a connection storm cannot starve the requests
IDLE_TIMEOUT_S = 300.0  # a kept-alive connection silent this long is closed (agents report every 1-10 s)
MAX_CONNECTIONS = 8192  # 2,048 agents at 16,384 ranks, scrapers, status clients, and room for reconnects
LAG_PROBE_S = 0.1  # backpressure.PROBE_S
T = TypeVar("T")
_TIMEOUTS = (TimeoutError, asyncio.TimeoutError)  # distinct classes before 3.11


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
    ) -> None:
        self.max_connections, self.request_deadline_s = max_connections, request_deadline_s
        self._log = logs.get(log_name)
        self._limit = logs.RateLimited(every_s=60.0)
        # Counters (plain ints, read by tests and metrics), as httpguard.GuardedServer's.
        self.refused_busy = self.deadline_closed = self.client_errors = self.handler_errors = self.accept_errors = 0
        self._sock = socket.create_server(address, family=family, backlog=backlog)
        self.server_address = self._sock.getsockname()
        self._check_post, self._post, self._get = check_post, post, get
        self._on_body_error, self._body_timeout_s, self._on_lag = on_body_error, body_timeout_s, on_lag
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._running = threading.Event()
        self._done = threading.Event()
        self._closing = threading.Event()
        self._conns: set[asyncio.Task] = set()  # one task per open connection (strong references)

    # -- lifecycle (socketserver's) ---------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        try:
            if not self._closing.is_set():  # shut down before it started: nothing to serve
                asyncio.run(self._main())
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
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)

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
                if exc.errno not in httpguard.OUT_OF_FDS:
                    self.note_handler_error(exc, "")
                    return
                self.accept_errors += 1
                self._once(
                    "accept",
                    "accept failed: out of file descriptors or memory; pausing the accept loop",
                    error=str(exc),
                    failures=self.accept_errors,
                )
                # The connections being served free theirs; the socket stays readable meanwhile.
                loop.remove_reader(self._sock.fileno())
                loop.call_later(httpguard.ACCEPT_PAUSE_S, self._resume_accept)
                return
            peer = addr[0] if isinstance(addr, tuple) else ""
            if len(self._conns) >= self.max_connections:
                self._refuse(conn, peer)
                continue
            task = loop.create_task(self._connection(conn, peer))
            self._conns.add(task)
            task.add_done_callback(self._conns.discard)

    def _resume_accept(self) -> None:
        if not self._closing.is_set() and self._sock.fileno() >= 0:
            self._loop.add_reader(self._sock.fileno(), self._accept)  # type: ignore[union-attr]

    def _refuse(self, conn: socket.socket, peer: str) -> None:
        httpguard.refuse_busy(self, conn, peer)
        conn.close()

    async def _probe_lag(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(LAG_PROBE_S)
            now = loop.time()
            self._on_lag(max(0.0, now - t - LAG_PROBE_S), now)

    # -- one connection ---------------------------------------------------------------

    async def _connection(self, conn: socket.socket, peer: str) -> None:
        try:
            reader, writer = await asyncio.open_connection(sock=conn, limit=HEADER_LIMIT)
        except OSError as exc:
            conn.close()
            self.note_client_error(exc, peer)
            return
        try:
            while await self._one_request(reader, writer, peer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self.note_client_error(exc, peer)
        except Exception as exc:  # noqa: BLE001 - a bug costs this connection, never the loop
            self.note_handler_error(exc, peer)
        finally:
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> bool:
        """Serve one request within the deadline; False: close the connection."""
        try:
            first = await _within(reader.readexactly(1), IDLE_TIMEOUT_S)
        except _TIMEOUTS:
            return False  # an idle kept-alive connection, not a slow client
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                return False  # closed between requests: the normal end of a connection
            raise
        # From the request's first byte: time a report waited in the socket buffer
        # for a busy loop to read it is ours, not the client's (at 16,384 ranks on
        # half a core, reports waited 20-30 s there, and a deadline counted from
        # the previous reply cut them).
        deadline = time.monotonic() + self.request_deadline_s
        try:
            head = first + await _within(reader.readuntil(b"\r\n\r\n"), deadline - time.monotonic())
        except asyncio.LimitOverrunError:
            await self._write(writer, Response(431, b'{"error":"request headers too large"}', close=True), False)
            return False
        except _TIMEOUTS:
            return self._past_deadline()
        req = _parse(head, peer)
        if req is None:
            await self._write(writer, Response(400, b'{"error":"malformed request"}', close=True), False)
            return False
        if req.method == "POST":
            resp = self._check_post(req)
            if resp is None:
                req.length = int(req.headers["content-length"])
                wait = min(self._body_timeout_s(), deadline - time.monotonic())
                try:
                    body = await _within(reader.readexactly(req.length), wait)
                except _TIMEOUTS:
                    if time.monotonic() >= deadline:
                        return self._past_deadline()
                    resp = self._on_body_error(req, None)
                except asyncio.IncompleteReadError as exc:
                    resp = self._on_body_error(req, len(exc.partial))
                else:
                    resp = self._post(req, body)
        elif req.method in ("GET", "HEAD"):
            resp = self._get(req)
        else:
            resp = Response(501, b'{"error":"method not supported"}', close=True)
        if req.headers.get("connection", "").lower() == "close" or req.version == "HTTP/1.0":
            resp.close = True
        try:
            await _within(self._write(writer, resp, req.method == "HEAD"), max(0.0, deadline - time.monotonic()))
        except _TIMEOUTS:  # a client that does not read its reply
            return self._past_deadline()
        return not resp.close

    # -- guard: counters and rate-limited logs -------------------------------------------

    def _past_deadline(self) -> bool:
        self.deadline_closed += 1
        self._once(
            "deadline",
            "connection closed: request not completed within its deadline",
            deadline_s=self.request_deadline_s,
            closed=self.deadline_closed,
        )
        return False

    def note_client_error(self, exc: BaseException, peer: str) -> None:
        self.client_errors += 1
        self._once(
            "client", "client disconnected mid-request", peer=peer, error=type(exc).__name__, total=self.client_errors
        )

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
            self._once("loop", "event loop error", message=str(context.get("message", ""))[:300])

    def _once(self, key: str, event: str, **kw: Any) -> None:
        first, suppressed = self._limit.should_log(key, time.monotonic())
        if first:
            self._log.warning(event, suppressed=suppressed, **kw)

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, resp: Response, head_only: bool) -> None:
        reason = HTTPStatus(resp.status).phrase if resp.status in HTTPStatus._value2member_map_ else ""
        lines = [
            f"HTTP/1.1 {resp.status} {reason}",
            "Server: watchdog-coordinator",
            f"Content-Type: {resp.ctype}",
            f"Content-Length: {len(resp.body)}",
        ]
        lines += [f"{k}: {v}" for k, v in resp.extra.items()]
        if resp.close:
            lines.append("Connection: close")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        writer.write(data if head_only else data + resp.body)
        await writer.drain()


async def _within(aw: Awaitable[T], seconds: float) -> T:
    """``asyncio.timeout`` where it exists (3.11: no task per request), else ``wait_for``."""
    if _timeout is None:
        return await asyncio.wait_for(aw, seconds)
    async with _timeout(seconds):
        return await aw


_timeout = getattr(asyncio, "timeout", None)


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
