"""The example Alertmanager routing (deploy/alertmanager/): it loads with its
templates, every shipped alert reaches the receiver its severity promises, the
templates render, and no secret is written inline."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "alerts"))
import promcheck

AM_DIR = promcheck.REPO / "deploy" / "alertmanager"
CONFIG = AM_DIR / "alertmanager.yml"
TEMPLATE = AM_DIR / "templates" / "watchdog.tmpl"
RECEIVER_FOR = {"critical": "oncall-pager", "warning": "team-chat"}


def amtool() -> str:
    path = shutil.which("amtool")
    if path is None:
        raise AssertionError("amtool not found: install Debian's prometheus-alertmanager (bash .ci/setup)")
    return path


@pytest.fixture
def config_with_local_templates(tmp_path: Path) -> Path:
    """The config with its template glob pointed at the repo's file, so
    check-config really parses the template instead of globbing nothing."""
    doc = yaml.safe_load(CONFIG.read_text())
    assert doc["templates"] == ["/etc/alertmanager/templates/watchdog.tmpl"]
    doc["templates"] = [str(TEMPLATE)]
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_config_and_templates_load(config_with_local_templates: Path):
    res = promcheck.run([amtool(), "check-config", str(config_with_local_templates)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 templates" in res.stdout


@pytest.mark.parametrize("rule", promcheck.alert_rules(), ids=lambda r: r["alert"])
def test_each_alert_routes_by_severity(rule: dict):
    severity = rule["labels"]["severity"]
    res = promcheck.run(
        [
            amtool(),
            "config",
            "routes",
            "test",
            f"--config.file={CONFIG}",
            f"--verify.receivers={RECEIVER_FOR[severity]}",
            f"alertname={rule['alert']}",
            f"severity={severity}",
            "training_job=train",
            "rank=1",
        ]
    )
    assert res.returncode == 0, f"{rule['alert']} ({severity}): {res.stdout}{res.stderr}"


def test_the_routes_test_can_fail():
    res = promcheck.run(
        [
            amtool(),
            "config",
            "routes",
            "test",
            f"--config.file={CONFIG}",
            "--verify.receivers=oncall-pager",
            "alertname=RankWatchdogStraggler",
            "severity=warning",
        ]
    )
    assert res.returncode != 0


def test_templates_render():
    res = promcheck.run(
        [
            amtool(),
            "template",
            "render",
            f"--template.glob={TEMPLATE}",
            '--template.text={{ template "watchdog.title" . }}|{{ template "watchdog.text" . }}',
        ]
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Runbook:" in res.stdout


def test_no_inline_secrets():
    doc = yaml.safe_load(CONFIG.read_text())
    secret_keys = {"routing_key", "service_key", "api_url", "api_key", "auth_password", "bot_token", "url"}

    def walk(node, path=""):
        if isinstance(node, dict):
            for k, v in node.items():
                assert k not in secret_keys, f"{path}.{k}: put secrets in a file (*_file), not in the config"
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(doc)


# kube-prometheus ships an always-firing dead-man's switch named `Watchdog`
# (severity "none") and routes it with `alertname = Watchdog` to its own receiver;
# operators silence or reroute it with `alertname =~ "Watchdog.*"`. Alertmanager
# anchors regex matchers, so neither may catch our RankWatchdog* alerts, and our
# routes (alertname =~ "RankWatchdog.*") must not catch the dead-man's switch.
KUBE_PROMETHEUS_ROUTES = [
    {"receiver": "deadmans-switch", "matchers": ['alertname = "Watchdog"']},
    {"receiver": "deadmans-switch-regex", "matchers": ['alertname =~ "Watchdog.*"']},
]


@pytest.fixture
def merged_with_kube_prometheus(tmp_path: Path) -> Path:
    """Our routes appended after kube-prometheus' Watchdog routes in one tree: the
    first matching route wins, so a kube-prometheus matcher that caught our alerts
    would take them away from our receivers."""
    doc = yaml.safe_load(CONFIG.read_text())
    doc.pop("templates")
    doc["route"]["routes"] = KUBE_PROMETHEUS_ROUTES + doc["route"]["routes"]
    doc["receivers"] += [{"name": r["receiver"]} for r in KUBE_PROMETHEUS_ROUTES]
    path = tmp_path / "merged.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def routes_test(config: Path, receiver: str, *labels: str) -> subprocess.CompletedProcess:
    return promcheck.run(
        [amtool(), "config", "routes", "test", f"--config.file={config}", f"--verify.receivers={receiver}", *labels]
    )


@pytest.mark.parametrize("rule", promcheck.alert_rules(), ids=lambda r: r["alert"])
def test_kube_prometheus_watchdog_routes_do_not_catch_ours(merged_with_kube_prometheus: Path, rule: dict):
    severity = rule["labels"]["severity"]
    assert not rule["alert"].startswith("Watchdog"), rule["alert"]
    res = routes_test(
        merged_with_kube_prometheus,
        RECEIVER_FOR[severity],
        f"alertname={rule['alert']}",
        f"severity={severity}",
        "training_job=train",
        "rank=1",
    )
    assert res.returncode == 0, f"{rule['alert']}: {res.stdout}{res.stderr}"


def test_the_dead_mans_switch_keeps_its_route(merged_with_kube_prometheus: Path):
    res = routes_test(merged_with_kube_prometheus, "deadmans-switch", "alertname=Watchdog", "severity=none")
    assert res.returncode == 0, res.stdout + res.stderr


def test_our_routes_do_not_catch_the_dead_mans_switch():
    """Alone, our config sends kube-prometheus' `Watchdog` to the root receiver, never to
    the pager, even were it labelled critical."""
    for severity in ("none", "critical"):
        res = routes_test(CONFIG, "team-chat", "alertname=Watchdog", f"severity={severity}")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "oncall-pager" not in res.stdout


def test_the_kube_prometheus_check_can_fail(merged_with_kube_prometheus: Path):
    """An alert still named Watchdog* would be taken by the dead-man's-switch route."""
    res = routes_test(merged_with_kube_prometheus, "oncall-pager", "alertname=WatchdogRankFrozen", "severity=critical")
    assert res.returncode != 0
    assert "deadmans-switch-regex" in res.stdout


def test_pages_group_and_inhibit_per_training_job():
    """`job` is the scrape job (no honor_labels): grouping or inhibiting on it would put
    every training job behind one page, and one job's dead rank would silence another
    job's hang. The training job is (training_job, namespace, cluster)."""
    doc = yaml.safe_load(CONFIG.read_text())
    key = ["training_job", "namespace", "cluster"]
    routes = [doc["route"], *doc["route"]["routes"]]
    for route in routes:
        if "group_by" in route:
            assert route["group_by"][:3] == key and "job" not in route["group_by"], route
    for rule in doc["inhibit_rules"]:
        assert rule["equal"] == key, rule
