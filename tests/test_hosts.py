"""Hosts to avoid across jobs: the coordinator's per-host culprit counters, and
`watchdog hosts` against a real Prometheus running the shipped recording rules."""

from __future__ import annotations

import io
import shlex
import threading
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from prometheus_client import CollectorRegistry, make_wsgi_app
from promserver import Prometheus
from waiting import wait_for

from watchdog.contracts.finding import KINDS
from watchdog.coordinator.cli import hosts as hosts_cli
from watchdog.coordinator.config import Config
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.metrics import CoordinatorMetrics
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.testing import SimJob

RULES = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "rules" / "watchdog-recording.rules.yml"
C = "watchdog_coordinator_host_culprit_findings_total"


def test_a_culprit_finding_counts_against_its_host_only(tmp_path):
    path = str(tmp_path / "j.jsonl")
    c = Coordinator(Config(journal=path, job="job", world_size=8, tick_s=0.5), Journal(path, lambda: (1.7e9, 0.0)))
    try:
        sim = SimJob(jitter=0.1, seed=11)
        sim.hang(5, 40)  # rank 5 lives on host1 (4 ranks per host)
        sim.run_until(40.0, coordinator=c, tick_s=0.5)
        get = c.registry.get_sample_value
        assert get(C, {"training_job": "job", "host": "host1", "cause": "collective_hang"}) == 1
        # host0 was seen, never blamed: its series exists at 0 (so a first failure is an increase).
        assert get(C, {"training_job": "job", "host": "host0", "cause": "collective_hang"}) == 0
    finally:
        c.journal.close()


def test_render_prints_exclude_lines_never_runs_them():
    text = hosts_cli.render(
        [
            {"host": "n7", "score": 2.5, "causes": {"loss_anomaly": 2.0}, "jobs": ["a", "b"]},
            {"host": "n9", "score": 1.25, "causes": {"dead_rank": 1.0}, "jobs": ["c"]},
        ],
        "P",
        1.0,
    )
    assert "sbatch --exclude=n7,n9" in text and "kubectl taint nodes n7 rank-watchdog/suspect=true:NoSchedule" in text
    assert "kubectl cordon n9" in text and "loss_anomaly x2" in text and "jobs a, b" in text
    assert hosts_cli.render([], "P", 1.0).startswith("no suspect hosts")


def test_render_prints_a_drain_line_per_host_quoted_for_the_shell():
    hosts = [
        {"host": "n7", "score": 2.5, "causes": {"loss_anomaly": 2.0, "dead_rank": 1.0}, "jobs": ["a"]},
        {"host": "n9; rm -rf ~", "score": 1.25, "causes": {}, "jobs": []},  # a label is hostile input
    ]
    text = hosts_cli.render(hosts, "P", 1.0)
    lines = [ln for ln in text.split("; scontrol") if "State=DRAIN" in ln]
    assert len(lines) == 2, text
    first = shlex.split(hosts_cli.drain(hosts[0]))
    assert first == [
        "scontrol",
        "update",
        "NodeName=n7",
        "State=DRAIN",
        "Reason=rank-watchdog: suspicion 2.5, culprit in 7 days: loss_anomaly x2, dead_rank x1",
    ]
    second = shlex.split(hosts_cli.drain(hosts[1]))
    assert second[2] == "NodeName=n9; rm -rf ~" and len(second) == 5, second  # one word: nothing else runs


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _serve(registry):
    srv = make_server("127.0.0.1", 0, make_wsgi_app(registry), handler_class=_Quiet)
    threading.Thread(target=srv.serve_forever, daemon=True, name="metrics").start()
    return srv


@pytest.mark.integration
def test_watchdog_hosts_against_a_real_prometheus(tmp_path):
    """Two jobs' coordinators blame n-bad (a hang in one, a NaN loss in the other);
    n-good is seen by both and never blamed: only n-bad is a suspect."""
    if Prometheus.binary() is None:
        pytest.fail("Debian's prometheus is not installed (run .ci/setup)")
    regs = [CollectorRegistry(), CollectorRegistry()]
    mets = [CoordinatorMetrics(r) for r in regs]
    for m, job in zip(mets, ("job-a", "job-b")):
        for host in ("n-bad", "n-good"):
            m.host_culprits.seen(job, host)  # as the coordinator does on host_seen
    servers = [_serve(r) for r in regs]
    prom = Prometheus(
        tmp_path, [f"127.0.0.1:{s.server_port}" for s in servers], scrape_interval_s=0.5, rule_files=[RULES]
    )
    try:
        prom.start()
        wait_for(
            # every kind at 0 for both hosts of both jobs
            lambda: len(prom.query(f"count_over_time({C}[1m]) >= 3")) == 2 * 2 * len(KINDS),
            60,
            what="zeros scraped",
            interval_s=0.5,
        )
        mets[0].host_culprits.inc("job-a", "n-bad", "collective_hang")
        mets[1].host_culprits.inc("job-b", "n-bad", "loss_anomaly")

        def suspects():
            hosts = hosts_cli.suspects(prom.url, 1.0, 5.0)
            # The recorded score trails the inline evidence by a rule evaluation: wait for both.
            return hosts if hosts and hosts[0]["causes"].get("loss_anomaly") and hosts[0]["score"] >= 2 else None

        hosts = wait_for(suspects, 60, what="n-bad a suspect", interval_s=0.5, log=tmp_path / "prometheus.log")
        assert [h["host"] for h in hosts] == ["n-bad"]
        assert hosts[0]["jobs"] == ["job-a", "job-b"] and hosts[0]["causes"]["collective_hang"] >= 1
        out = io.StringIO()
        assert hosts_cli.main(["--prometheus", prom.url], out=out) == 0
        assert "--exclude=n-bad" in out.getvalue() and "n-good" not in out.getvalue()
    finally:
        prom.stop()
        for s in servers:
            s.shutdown()
            s.server_close()
