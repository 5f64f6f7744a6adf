"""HTTP: POST /api/v1/report, POST /api/v1/launcher-exit (``watchdog run``),
GET /api/v1/status, GET /metrics, GET /healthz (503 while the tick loop is
stale), GET /readyz (503 until the journal is replayed and the first tick has run).

Bytes in, bytes out; decisions live in ``api.ReportHandler``. The body size is
checked from Content-Length before anything is read (413), the token before
the body (401), and a client that stalls mid-body is timed out (408).
Connections are capped and every request has a total deadline (``httpio``, with
``watchdog.httpguard``'s guarantees: unauthenticated clients cannot exhaust the
server). /metrics is not authenticated (Prometheus scrapes it; it holds no secrets); the status
API is, when a token is configured.

One asyncio event loop serves every connection (``httpio``), not a thread per
connection: at 2,048 agents each holding a kept-alive connection, threads cost
a core in switching and GIL hand-offs alone (benchmarks/scale.py measured the
thread-per-connection server at 0.95 of a core for 512 hosts; the guarded
threaded server's cap of 256 connections cannot hold 512 agents at all:
docs/benchmarks.md). Reports are
handled one at a time on the loop, so how late the loop runs *is* how far
behind the coordinator is: ``Lag`` measures it and the reply asks agents to slow
down while it is high (``backpressure``).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from ... import httpguard, httpgzip, launcherexit, logs, webconfig
from .api import ReportHandler, authorized
from .coordinator_protocol import ServedCoordinator
from .httpio import MAX_CONNECTIONS, LoopServer, Request, Response

REPORT_PATH = "/api/v1/report"
STATUS_PATH = "/api/v1/status"
BODY_TIMEOUT_S = 10.0


def _json(status: int, obj: Any, close: bool = False) -> Response:
    return Response(status, json.dumps(obj, separators=(",", ":")).encode(), close=close)


def make_server(
    host: str,
    port: int,
    coordinator: ServedCoordinator,
    token: str,
    max_body: int,
    *,
    max_connections: int = MAX_CONNECTIONS,
    request_deadline_s: float = httpguard.REQUEST_DEADLINE_S,
    after_report: Callable[[], None] = lambda: None,
    event_loop: str = "auto",
    unhealthy: Callable[[], str] = lambda: "",
    unready: Callable[[], str] = lambda: "",
    web: webconfig.WebConfig | None = None,
) -> LoopServer:
    """``after_report``: called after each accepted report (the daemon's
    ``GcPolicy.after_report``). ``unhealthy`` / ``unready``: why /healthz or
    /readyz answer 503, or "" (the daemon's tick loop and replay). ``web``: TLS, and
    basic auth for /metrics (``--web.config.file``)."""
    web = web or webconfig.WebConfig()
    reports = ReportHandler(coordinator, token)
    log = logs.get("watchdog.coordinator")
    pressure = coordinator.backpressure

    def reject(req: Request, status: int, reason: str, message: str) -> Response:
        _, body, _ = reports.reject(status, reason, message, time.monotonic(), req.peer)
        return _json(status, body, close=True)  # the unread body must not be parsed as the next request

    def check_post(req: Request) -> Response | None:
        """Before the body is read: path, token, length. None: read the body."""
        return _check_post(req, token, max_body, reject)

    def on_body_error(req: Request, got: int | None) -> Response:
        if got is None:
            return reject(req, 408, "timeout", f"body not received within {BODY_TIMEOUT_S:.0f} s")
        return reject(req, 400, "bad_json", f"body ended after {got} of {req.length} bytes")

    def post(req: Request, body: bytes) -> Response:
        now = time.monotonic()
        if req.path == launcherexit.PATH:
            return _launcher_exit(req, body, now, reports, log)
        try:
            status, reply, _ = reports.handle(req.headers, body, now, req.peer)
        except Exception as exc:  # noqa: BLE001 - a bug must cost one report, not the daemon
            log.error("report_failed", error=f"{type(exc).__name__}: {exc}", exc_info=True)
            status, reply, _ = reports.reject(500, "internal", "internal error", time.monotonic())
        if status == 200:
            pressure.note_report(now)
            pressure.advise(reply, now)
            after_report()
        return _json(status, reply, close=status >= 400)

    def get(req: Request) -> Response:
        if req.path == "/metrics":
            return _metrics(req, coordinator, web)
        if req.path == "/healthz":
            return _probe(unhealthy(), "unhealthy", "ok")
        if req.path == "/readyz":
            return _probe(unready(), "not ready", "ready")
        if req.path == STATUS_PATH:
            if not authorized(token, req.headers):
                return _json(401, {"error": "missing or wrong bearer token"})
            return _json(200, coordinator.status(time.monotonic(), time.time()))
        return _json(404, {"error": f"no such endpoint: GET {req.target}"})

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return LoopServer(
        (host, port),
        family,
        check_post=check_post,
        post=post,
        get=get,
        on_body_error=on_body_error,
        body_timeout_s=lambda: BODY_TIMEOUT_S,
        on_lag=pressure.observe_lag,
        backlog=4096,
        max_connections=max_connections,
        request_deadline_s=request_deadline_s,
        log_name="watchdog.coordinator",
        event_loop=event_loop,
        ssl_context=web.ssl_context,
    )


def _check_post(
    req: Request, token: str, max_body: int, reject: Callable[[Request, int, str, str], Response]
) -> Response | None:
    """``make_server``'s ``check_post``: path, token, length; ``reject`` answers
    (and counts) a refused report."""
    if req.path not in (REPORT_PATH, launcherexit.PATH):
        return _json(404, {"error": f"no such endpoint: POST {req.target}"}, close=True)
    if not authorized(token, req.headers):
        return reject(req, 401, "unauthorized", "missing or wrong bearer token")
    if req.headers.get("transfer-encoding"):
        return reject(req, 411, "no_length", "chunked bodies are not accepted; send Content-Length")
    raw = req.headers.get("content-length")
    if raw is None or not raw.strip().isdigit():
        return reject(req, 411, "no_length", "Content-Length header required")
    if int(raw) > max_body:
        return reject(req, 413, "too_large", f"report is {int(raw)} bytes, limit {max_body}")
    return None


def _launcher_exit(req: Request, body: bytes, now: float, reports: ReportHandler, log: Any) -> Response:
    """POST of a launcher's exit status (``launcherexit.PATH``)."""
    try:
        status, reply, _ = reports.handle_launcher_exit(req.headers, body, now, req.peer)
    except Exception as exc:  # noqa: BLE001 - a bug must cost one request, not the daemon
        log.error("launcher_exit_failed", error=f"{type(exc).__name__}: {exc}", exc_info=True)
        status, reply, _ = reports.reject(500, "internal", "internal error", time.monotonic())
    return _json(status, reply, close=status >= 400)


def _metrics(req: Request, coordinator: ServedCoordinator, web: webconfig.WebConfig) -> Response:
    """GET /metrics: basic auth where ``--web.config.file`` asks for it, gzip where the scraper accepts it."""
    if not web.allowed(req.headers.get("authorization", "")):
        return Response(401, b"unauthorized\n", "text/plain", extra={"WWW-Authenticate": "Basic"})
    body = coordinator.metrics.exposition()
    if httpgzip.wanted(req.headers.get("accept-encoding", "")):
        return Response(200, httpgzip.compress(body), CONTENT_TYPE_LATEST, extra={"Content-Encoding": "gzip"})
    return Response(200, body, CONTENT_TYPE_LATEST)


def _probe(why: str, bad: str, good: str) -> Response:
    """/healthz or /readyz: 503 and why, or 200."""
    if why:
        return Response(503, f"{bad}: {why}\n".encode(), "text/plain")
    return Response(200, f"{good}\n".encode(), "text/plain")


def bound_address(server: LoopServer) -> str:
    host, port = server.server_address[:2]
    assert isinstance(host, str)  # AF_INET/AF_INET6: never a unix socket path
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
