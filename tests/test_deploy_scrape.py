"""The Prometheus scrape examples (deploy/prometheus/scrape/) pass `promtool check
config` and keep the two things the rules depend on: no honor_labels (`job` and
`instance` stay Prometheus'; the training job is the agents' `training_job`), no
target label that would rename an agent label, and the watchdog_component target
label."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from watchdog.agent.export.metrics import GPU_LABELS, RANK_LABELS

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "alerts"))
import promcheck

SCRAPE = promcheck.REPO / "deploy" / "prometheus" / "scrape"
CONFIGS = sorted(SCRAPE.glob("*.yml"))


def check_config(doc: dict, tmp_path: Path) -> None:
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = promcheck.run([promcheck.promtool(), "check", "config", str(path)])
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_scrape_config_is_valid(path: Path, tmp_path: Path):
    doc = yaml.safe_load(path.read_text())
    for sc in doc["scrape_configs"]:
        # Debian's Prometheus is built without Kubernetes discovery, so promtool
        # rejects the key itself: stand in a static target carrying the pod meta
        # labels, which still checks every relabel rule and the rest of the file.
        if sc.pop("kubernetes_sd_configs", None) is not None:
            sc["static_configs"] = [
                {
                    "targets": ["10.0.0.1:19400"],
                    "labels": {
                        "__meta_kubernetes_pod_container_port_name": "watchdog-agent",
                        "__meta_kubernetes_pod_node_name": "node-1",
                    },
                }
            ]
    check_config(doc, tmp_path)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_no_job_honors_labels_and_each_names_its_component(path: Path):
    doc = yaml.safe_load(path.read_text())
    agent_labels = set(RANK_LABELS) | set(GPU_LABELS)
    for sc in doc["scrape_configs"]:
        where = f"{path.name}/{sc['job_name']}"
        assert not sc.get("honor_labels"), f"{where}: honor_labels would let scraped labels overwrite job/instance"
        targets = {r.get("target_label") for r in sc.get("relabel_configs", [])}
        targets |= {k for c in sc.get("static_configs", []) for k in c.get("labels", {})}
        assert not targets & agent_labels, f"{where}: target labels {targets & agent_labels} rename the agent's"
        text = json.dumps(sc)
        assert "watchdog_component" in text or "file_sd_configs" in sc, f"{path.name}/{sc['job_name']}"


def test_file_sd_example_targets_name_their_component():
    entries = json.loads((SCRAPE / "targets.example.json").read_text())
    assert {e["labels"]["watchdog_component"] for e in entries} == {"agent", "coordinator"}
    assert not {k for e in entries for k in e["labels"]} & (set(RANK_LABELS) | set(GPU_LABELS))
    assert all(":" in t for e in entries for t in e["targets"])


def test_static_example_loads_the_shipped_rules_path():
    doc = yaml.safe_load((SCRAPE / "static.yml").read_text())
    assert doc["rule_files"] == ["/etc/prometheus/rank-watchdog/*.rules.yml"]
