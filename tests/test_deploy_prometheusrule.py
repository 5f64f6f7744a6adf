"""deploy/kubernetes/cluster/prometheusrule.yaml: the shipped rules as a Prometheus
Operator PrometheusRule, generated from deploy/prometheus/rules/ by
deploy/kubernetes/generate.py. It must be what the generator writes now (so it cannot
drift from the promtool-tested rules), carry the rule groups unchanged, parse with
promtool, and use only the fields the PrometheusRule CRD (monitoring.coreos.com/v1)
defines; its namespace and `release` label come from cluster/settings.yaml."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "alerts"))
import promcheck

K8S = promcheck.REPO / "deploy" / "kubernetes"
COMMITTED = K8S / "cluster" / "prometheusrule.yaml"
# The fields of spec.groups[] and of a rule in the PrometheusRule CRD (v1).
GROUP_FIELDS = {"name", "interval", "limit", "labels", "partial_response_strategy", "query_offset", "rules"}
RULE_FIELDS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}


def generator():
    spec = importlib.util.spec_from_file_location("k8s_generate", K8S / "generate.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def committed() -> dict:
    return yaml.safe_load(COMMITTED.read_text())


def test_committed_file_is_what_the_generator_writes():
    assert COMMITTED.read_text() == generator().render(), (
        "deploy/kubernetes/cluster/prometheusrule.yaml is stale: run .venv/bin/python deploy/kubernetes/generate.py"
    )


def test_the_up_to_date_check_can_fail(monkeypatch):
    gen = generator()
    real = gen.prometheus_rule()
    real["spec"]["groups"][0]["rules"][0]["for"] = "1m"
    monkeypatch.setattr(gen, "prometheus_rule", lambda: real)
    assert COMMITTED.read_text() != gen.render()


def test_groups_are_the_rule_files_verbatim():
    sources = [
        g
        for p in (promcheck.ALERT_RULES, promcheck.RECORDING_RULES, promcheck.SCALE_RULES)
        for g in yaml.safe_load(p.read_text())["groups"]
    ]
    assert committed()["spec"]["groups"] == sources


def test_rules_parse_with_promtool(tmp_path: Path):
    path = tmp_path / "from-prometheusrule.rules.yml"
    path.write_text(yaml.safe_dump({"groups": committed()["spec"]["groups"]}, sort_keys=False))
    res = promcheck.run([promcheck.promtool(), "check", "rules", str(path)])
    assert res.returncode == 0, res.stdout + res.stderr


def test_envelope_matches_the_crd_and_the_other_manifests():
    doc = committed()
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"} and set(doc["spec"]) == {"groups"}
    for group in doc["spec"]["groups"]:
        assert set(group) <= GROUP_FIELDS, group["name"]
        for rule in group["rules"]:
            assert set(rule) <= RULE_FIELDS and ("alert" in rule) != ("record" in rule), rule
            assert all(isinstance(v, str) for v in {**rule.get("labels", {}), **rule.get("annotations", {})}.values())
    labels = doc["metadata"]["labels"]
    assert labels["app.kubernetes.io/part-of"] == "rank-watchdog" and labels["app.kubernetes.io/name"]
    # The namespace is the kustomization's (cluster/settings.yaml), not the file's.
    assert "namespace" not in doc["metadata"]
    settings = yaml.safe_load((K8S / "cluster" / "settings.yaml").read_text())["data"]
    assert settings["NAMESPACE"] and labels["release"] == settings["RELEASE"]
