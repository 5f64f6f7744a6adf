"""Both daemons, as real processes: the standard process_* series, a build_info
with the version, and /metrics gzip-compressed exactly when the scraper asks."""

from __future__ import annotations

import gzip
import urllib.request

import pytest

from watchdog.cli import package_version
from watchdog.dev import localjob

pytestmark = pytest.mark.integration


def scrape(url: str, accept_encoding: str | None) -> tuple[str | None, bytes]:
    req = urllib.request.Request(url + "/metrics")
    if accept_encoding is not None:
        req.add_header("Accept-Encoding", accept_encoding)
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.headers.get("Content-Encoding"), r.read()


def test_process_metrics_build_info_and_gzip(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    coord = localjob.start_coordinator(tmp_path, "job", 2, tmp_path / "j.jsonl")
    try:
        agent = localjob.start_agent(tmp_path, run_dir, "job")
        try:
            for proc, build_info in ((coord, "watchdog_coordinator_build_info"), (agent, "watchdog_agent_build_info")):
                enc, packed = scrape(proc.url, "gzip, deflate")
                assert enc == "gzip", proc.name
                text = gzip.decompress(packed).decode()
                plain_enc, plain = scrape(proc.url, None)
                assert plain_enc is None and plain.startswith(b"# HELP"), proc.name
                assert len(packed) * 3 < len(plain), (proc.name, len(packed), len(plain))
                assert scrape(proc.url, "gzip;q=0")[0] is None, proc.name  # refused explicitly
                for name in (
                    "process_cpu_seconds_total",
                    "process_resident_memory_bytes",
                    "process_start_time_seconds",
                ):
                    assert f"\n{name} " in text, (proc.name, name)
                assert (
                    f'{build_info}{{python_version="' in text or f'{build_info}{{version="{package_version()}"' in text
                )
                assert f'version="{package_version()}"' in text, proc.name
        finally:
            agent.stop()
    finally:
        coord.stop()
