"""TLS and basic auth through --web.config.file (exporter-toolkit's format), end
to end with a self-signed certificate: a real agent reports to a real coordinator
over https (--coordinator.ca-file), and a real Prometheus scrapes the agent over
https with basic auth."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from promserver import Prometheus
from waiting import wait_for

from watchdog import webconfig
from watchdog.dev import localjob

bcrypt = pytest.importorskip("bcrypt")

TOKEN = "0123456789abcdef0123456789abcdef"


def self_signed(tmp_path):
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def get(url: str, ca, headers=None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5, context=ssl.create_default_context(cafile=str(ca))) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.mark.integration
def test_agent_to_coordinator_and_prometheus_to_agent_over_tls(tmp_path):
    if Prometheus.binary() is None:
        pytest.fail("Debian's prometheus is not installed (run .ci/setup)")
    cert, key = self_signed(tmp_path)
    tls = {"tls_server_config": {"cert_file": str(cert), "key_file": str(key)}}
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    (tmp_path / "coord-web.yml").write_text(json.dumps(tls))
    (tmp_path / "agent-web.yml").write_text(json.dumps({**tls, "basic_auth_users": {"prom": hashed}}))
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    coord = localjob.start_coordinator(
        tmp_path, "job", 1, tmp_path / "j.jsonl",
        ["--web.config.file", str(tmp_path / "coord-web.yml"), "--job.token-file", str(token)],
    )  # fmt: skip
    stack: list[Callable[[], object]] = [coord.stop]  # what to stop, last first
    try:
        coord_url = f"https://{coord.address}"
        agent = localjob.start_agent(
            tmp_path, run_dir, "job",
            ["--coordinator.url", coord_url, "--coordinator.ca-file", str(cert), "--job.token-file", str(token),
             "--report.interval-seconds", "0.2", "--web.config.file", str(tmp_path / "agent-web.yml")],
        )  # fmt: skip
        stack.append(agent.stop)
        # agent -> coordinator: reports arrive over TLS, verified against the CA file.
        status = wait_for(
            lambda: (
                (r := get(coord_url + "/api/v1/status", cert, {"Authorization": f"Bearer {TOKEN}"}))[0] == 200
                and json.loads(r[1]).get("hosts")
            ),
            20,
            what="the agent's reports at the coordinator over https",
            log=agent.log_path,
        )
        assert status, status
        # watchdog status, the person's view, with the CA file.
        got = subprocess.run(
            [sys.executable, "-m", "watchdog.cli", "status", "--coordinator.url", coord_url, "--json",
             "--coordinator.ca-file", str(cert), "--job.token-file", str(token)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert got.returncode == 0 and json.loads(got.stdout)["hosts"], got.stderr
        assert get(coord_url + "/metrics", cert)[0] == 200  # no users: no auth on the coordinator's /metrics
        with pytest.raises(OSError):  # an https port does not speak plain HTTP (the connection is dropped)
            urllib.request.urlopen(f"http://{coord.address}/healthz", timeout=5).read()
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # nor trusts an unknown CA
            urllib.request.urlopen(coord_url + "/healthz", timeout=5, context=ssl.create_default_context()).read()
        # The agent's /metrics: basic auth; its probes: none.
        agent_url = f"https://{agent.address}"
        assert get(agent_url + "/metrics", cert)[0] == 401
        assert get(agent_url + "/metrics", cert, basic("prom", "wrong"))[0] == 401
        code, body = get(agent_url + "/metrics", cert, basic("prom", "s3cret"))
        assert code == 200 and b"watchdog_agent_build_info" in body
        assert get(agent_url + "/healthz", cert)[0] == 200
        # Prometheus -> agent over TLS with basic auth.
        prom = Prometheus(
            tmp_path,
            [agent.address],
            scrape_interval_s=0.5,
            scrape_extra=(
                f"    scheme: https\n    tls_config:\n      ca_file: {cert}\n"
                f"    basic_auth:\n      username: prom\n      password: s3cret\n"
            ),
        ).start()
        stack.append(prom.stop)
        up = wait_for(lambda: prom.query("up == 1"), 20, what="Prometheus scraping the agent over https")
        assert up[0]["metric"]["instance"] == agent.address
        assert prom.query("watchdog_agent_build_info")
    finally:
        for stop in reversed(stack):
            stop()


def test_web_config_mistakes_are_clear(tmp_path):
    bad = tmp_path / "web.yml"
    bad.write_text(json.dumps({"tls_server_config": {"cert_file": str(tmp_path / "none.crt")}}))
    with pytest.raises(webconfig.WebConfigError, match="cert_file and key_file"):
        webconfig.load(str(bad))
    bad.write_text(json.dumps({"basic_auth_users": {"prom": "plain-password"}}))
    with pytest.raises(webconfig.WebConfigError, match="not a bcrypt hash"):
        webconfig.load(str(bad))
    bad.write_text(json.dumps({"tls_srever_config": {}}))
    with pytest.raises(webconfig.WebConfigError, match="unknown key"):
        webconfig.load(str(bad))


def test_basic_auth_checks():
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))
    web = webconfig.WebConfig(users={"prom": hashed})
    assert web.allowed(basic("prom", "pw")["Authorization"])
    assert web.allowed(basic("prom", "pw")["Authorization"])  # cached
    for header in ("", "Bearer x", basic("prom", "nope")["Authorization"], basic("other", "pw")["Authorization"],
                   "Basic !!!notbase64"):  # fmt: skip
        assert not web.allowed(header), header
    assert webconfig.WebConfig().allowed("")  # no users: open
