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
