"""A small HTTP/1.1 server on one asyncio event loop, with the lifecycle of
``socketserver`` (``serve_forever`` in a thread, ``shutdown``, ``server_close``,
``server_address``) so the daemon and tests drive it like the stdlib server.

Only what agents, Prometheus and ``watchdog status`` need: Content-Length
bodies (no chunked uploads), kept-alive connections, HEAD. The routing and
every decision are callbacks (``server.py``); this module only moves bytes and
measures how late the loop runs (``on_lag``), which is how far behind request
handling is, because every request is handled on the loop.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TypeVar

HEADER_LIMIT = 64 * 1024  # request line + headers; more is refused (431) and the connection closed
IDLE_TIMEOUT_S = 300.0  # a kept-alive connection silent this long is closed (agents report every second)
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
    ) -> None:
        self._sock = socket.create_server(address, family=family, backlog=backlog)
        self.server_address = self._sock.getsockname()
        self._check_post, self._post, self._get = check_post, post, get
        self._on_body_error, self._body_timeout_s, self._on_lag = on_body_error, body_timeout_s, on_lag
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._running = threading.Event()
        self._done = threading.Event()
        self._writers: set[asyncio.StreamWriter] = set()

    # -- lifecycle (socketserver's) ---------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        try:
            asyncio.run(self._main())
        finally:
            self._done.set()

    def shutdown(self) -> None:
        if self._loop is None or not self._running.is_set():
            return
        self._loop.call_soon_threadsafe(self._stop.set)  # type: ignore[union-attr]
        self._done.wait(10.0)

    def server_close(self) -> None:
        self._sock.close()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        srv = await asyncio.start_server(self._serve, sock=self._sock, limit=HEADER_LIMIT)
        probe = asyncio.ensure_future(self._probe_lag())
        self._running.set()
        try:
            await self._stop.wait()
        finally:
            probe.cancel()
            srv.close()
            for w in list(self._writers):
                w.close()
            await srv.wait_closed()

    async def _probe_lag(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(LAG_PROBE_S)
            now = loop.time()
            self._on_lag(max(0.0, now - t - LAG_PROBE_S), now)

    # -- one connection ---------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        peername = writer.get_extra_info("peername")
        peer = peername[0] if isinstance(peername, tuple) else ""
        try:
            while True:
                try:
                    head = await _within(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT_S)
                except asyncio.LimitOverrunError:
                    await self._write(
                        writer, Response(431, b'{"error":"request headers too large"}', close=True), False
                    )
                    return
                req = _parse(head, peer)
                if req is None:
                    await self._write(writer, Response(400, b'{"error":"malformed request"}', close=True), False)
                    return
                if req.method == "POST":
                    resp = self._check_post(req)
                    if resp is None:
                        req.length = int(req.headers["content-length"])
                        try:
                            body = await _within(reader.readexactly(req.length), self._body_timeout_s())
                        except _TIMEOUTS:
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
                await self._write(writer, resp, req.method == "HEAD")
                if resp.close:
                    return
        except (asyncio.IncompleteReadError, ConnectionError, *_TIMEOUTS):
            return  # the client went away or idled out
        finally:
            self._writers.discard(writer)
            writer.close()

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
