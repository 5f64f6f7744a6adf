"""The shipped Prometheus rules (deploy/prometheus/rules/): they load, every alert is
unit-tested with promtool both firing and not firing, every metric they use is in the
golden files, every alert says who/what/where and links an existing runbook."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "alerts"))
import promcheck

FIXTURES = Path(__file__).parent / "fixtures" / "alerts"
TEST_FILES = sorted(FIXTURES.glob("*.test.yml"))
ALERTS = promcheck.alert_rules()
ALERT_NAMES = [r["alert"] for r in ALERTS]


def test_rules_load_with_promtool():
    res = promcheck.run(
        [
            promcheck.promtool(),
            "check",
            "rules",
            str(promcheck.ALERT_RULES),
            str(promcheck.RECORDING_RULES),
            str(promcheck.SCALE_RULES),
        ]
    )
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests(test_file: Path):
    # cwd = the fixture dir: rule_files are relative to it.
    res = promcheck.run([promcheck.promtool(), "test", "rules", test_file.name], cwd=FIXTURES)
    assert res.returncode == 0, res.stdout + res.stderr


def _alert_cases() -> dict[str, dict[str, list]]:
    """alertname -> {"fires": [exp_labels...], "quiet": [...]} over every test file."""
    out: dict[str, dict[str, list]] = {}
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                slot = out.setdefault(case["alertname"], {"fires": [], "quiet": []})
                exp = case.get("exp_alerts") or []
                if exp:
                    slot["fires"].extend(a["exp_labels"] for a in exp)
                else:
                    slot["quiet"].append(case["eval_time"])
    return out


def test_every_alert_is_tested_firing_and_quiet():
    cases = _alert_cases()
    assert set(cases) <= set(ALERT_NAMES), f"tests for unknown alerts: {set(cases) - set(ALERT_NAMES)}"
    for name in ALERT_NAMES:
        assert cases.get(name, {}).get("fires"), f"{name}: no promtool case where it fires"
        assert cases.get(name, {}).get("quiet"), f"{name}: no promtool case where it must not fire"


def test_a_checkpoint_pause_is_tested_not_to_page():
    text = (FIXTURES / "rank_faults.test.yml").read_text()
    assert 'phase="checkpoint"}' in text and "a long checkpoint does not page" in text


def test_alerts_have_severity_summary_description_and_runbook():
    cases = _alert_cases()
    docs = promcheck.REPO / "docs" / "runbooks"
    assert len(set(ALERT_NAMES)) == len(ALERT_NAMES), "duplicate alert names"
    for rule in ALERTS:
        name, ann = rule["alert"], rule.get("annotations", {})
        assert rule.get("labels", {}).get("severity") in ("critical", "warning"), name
        assert {"summary", "description", "runbook_url"} <= set(ann), name
        assert ann["runbook_url"] == f"{promcheck.RUNBOOK_BASE}{name}.md", name
        assert (docs / f"{name}.md").is_file(), f"{name}: docs/runbooks/{name}.md missing"
        summary = ann["summary"]
        assert (
            "{{ $labels.training_job }}" in summary or "{{ $labels.host }}" in summary or "$labels.instance" in summary
        ), name
        # An alert whose series name a rank must say which rank and where.
        if any("rank" in labels for labels in cases[name]["fires"]):
            assert "{{ $labels.rank }}" in summary and "{{ $labels.host }}" in summary, name
        assert "\n" not in summary and len(summary) < 120, f"{name}: a summary is one short line"


def test_rules_use_only_golden_metrics():
    golden = promcheck.golden_metric_names()
    allowed = golden | promcheck.PROMETHEUS_BUILTINS
    recorded = promcheck.recording_names()
    for rule in promcheck.load_rules(promcheck.RECORDING_RULES) + promcheck.load_rules(promcheck.SCALE_RULES):
        unknown = promcheck.metric_names(rule["expr"]) - allowed - recorded
        assert not unknown, f"{rule['record']}: not in {promcheck.golden_files()}: {sorted(unknown)}"
    for rule in ALERTS:
        # Alerts must not depend on the recording rules (Grafana reuses them verbatim).
        used = promcheck.metric_names(rule["expr"])
        for q in re.findall(r'printf "((?:[^"\\]|\\.)*)"', rule["annotations"]["description"]):
            used |= promcheck.metric_names(q.replace('\\"', '"').replace("%q", '"x"'))
        unknown = used - allowed
        assert not unknown, f"{rule['alert']}: not in {promcheck.golden_files()}: {sorted(unknown)}"


def test_recording_rule_names_are_unique_across_files():
    names = [
        r["record"] for path in (promcheck.RECORDING_RULES, promcheck.SCALE_RULES) for r in promcheck.load_rules(path)
    ]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_every_scale_rule_is_unit_tested():
    tested = (FIXTURES / "scale-recording.test.yml").read_text()
    for rule in promcheck.load_rules(promcheck.SCALE_RULES):
        assert f"expr: {rule['record']}" in tested, f"{rule['record']}: no promtool case"


def test_metric_name_extraction():
    expr = (
        'min by (job) (watchdog_rank_step_age_seconds{phase=~"a|b"} and watchdog_rank_alive == 1) '
        "> on (job) clamp_min(10 * max by (job) (rate(x_total[5m] offset 1m)), 1.2e3) "
        '* on (instance) group_left (job) label_replace(up, "a", "$1", "b", "(.*)") unless foo:bar:rate1m'
    )
    assert promcheck.metric_names(expr) == {
        "watchdog_rank_step_age_seconds",
        "watchdog_rank_alive",
        "x_total",
        "up",
        "foo:bar:rate1m",
    }
    assert promcheck.metric_names("sum(rate(a[1m])) by (job) / ignoring (part) group_right () b") == {"a", "b"}


def test_golden_files_are_read():
    names = promcheck.golden_metric_names()
    assert "watchdog_rank_alive" in names and "watchdog_rank_steps_total" in names


def test_fixture_series_carry_the_labels_a_scrape_gives_them():
    """Per-rank and per-job input series name their training job as `training_job` (the
    agent's label) and the scrape job as `job`; a fixture still keyed on `job` would let
    a rule aggregating by training_job pass for the wrong reason."""
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for series in test.get("input_series", []):
                name, _, labels = series["series"].partition("{")
                if name.startswith(("watchdog_rank_", "watchdog_job_")):
                    assert 'training_job="' in labels, f"{path.name}: {series['series']}"
                if name.startswith("watchdog_"):
                    assert re.search(r'\bjob="watchdog-(agent|coordinator)"', labels), (
                        f"{path.name}: {series['series']}"
                    )
