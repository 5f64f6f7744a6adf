"""Grafana provisioning (grafana/provisioning/): the files have the structure Grafana's
file provisioning expects, the alert rules' PromQL parses and uses golden metrics, and
the Grafana-managed alerts stay in step with the Prometheus rules (the tested source
of truth): same names, expressions, durations, severities, summaries, runbooks."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "alerts"))
import promcheck

PROV = promcheck.REPO / "grafana" / "provisioning"
DATASOURCE_UID = "watchdog-prometheus"
KEY_ALERTS = {
    "RankWatchdogJobHang",
    "RankWatchdogRankDead",
    "RankWatchdogRankFrozen",
    "RankWatchdogStraggler",
    "RankWatchdogRankDataStarvation",
    "RankWatchdogJobDataStarvation",
}
DURATION = re.compile(r"^(\d+[smhd])+$")


def load(rel: str) -> dict:
    doc = yaml.safe_load((PROV / rel).read_text())
    assert doc["apiVersion"] == 1, rel
    return doc


@pytest.fixture(scope="module")
def grafana_rules() -> list[dict]:
    groups = load("alerting/rank-watchdog-alerts.yml")["groups"]
    for g in groups:
        assert {"orgId", "name", "folder", "interval"} <= set(g), g.get("name")
        assert DURATION.match(g["interval"])
    return [r for g in groups for r in g["rules"]]


def test_datasource_and_dashboard_provider():
    ds = load("datasources/rank-watchdog.yml")["datasources"]
    assert [(d["uid"], d["type"]) for d in ds] == [(DATASOURCE_UID, "prometheus")]
    providers = load("dashboards/rank-watchdog.yml")["providers"]
    assert providers[0]["type"] == "file" and providers[0]["options"]["path"]


def test_alert_rule_structure(grafana_rules):
    uids = [r["uid"] for r in grafana_rules]
    assert len(uids) == len(set(uids))
    for r in grafana_rules:
        name = r["title"]
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", r["uid"]), name
        refs = {d["refId"]: d for d in r["data"]}
        assert r["condition"] in refs, name
        query, cond = refs["A"], refs[r["condition"]]
        assert query["datasourceUid"] == DATASOURCE_UID and query["model"]["expr"], name
        assert query["model"]["instant"] is True and query["relativeTimeRange"]["from"] > 0, name
        assert cond["datasourceUid"] == "__expr__" and cond["model"]["type"] == "math", name
        assert "$A" in cond["model"]["expression"], name
        assert r["noDataState"] == "OK", f"{name}: no series means nothing fires"
        assert r["execErrState"] in ("Error", "Alerting", "OK", "KeepLast"), name
        assert DURATION.match(r["for"]), name
        assert {"summary", "description", "runbook_url"} <= set(r["annotations"]), name
        assert r["labels"]["severity"] in ("critical", "warning"), name


def test_alert_rule_exprs_parse_and_use_golden_metrics(grafana_rules, tmp_path):
    exprs = {r["title"]: r["data"][0]["model"]["expr"] for r in grafana_rules}
    assert promcheck.check_exprs(exprs, tmp_path) == ""
    allowed = promcheck.golden_metric_names() | promcheck.PROMETHEUS_BUILTINS
    for name, expr in exprs.items():
        assert not promcheck.metric_names(expr) - allowed, name


def test_grafana_alerts_match_the_prometheus_rules(grafana_rules):
    prom = {r["alert"]: r for r in promcheck.alert_rules()}
    titles = {r["title"] for r in grafana_rules}
    assert titles >= KEY_ALERTS, f"missing in Grafana: {KEY_ALERTS - titles}"
    for r in grafana_rules:
        p = prom.get(r["title"])
        assert p is not None, f"{r['title']}: no Prometheus rule of that name"
        assert promcheck.normalize(r["data"][0]["model"]["expr"]) == promcheck.normalize(p["expr"]), r["title"]
        assert r["for"] == p.get("for", "0s"), r["title"]
        assert r["labels"] == p["labels"], r["title"]
        for key in ("summary", "runbook_url"):
            assert r["annotations"][key] == p["annotations"][key], (r["title"], key)
        # Grafana's templating has no `query` and names the value $values.A.Value.
        desc = r["annotations"]["description"]
        assert "| query" not in desc and not re.search(r"\$value\b", desc), r["title"]


def test_sync_check_notices_drift(grafana_rules):
    prom = {r["alert"]: r for r in promcheck.alert_rules()}
    drifted = dict(grafana_rules[0], data=[{"model": {"expr": prom[grafana_rules[0]["title"]]["expr"] + " > 1"}}])
    assert promcheck.normalize(drifted["data"][0]["model"]["expr"]) != promcheck.normalize(
        prom[drifted["title"]]["expr"]
    )


def test_notifications_mirror_alertmanager_and_keep_secrets_in_files():
    doc = load("alerting/rank-watchdog-notifications.yml")
    names = {c["name"] for c in doc["contactPoints"]}
    uids = [rcv["uid"] for c in doc["contactPoints"] for rcv in c["receivers"]]
    assert len(uids) == len(set(uids))
    for c in doc["contactPoints"]:
        for rcv in c["receivers"]:
            for key in ("integrationKey", "url", "token", "apiKey"):
                if key in rcv["settings"]:
                    assert re.fullmatch(r"\$__(file|env)\{[^}]+\}", rcv["settings"][key]), (c["name"], key)
    policy = doc["policies"][0]
    assert policy["receiver"] in names and all(r["receiver"] in names for r in policy["routes"])

    am = yaml.safe_load((promcheck.REPO / "deploy" / "alertmanager" / "alertmanager.yml").read_text())["route"]
    assert policy["receiver"] == am["receiver"] and policy["group_by"] == am["group_by"]

    def route(routes: list[dict], matchers_key: str, severity: str) -> tuple:
        return next((r["receiver"], r.get("group_by")) for r in routes if f"{severity}" in str(r[matchers_key]))

    for severity in ("critical", "warning"):
        assert route(policy["routes"], "object_matchers", severity) == route(am["routes"], "matchers", severity)
