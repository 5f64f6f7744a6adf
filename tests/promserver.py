"""A real Prometheus (Debian's `prometheus`) for integration tests: loopback only,
its own temp storage, a fast scrape interval, stopped at teardown."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from watchdog.dev.localjob import free_port


class Prometheus:
    def __init__(
        self, work_dir: Path, targets: list[str], scrape_interval_s: float = 1.0, rule_files=(), scrape_extra: str = ""
    ):
        """``scrape_extra``: YAML lines for the scrape job, indented 4 (scheme, tls_config, basic_auth)."""
        self.work_dir = work_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        rules = "".join(f"\n  - {Path(r).resolve()}" for r in rule_files)
        config = f"""
global:
  scrape_interval: {round(scrape_interval_s * 1000)}ms
  evaluation_interval: {round(scrape_interval_s * 1000)}ms
rule_files:{rules or " []"}
scrape_configs:
  - job_name: watchdog-agent
    static_configs:
      - targets: {json.dumps(targets)}
{scrape_extra}"""
        (work_dir / "prometheus.yml").write_text(config)
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def binary() -> str | None:
        return shutil.which("prometheus")

    def start(self, timeout_s: float = 30.0) -> Prometheus:
        binary = self.binary()
        assert binary is not None, "prometheus is not on PATH"
        log = open(self.work_dir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={self.work_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.work_dir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(
            "prometheus did not become ready:\n" + (self.work_dir / "prometheus.log").read_text()[-3000:]
        )

    def query(self, promql: str) -> list[dict]:
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
