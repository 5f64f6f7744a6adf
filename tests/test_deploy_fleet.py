"""The fleet-view examples (deploy/prometheus/fleet/): federation and remote write
pass `promtool check config`, and both select exactly the recording rules' job-
and host-level outputs and the coordinators' job-level series: every such name
the shipped rules record goes out, no per-rank series and no raw agent series
does. (tests/test_two_jobs.py federates for real with federate.yml.)"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "alerts"))
import promcheck

FLEET = promcheck.REPO / "deploy" / "prometheus" / "fleet"
FEDERATE = FLEET / "federate.yml"
REMOTE_WRITE = FLEET / "remote-write.yml"
# The fleet view's inputs: one series per job or per host, whatever the job's size.
FLEET_RULES = re.compile(r"(job|host|host_cause):watchdog_.+")


@pytest.mark.parametrize("path", [FEDERATE, REMOTE_WRITE], ids=lambda p: p.name)
def test_config_is_valid(path: Path):
    res = promcheck.run([promcheck.promtool(), "check", "config", str(path)])
    assert res.returncode == 0, res.stdout + res.stderr


def federated(name: str, alertname: str = "") -> bool:
    """Whether one of federate.yml's match[] selectors selects a series of this name."""
    (sc,) = yaml.safe_load(FEDERATE.read_text())["scrape_configs"]
    for sel in sc["params"]["match[]"]:
        matchers = dict(re.findall(r'(\w+)=~?"([^"]*)"', sel))
        ops = dict(re.findall(r"(\w+)(=~?)", sel))
        ok = True
        for label, value in matchers.items():
            got = name if label == "__name__" else alertname
            ok &= bool(re.fullmatch(value, got)) if ops[label] == "=~" else got == value
        if ok:
            return True
    return False


def written(name: str, alertname: str = "") -> bool:
    """Whether remote-write.yml's write_relabel_configs keep a series of this name."""
    (rw,) = yaml.safe_load(REMOTE_WRITE.read_text())["remote_write"]
    labels = {"__name__": name, "alertname": alertname}
    for rule in rw["write_relabel_configs"]:
        value = rule.get("separator", ";").join(labels.get(lab, "") for lab in rule["source_labels"])
        hit = re.fullmatch(rule["regex"], value) is not None  # Prometheus anchors relabel regexes
        if (rule["action"] == "keep" and not hit) or (rule["action"] == "drop" and hit):
            return False
    return True


@pytest.mark.parametrize("selects", [federated, written], ids=["federate", "remote_write"])
def test_the_aggregates_go_out_and_the_per_rank_series_stay(selects):
    records = promcheck.recording_names()
    fleet = {n for n in records if FLEET_RULES.fullmatch(n)}
    assert len(fleet) >= 20  # both rule files' job- and host-level outputs
    for name in fleet:
        assert selects(name), f"{name}: a fleet aggregate left behind"
    golden = promcheck.golden_metric_names()
    raw = {n for n in golden if n.startswith(("watchdog_rank_", "watchdog_host_", "watchdog_accelerator_"))}
    for name in sorted(raw | (records - fleet)):
        assert not selects(name), f"{name}: a per-rank or raw series sent to the fleet store"
    assert selects("watchdog_coordinator_info") and selects("watchdog_coordinator_findings_total")
    assert selects("ALERTS", "RankWatchdogJobHang") and not selects("ALERTS", "NodeDiskFull")


def test_the_coordinator_series_they_name_exist():
    golden = promcheck.golden_metric_names()
    for text in (FEDERATE.read_text(), REMOTE_WRITE.read_text()):
        for group in re.findall(r"watchdog_coordinator_\(([^)]*)\)", text):
            for suffix in group.split("|"):
                assert f"watchdog_coordinator_{suffix}" in golden, suffix


def test_the_selection_check_can_fail():
    assert not written("watchdog_rank_alive") and not federated("rank:watchdog_step_seconds:mean1m")
