"""The example Alertmanager routing (deploy/alertmanager/): it loads with its
templates, every shipped alert reaches the receiver its severity promises, the
templates render, and no secret is written inline."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "alerts"))
import promcheck  # noqa: E402

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
    res = promcheck.run([amtool(), "config", "routes", "test", f"--config.file={CONFIG}",
                         f"--verify.receivers={RECEIVER_FOR[severity]}",
                         f"alertname={rule['alert']}", f"severity={severity}", "job=train", "rank=1"])
    assert res.returncode == 0, f"{rule['alert']} ({severity}): {res.stdout}{res.stderr}"


def test_the_routes_test_can_fail():
    res = promcheck.run([amtool(), "config", "routes", "test", f"--config.file={CONFIG}",
                         "--verify.receivers=oncall-pager", "alertname=WatchdogStraggler", "severity=warning"])
    assert res.returncode != 0


def test_templates_render():
    res = promcheck.run([amtool(), "template", "render", f"--template.glob={TEMPLATE}",
                         '--template.text={{ template "watchdog.title" . }}|{{ template "watchdog.text" . }}'])
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
