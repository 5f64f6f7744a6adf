"""HTTP: POST /api/v1/report, GET /api/v1/status, GET /metrics, GET /healthz.

Bytes in, bytes out; decisions live in ``api.ReportHandler``. The body size is
checked from Content-Length before anything is read (413), the token before
the body (401), and a client that stalls mid-body is timed out (408) instead of
holding a thread. Connections are capped and every request has a total
deadline (``watchdog.httpguard``: unauthenticated clients cannot exhaust the
server). /metrics is not authenticated (Prometheus scrapes it; it holds
no secrets); the status API is, when a token is configured.
"""

from __future__ import annotations

import json
import time
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import httpguard, logs
from .api import ReportHandler, authorized
from .service import Coordinator

REPORT_PATH = "/api/v1/report"
STATUS_PATH = "/api/v1/status"
BODY_TIMEOUT_S = 10.0


def make_server(
    host: str,
    port: int,
    coordinator: Coordinator,
    token: str,
    max_body: int,
    *,
    max_connections: int = httpguard.MAX_CONNECTIONS,
    request_deadline_s: float = httpguard.REQUEST_DEADLINE_S,
) -> ThreadingHTTPServer:
    reports = ReportHandler(coordinator, token)
    log = logs.get("watchdog.coordinator")

    class Handler(httpguard.GuardedHandler):
        server_version = "watchdog-coordinator"
        protocol_version = "HTTP/1.1"  # agents keep one connection open
        timeout = BODY_TIMEOUT_S

        def log_message(self, fmt: str, *args: Any) -> None:  # state changes only, not requests
            pass

        def _send(self, status: int, body: bytes, ctype: str = "application/json", close: bool = False) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, obj: Any, close: bool = False) -> None:
            self._send(status, json.dumps(obj, separators=(",", ":")).encode(), close=close)

        def _reject(self, status: int, reason: str, message: str) -> None:
            _, body, _ = reports.reject(status, reason, message, time.monotonic(), self.client_address[0])
            self._json(status, body, close=True)  # the unread body must not be parsed as the next request

        def do_POST(self) -> None:
            if self.path.split("?")[0] != REPORT_PATH:
                return self._json(404, {"error": f"no such endpoint: POST {self.path}"}, close=True)
            if not authorized(token, self.headers):
                return self._reject(401, "unauthorized", "missing or wrong bearer token")
            if self.headers.get("Transfer-Encoding"):
                return self._reject(411, "no_length", "chunked bodies are not accepted; send Content-Length")
            raw = self.headers.get("Content-Length")
            if raw is None or not raw.strip().isdigit():
                return self._reject(411, "no_length", "Content-Length header required")
            length = int(raw)
            if length > max_body:
                return self._reject(413, "too_large", f"report is {length} bytes, limit {max_body}")
            try:
                body = self.rfile.read(length)
            except TimeoutError:
                return self._reject(408, "timeout", f"body not received within {BODY_TIMEOUT_S:.0f} s")
            if len(body) < length:
                return self._reject(400, "bad_json", f"body ended after {len(body)} of {length} bytes")
            try:
                status, reply, _ = reports.handle(self.headers, body, time.monotonic(), self.client_address[0])
            except Exception as exc:  # noqa: BLE001 - a bug must cost one report, not the daemon
                log.error("report_failed", error=f"{type(exc).__name__}: {exc}", exc_info=True)
                status, reply, _ = reports.reject(500, "internal", "internal error", time.monotonic())
            self._json(status, reply, close=status >= 400)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/metrics":
                return self._send(200, generate_latest(coordinator.registry), CONTENT_TYPE_LATEST)
            if path == "/healthz":
                return self._send(200, b"ok\n", "text/plain")
            if path == STATUS_PATH:
                if not authorized(token, self.headers):
                    return self._json(401, {"error": "missing or wrong bearer token"})
                return self._json(200, coordinator.status(time.monotonic(), time.time()))
            self._json(404, {"error": f"no such endpoint: GET {self.path}"})

        do_HEAD = do_GET

    return httpguard.server_class(host)(
        (host, port),
        Handler,
        max_connections=max_connections,
        request_deadline_s=request_deadline_s,
        log_name="watchdog.coordinator",
    )


def bound_address(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    assert isinstance(host, str)  # AF_INET/AF_INET6: never a unix socket path
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
