"""The Grafana dashboards (grafana/dashboards/*.json): generated and committed in
step, every PromQL expression parses (promtool) and uses only golden metric names or
the shipped recording rules, panel ids and grid positions are unique, no panel can
return a series per rank of a whole large job, and grafana-foundation-sdk (the 11.6
schema) reads them back without dropping or changing a key."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "alerts"))
import promcheck

GRAFANA = promcheck.REPO / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))


def load_generator():
    spec = importlib.util.spec_from_file_location("grafana_generate", GRAFANA / "generate.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def substitute(expr: str) -> str:
    """Grafana variables -> values promtool accepts: intervals become a duration,
    every other variable a regex-and-string-safe '.*'."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}", "5m", expr)
    return re.sub(r"\$\{\w+(:\w+)?\}|\$\w+", ".*", expr)


def dashboard_exprs(doc: dict) -> dict[str, str]:
    """Every PromQL expression in a dashboard, keyed by where it is."""
    out = {}
    for p in doc["panels"]:
        for t in p.get("targets", []):
            out[f"panel {p['id']} {p['title']!r} {t['refId']}"] = t["expr"]
    for a in doc["annotations"]["list"]:
        if "expr" in a:
            out[f"annotation {a['name']!r}"] = a["expr"]
    for v in doc["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"]["query"])
            assert m, f"variable {v['name']}: expected label_values(selector, label)"
            out[f"variable {v['name']}"] = m.group(1)
    return out


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    assert len(DASHBOARDS) == 2, DASHBOARDS
    return {p.name: json.loads(p.read_text()) for p in DASHBOARDS}


def test_committed_files_match_the_generator():
    for path, text in load_generator().outputs().items():
        assert path.read_text() == text, (
            f"{path.relative_to(promcheck.REPO)} is stale: run .venv/bin/python grafana/generate.py"
        )


def test_every_expression_parses(docs, tmp_path):
    exprs = {
        f"{name}: {where}": substitute(e) for name, doc in docs.items() for where, e in dashboard_exprs(doc).items()
    }
    assert len(exprs) > 40
    assert promcheck.check_exprs(exprs, tmp_path) == ""


def test_the_parse_check_can_fail(tmp_path):
    assert promcheck.check_exprs({"bad": "sum(rate(x[5m])"}, tmp_path) != ""


def test_every_metric_is_in_the_golden_files_or_a_shipped_rule(docs):
    allowed = promcheck.golden_metric_names() | promcheck.PROMETHEUS_BUILTINS | promcheck.recording_names()
    for name, doc in docs.items():
        for where, expr in dashboard_exprs(doc).items():
            unknown = promcheck.metric_names(substitute(expr)) - allowed
            assert not unknown, f"{name} {where}: not in {promcheck.golden_files()} or the rules: {sorted(unknown)}"


# Series with one instance per rank: a query returning them for a whole 16,384-rank
# job pulls 16,384 series (times their label fan-out) into the browser.
PER_RANK = re.compile(r"\b(watchdog_rank_\w+|watchdog_coordinator_straggler_score|rank:watchdog_\w+)\b")


def test_job_dashboard_shows_ranks_only_through_topk(docs):
    """The job-wide panels read the host aggregates' recording rules; where a panel
    lists ranks it lists the top few, whatever the job's size."""
    for where, expr in dashboard_exprs(docs["rank-watchdog-job.json"]).items():
        if PER_RANK.search(expr):
            assert re.match(r"(topk|bottomk)\(\d+, ", expr), f"{where} returns a series per rank: {expr}"


def test_job_wide_panels_read_the_host_aggregates(docs):
    """They work at --metrics.rank-detail=summary, where most per-rank series are
    not exported: every job-dashboard target reads a host aggregate, a rule over
    them, or the coordinator (the per-rank heatmap divides by a host rule)."""
    scale_rules = {r["record"] for r in promcheck.load_rules(promcheck.SCALE_RULES)}
    for where, expr in dashboard_exprs(docs["rank-watchdog-job.json"]).items():
        names = promcheck.metric_names(substitute(expr))
        assert names & (scale_rules | {"job:watchdog_ranks_expected:max"}) or any(
            n.startswith(("watchdog_host_", "watchdog_coordinator_", "ALERTS")) for n in names
        ), f"{where}: {sorted(names)}"


def test_rank_dashboard_is_bounded_by_its_host_and_rank_variables(docs):
    doc = docs["rank-watchdog-rank.json"]
    host = next(v for v in doc["templating"]["list"] if v["name"] == "host")
    assert host["multi"] and not host["includeAll"], "no 'All' hosts: a whole job's ranks"
    for where, expr in dashboard_exprs(doc).items():
        for m in re.finditer(r"\b(watchdog_(?:rank|accelerator)_\w+)\{([^}]*)\}", expr):
            assert 'host=~"$host"' in m.group(2), f"{where}: {m.group(0)}"
            if m.group(1).startswith("watchdog_rank_") and not where.startswith("variable"):
                assert 'rank=~"$rank"' in m.group(2), f"{where}: {m.group(0)}"


def test_panel_ids_and_positions_are_unique(docs):
    for name, doc in docs.items():
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids)), name
        cells: dict[tuple[int, int], int] = {}
        for p in doc["panels"]:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, (name, p["title"], g)
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{name}: {p['title']!r} overlaps panel {cells[(x, y)]}"
                    cells[(x, y)] = p["id"]


def test_variables_and_datasources(docs):
    for name, doc in docs.items():
        names = [v["name"] for v in doc["templating"]["list"]]
        assert names[:5] == ["datasource", "cluster", "namespace", "training_job", "host"], (name, names)
        for p in doc["panels"]:
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (name, p["title"])
            assert all(t["datasource"] == p["datasource"] for t in p["targets"]), (name, p["title"])
    assert "rank" in [v["name"] for v in docs["rank-watchdog-rank.json"]["templating"]["list"]]
    assert len({d["uid"] for d in docs.values()}) == len(docs)


def test_every_query_is_bounded_by_namespace_and_cluster(docs):
    """Two jobs of one name in two namespaces or clusters are never summed: every
    panel, annotation and variable below them selects both."""
    for name, doc in docs.items():
        for where, expr in dashboard_exprs(doc).items():
            if where in ("variable cluster", "variable namespace"):
                continue
            assert 'namespace=~"$namespace"' in expr and 'cluster=~"$cluster"' in expr, (name, where, expr)
        for v in doc["templating"]["list"]:
            if v["name"] in ("cluster", "namespace"):
                assert v["includeAll"] and v["allValue"] == ".*", (name, v["name"])  # no such label: matches


def test_panels_link_their_runbooks_and_say_their_units(docs):
    pages = promcheck.REPO / "docs" / "runbooks"
    linked = set()
    for name, doc in docs.items():
        for p in doc["panels"]:
            for link in p.get("links", []):
                assert link["url"].startswith("${runbooks}/"), (name, p["title"], link)
                page = link["url"].removeprefix("${runbooks}/")
                assert (pages / page).is_file(), (name, p["title"], page)
                linked.add(page.removesuffix(".md"))
        runbooks = next(v for v in doc["templating"]["list"] if v["name"] == "runbooks")
        assert runbooks["query"] + "/" == promcheck.RUNBOOK_BASE, runbooks  # the alert rules' base
        units = {p["title"]: p["fieldConfig"]["defaults"]["unit"] for p in doc["panels"]}
        if name == "rank-watchdog-rank.json":
            assert units["Accelerator temperature"] == "celsius" and units["Accelerator power"] == "watt"
    assert {"RankWatchdogRankDead", "RankWatchdogRankFrozen", "RankWatchdogJobHang", "RankWatchdogStraggler"} <= linked


def test_job_overview_has_what_the_issue_asks(docs):
    job = docs["rank-watchdog-job.json"]
    exprs = " ".join(dashboard_exprs(job).values())
    kinds = {p["type"] for p in job["panels"]}
    assert "heatmap" in kinds  # straggler heatmap per rank
    for needle in (
        "job:watchdog_ranks:sum",
        "job:watchdog_ranks_expected:max",
        "job:watchdog_host_step_part_seconds:mean1m",
        "watchdog_rank_step_part_seconds_total",  # the heatmap's per-rank compute
        "job:watchdog_host_steps:rate1m",
        "host:watchdog_accelerator_utilization:avg",
        'part="data"',
    ):
        assert needle in exprs, needle
    annotations = {a["name"] for a in job["annotations"]["list"]}
    assert {"Coordinator findings", "Actions", "Firing alerts"} <= annotations


def _diff(orig, back, path="$") -> list[str]:
    """Keys present in ``orig`` but missing or different in ``back``."""
    if isinstance(orig, dict):
        if not isinstance(back, dict):
            return [f"{path}: became {type(back).__name__}"]
        out = []
        for k, v in orig.items():
            out += [f"{path}.{k}: dropped"] if k not in back else _diff(v, back[k], f"{path}.{k}")
        return out
    if isinstance(orig, list):
        if not isinstance(back, list) or len(back) != len(orig):
            return [f"{path}: list changed"]
        return [d for i, (a, b) in enumerate(zip(orig, back)) for d in _diff(a, b, f"{path}[{i}]")]
    return [] if orig == back else [f"{path}: {orig!r} -> {back!r}"]


# Grafana's Prometheus annotation queries keep these at the annotation's top level
# (the annotation editor writes them); the SDK's AnnotationQuery schema has no place
# for them. Any other dropped key fails.
SDK_UNMODELLED = re.compile(
    r"^\$\.annotations\.list\[\d+\]\.(titleFormat|textFormat|tagKeys|step|useValueForTime): dropped$"
)


def test_sdk_round_trip_drops_nothing(docs):
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    for name, doc in docs.items():
        back = json.loads(json.dumps(Dashboard.from_json(doc), cls=JSONEncoder))
        problems = [p for p in _diff(doc, back) if not SDK_UNMODELLED.match(p)]
        assert not problems, f"{name}: grafana-foundation-sdk dropped or changed:\n" + "\n".join(problems[:30])


def test_round_trip_check_can_fail():
    assert _diff({"panels": [{"bogus": 1, "a": 2}]}, {"panels": [{"a": 3}]}) == [
        "$.panels[0].bogus: dropped",
        "$.panels[0].a: 2 -> 3",
    ]
