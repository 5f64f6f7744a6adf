"""Metric names are an API: pinned by a golden file and linted by promtool."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from watchdog.coordinator.metrics import CoordinatorMetrics

GOLDEN = Path(__file__).parent / "golden" / "coordinator_metrics.txt"


def exposition() -> str:
    registry = CollectorRegistry()
    CoordinatorMetrics(registry)
    return generate_latest(registry).decode()


def names_types_help() -> str:
    """HELP and TYPE lines, without client_python's *_created families (they come
    and go with PROMETHEUS_DISABLE_CREATED_SERIES; they are not our names)."""
    lines = [line for line in exposition().splitlines() if line.startswith(("# HELP", "# TYPE"))]
    return "".join(line + "\n" for line in lines if not line.split()[2].endswith("_created"))


def test_golden_metric_names():
    got = names_types_help()
    if os.environ.get("WATCHDOG_UPDATE_GOLDEN"):
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text(), "metric names changed: they are an API (WATCHDOG_UPDATE_GOLDEN=1 to accept)"


def test_every_name_is_namespaced_and_suffixed():
    for line in names_types_help().splitlines():
        if line.startswith("# TYPE"):
            _, _, name, kind = line.split()
            assert name.startswith("watchdog_")
            if kind == "counter":
                assert name.endswith("_total")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_lint():
    out = subprocess.run(
        ["promtool", "check", "metrics"], input=exposition(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_only_the_info_series_names_the_training_job():
    """The coordinator adopts its training job from the first report, so one series
    carries it (`training_job`, joined on the scrape target); `job`/`instance` are
    Prometheus' target labels and no series may carry them."""
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    CoordinatorMetrics(registry).info.labels("train").set(1)
    samples = [s for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples]
    assert not [s for s in samples if {"job", "instance", "exported_job"} & set(s.labels)]
    assert [s.labels for s in samples if s.name == "watchdog_coordinator_info"] == [{"training_job": "train"}]


def test_metrics_endpoint_text_is_what_prometheus_client_writes_as_culprit_series_change():
    """/metrics keeps the per-host culprit series' text between changes: it must
    equal a plain ``generate_latest`` after every kind of change, hostile host
    names (quotes, backslashes, newlines) included."""
    from watchdog.contracts.finding import KINDS

    registry = CollectorRegistry()
    m = CoordinatorMetrics(registry)
    assert m.exposition() == generate_latest(registry)
    hosts = ["n0", 'n"1', "n\\2", "n\n3", "nø4"]
    for i, host in enumerate(hosts):
        m.host_culprits.seen("job", host)
        assert m.exposition() == generate_latest(registry)
        m.host_culprits.inc("job", host, KINDS[i % len(KINDS)])
        m.host_culprits.inc("job", hosts[0], "dead_rank")
        assert m.exposition() == generate_latest(registry)
    m.host_culprits.seen("job", "n0")  # seen again (an agent restarted): nothing changes
    assert m.exposition() == m.exposition() == generate_latest(registry)
    get = registry.get_sample_value
    name = "watchdog_coordinator_host_culprit_findings_total"
    assert get(name, {"training_job": "job", "host": "n0", "cause": "dead_rank"}) == len(hosts) + (
        KINDS[0] == "dead_rank"
    )
    assert get(name, {"training_job": "job", "host": "n\n3", "cause": KINDS[3]}) == 1
    assert get(name, {"training_job": "job", "host": "n\n3", "cause": KINDS[4]}) == 0
