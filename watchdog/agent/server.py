"""HTTP: /metrics (Prometheus text or OpenMetrics, by Accept) and /healthz, served
from a daemon thread by the stdlib's ThreadingHTTPServer, guarded like the
coordinator's (``watchdog.httpguard``: a listen backlog of 128, not the stdlib's
5, capped connections, a deadline per request, disconnects counted not printed)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from watchdog import httpguard, httpgzip, logs, webconfig

INDEX = b"""<html><head><title>rank-watchdog agent</title></head><body>
<h1>rank-watchdog agent</h1><p><a href="/metrics">/metrics</a> <a href="/healthz">/healthz</a></p>
</body></html>
"""


def make_handler(
    registry: CollectorRegistry, healthy: Callable[[], tuple[bool, str]], web: webconfig.WebConfig
) -> type[httpguard.GuardedHandler]:
    class Handler(httpguard.GuardedHandler):
        server_version = "rank-watchdog-agent"
        timeout = 10.0  # per read; the request as a whole has the server's deadline

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                if not web.allowed(self.headers.get("Authorization", "")):
                    self._send(401, "text/plain; charset=utf-8", b"unauthorized\n", {"WWW-Authenticate": "Basic"})
                    return
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                body = encoder(registry)
                if httpgzip.wanted(self.headers.get("Accept-Encoding", "")):
                    self._send(200, content_type, httpgzip.compress(body), {"Content-Encoding": "gzip"})
                else:
                    self._send(200, content_type, body)
            elif path == "/healthz":
                ok, text = healthy()
                self._send(200 if ok else 503, "text/plain; charset=utf-8", text.encode() + b"\n")
            elif path == "/":
                self._send(200, "text/html; charset=utf-8", INDEX)
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")

        def _send(self, code: int, content_type: str, body: bytes, extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - a request per scrape is a tick
            pass

    return Handler


class Server:
    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        healthy: Callable[[], tuple[bool, str]] = lambda: (True, "ok"),
        web: webconfig.WebConfig | None = None,
    ) -> None:
        """``web``: TLS, and basic auth for /metrics (``--web.config.file``)."""
        web = web or webconfig.WebConfig()
        self._httpd = httpguard.server_class(address[0])(
            address, make_handler(registry, healthy, web), log_name="watchdog.agent"
        )
        if web.ssl_context is not None:
            # Accepted sockets inherit it; the handshake happens on the handler's thread at its
            # first read, under the request deadline, never in the accept loop.
            self._httpd.socket = web.ssl_context.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        # Polled for shutdown every 0.1 s (socketserver's default 0.5 s added a quarter second to each stop).
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="watchdog-agent-http", daemon=True
        )

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
        assert isinstance(host, str)  # AF_INET/AF_INET6: never a unix socket path
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def start(self, address_file: str = "") -> str:
        self._thread.start()
        logs.get("watchdog.agent").info("listening", address=self.address)
        if address_file:  # atomically: a reader never sees a half-written address
            tmp = f"{address_file}.tmp{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(self.address + "\n")
            os.replace(tmp, address_file)
        return self.address

    def stop(self, timeout_s: float = 3.0) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout_s)
