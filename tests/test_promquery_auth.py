"""`watchdog hosts` and `watchdog scaling` against a Prometheus behind auth: a
bearer token from a file, its CA, a tenant header. The server here is a gateway
of the kind that fronts Mimir or Thanos: https with a self-signed certificate,
it answers only a request carrying the right token and tenant."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from watchdog import promquery
from watchdog.coordinator.cli import hosts as hosts_cli
from watchdog.scaling import main as scaling_main

TOKEN = "prom-token-123"


class Gateway:
    def __init__(self, tmp_path) -> None:
        cert, key = tmp_path / "gw.crt", tmp_path / "gw.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        self.cert = cert
        self.seen: list = []  # the requests' headers (case-insensitive lookups)
        gw = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                gw.seen.append(self.headers)
                ok = self.headers.get("Authorization") == f"Bearer {TOKEN}"
                ok = ok and self.headers.get("X-Scope-OrgID") == "team-a"
                body = (
                    {"status": "success", "data": {"resultType": "vector", "result": []}}
                    if ok
                    else {"status": "error", "error": "authentication required"}
                )
                data = json.dumps(body).encode()
                self.send_response(200 if ok else 401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def gateway(tmp_path):
    gw = Gateway(tmp_path)
    yield gw
    gw.close()


def test_hosts_and_scaling_authenticate(gateway, tmp_path, capsys):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    auth = ["--prometheus.bearer-token-file", str(token), "--prometheus.ca-file", str(gateway.cert)]
    auth += ["--prometheus.tenant", "team-a"]
    assert hosts_cli.main(["--prometheus", gateway.url, *auth]) == 0
    assert (
        gateway.seen[-1].get("Authorization") == f"Bearer {TOKEN}" and gateway.seen[-1].get("X-Scope-OrgID") == "team-a"
    )
    # Without the token: the gateway's 401, said plainly.
    assert hosts_cli.main(["--prometheus", gateway.url, "--prometheus.ca-file", str(gateway.cert)]) == 1
    assert "HTTP 401" in capsys.readouterr().err
    # Without the CA: the certificate is not trusted.
    assert hosts_cli.main(["--prometheus", gateway.url, "--prometheus.bearer-token-file", str(token)]) == 1
    assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err
    # scaling takes the same flags: the gateway answers (no series: the run has no data, said as such).
    before = len(gateway.seen)
    assert scaling_main.main(["--prometheus", gateway.url, *auth, "job1"]) == 2
    assert len(gateway.seen) > before and all(h.get("X-Scope-OrgID") == "team-a" for h in gateway.seen[before:])
    assert "HTTP 401" not in capsys.readouterr().err


def test_an_empty_token_file_is_an_error(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(promquery.PromError, match="holds no token"):
        promquery.endpoint("http://p:9090", {"prometheus_bearer_token_file": str(empty)})
