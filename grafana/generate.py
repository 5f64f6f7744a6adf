"""Generates the Grafana files that must not be edited by hand:

    grafana/dashboards/rank-watchdog-job.json     job overview
    grafana/dashboards/rank-watchdog-rank.json    rank detail
    grafana/provisioning/alerting/rank-watchdog-alerts.yml
        Grafana-managed copies of the key Prometheus alerts, taken from
        deploy/prometheus/rules/watchdog-alerts.rules.yml (the tested source of
        truth), so the two cannot drift.

Run after changing this file or the Prometheus rules:

    .venv/bin/python grafana/generate.py

tests/test_grafana_*.py fail when the committed files differ from what this
writes, when an expression does not parse (promtool), uses a metric missing from
tests/golden/, or when grafana-foundation-sdk drops a key of the JSON.
Plain dicts on purpose: the dashboards stay readable JSON that imports anywhere.

Built for a 16,384-rank job (docs/deploy.md, "Prometheus at scale"): the job-wide
panels read the recording rules of deploy/prometheus/rules/ (load them: without
them those panels are empty), mostly the host aggregates' (watchdog-scale.rules.yml),
which are there at --metrics.rank-detail=summary too; a job-wide panel that shows
ranks shows only the top few (topk); the rank dashboard shows the ranks of the
hosts selected (its host variable has no "All").
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PROM_ALERTS = REPO / "deploy" / "prometheus" / "rules" / "watchdog-alerts.rules.yml"
DATASOURCE_UID = "watchdog-prometheus"  # grafana/provisioning/datasources/rank-watchdog.yml
# The alerts teams page on, carried into Grafana-managed alerting.
GRAFANA_ALERTS = (
    "RankWatchdogJobHang",
    "RankWatchdogRankDead",
    "RankWatchdogRankFrozen",
    "RankWatchdogStraggler",
    "RankWatchdogRankDataStarvation",
    "RankWatchdogJobDataStarvation",
)

DS = {"type": "prometheus", "uid": "${datasource}"}
# The training job is the agents' label `training_job`; `job`/`instance` are the scrape
# target's. A job is (training_job, namespace, cluster): aggregations keep all three.
TOP = 10  # ranks or hosts a job-wide panel lists: the few worth a look, never all of them
# Every query is bounded by the cluster and namespace variables too: two jobs of one
# name in two namespaces or clusters are two jobs, never summed. Where a Prometheus has
# neither label, the variables' "All" (.*) matches the empty value and changes nothing.
NC = 'namespace=~"$namespace", cluster=~"$cluster"'
J = f'training_job="$training_job", {NC}'
JH = f'{J}, host=~"$host"'
JHR = f'{JH}, rank=~"$rank"'
H = f'host=~"$host", {NC}'  # accelerator series: per host, not per job
# The panels' runbook links follow the dashboard variable `runbooks` (where docs/runbooks/
# is published), preset to the alert rules' placeholder base; set it in Grafana.
RUNBOOK_BASE = "https://rank-watchdog.example/docs/runbooks"
# Panel title -> the alert whose runbook explains what the panel shows going wrong.
RUNBOOKS = {
    "Dead ranks": "RankWatchdogRankDead",
    "Oldest heartbeat": "RankWatchdogRankFrozen",
    "Active findings": "RankWatchdogCoordinatorFinding",
    "Monitor: job state": "RankWatchdogActionInProgress",
    f"Accelerator utilisation: the job and the {TOP} least busy hosts": "RankWatchdogAcceleratorIdle",
    f"Data-wait share: the job and the {TOP} hungriest hosts": "RankWatchdogJobDataStarvation",
    "Ranks by state vs expected": "RankWatchdogRanksMissing",
    f"Oldest heartbeat: the {TOP} stalest hosts": "RankWatchdogRankFrozen",
    f"Coordinator: straggler score, the {TOP} highest ranks": "RankWatchdogStraggler",
    "Coordinator: time without progress vs deadline": "RankWatchdogJobHang",
    "Process state": "RankWatchdogRankDead",
    "Compute vs job mean": "RankWatchdogStraggler",
    "Throttle reasons and XID errors": "RankWatchdogAcceleratorXidError",
}
JOB_KEY = "training_job, namespace, cluster"
TARGET = "cluster, job, instance"  # one scrape target: how coordinator and agent series meet their info
RI = "$__rate_interval"


def per_step(part_sel: str, step_sel: str) -> str:
    """Seconds of a step part per step, per rank (a windowed mean)."""
    return (
        f"rate(watchdog_rank_step_part_seconds_total{{{part_sel}}}[{RI}])"
        f" / ignoring (part) group_left () rate(watchdog_rank_steps_total{{{step_sel}}}[{RI}])"
    )


def compute_vs_job(sel: str) -> str:
    """A rank's compute per step over the job's mean compute per step (1 = typical).
    The mean comes from the hosts' aggregates (a recording rule), so it covers every
    rank at either rank detail and the query reads only the selected ranks' series."""
    compute = ', part="compute"'
    return (
        f"({per_step(sel + compute, sel)})"
        f" / on ({JOB_KEY}) group_left () job:watchdog_host_step_part_seconds:mean1m{{{J}{compute}}}"
    )


# The job's live ranks: processes that exist, running or stopped (the hosts' counts).
RANKS_LIVE = f'sum(job:watchdog_ranks:sum{{{J}, state=~"alive|stopped"}})'
# The selected hosts of the job (one series per host): joins host-level series to the job.
JOB_HOSTS = f'(watchdog_host_ranks{{{JH}, state="alive"}} > 0)'


def of_job(metric: str) -> str:
    """A coordinator series for the selected training job: only the coordinator's
    info metric carries the training job, joined on the scrape target."""
    return f"{metric} * on ({TARGET}) group_left () watchdog_coordinator_info{{{J}}}"


PHASE_CODE = " + ignoring (phase) ".join(
    f'{i} * watchdog_rank_phase{{{JHR}, phase="{p}"}}'
    for i, p in enumerate(("train", "init", "checkpoint", "eval", "shutdown", "other"))
)  # wire.Phase codes


class Layout:
    """Hands out unique ids and non-overlapping grid positions, row by row (24 wide)."""

    def __init__(self) -> None:
        self.next_id, self.x, self.y, self.row_h = 1, 0, 0, 0

    def place(self, w: int, h: int) -> tuple[int, dict]:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        pid, self.next_id = self.next_id, self.next_id + 1
        return pid, pos


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> dict:
    t = {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend or "__auto", "range": not instant}
    if instant:
        t["instant"] = True
    return t


def panel(
    lay: Layout,
    kind: str,
    title: str,
    desc: str,
    targets: list[dict],
    w: int,
    h: int,
    unit: str = "short",
    options: dict | None = None,
    custom: dict | None = None,
    defaults: dict | None = None,
) -> dict:
    pid, pos = lay.place(w, h)
    fdefaults = {"unit": unit, **(defaults or {})}
    if custom:
        fdefaults["custom"] = custom
    alert = RUNBOOKS.get(title)
    links = [{"title": f"Runbook: {alert}", "url": f"${{runbooks}}/{alert}.md", "targetBlank": True}] if alert else []
    return {
        "id": pid,
        "type": kind,
        "title": title,
        "description": desc,
        "gridPos": pos,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": fdefaults, "overrides": []},
        "options": options or {},
        "links": links,
    }


def ts(lay, title, desc, targets, w=12, h=8, unit="short", stack=False, **kw) -> dict:
    custom = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 30 if stack else 0,
        "showPoints": "never",
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
    }
    opts = {
        "legend": {"displayMode": "table", "placement": "right", "showLegend": True, "calcs": ["lastNotNull"]},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return panel(lay, "timeseries", title, desc, targets, w, h, unit, opts, custom, **kw)


def stat(lay, title, desc, expr, unit="short", w=4, h=4, thresholds=None, text="auto", legend="") -> dict:
    """``text="name"`` shows the series' legend (a label value) instead of its number."""
    defaults = {"thresholds": {"mode": "absolute", "steps": thresholds or [{"color": "green", "value": None}]}}
    opts = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "value",
        "graphMode": "area",
        "textMode": text,
        "justifyMode": "auto",
        "orientation": "auto",
    }
    return panel(lay, "stat", title, desc, [target(expr, legend, instant=True)], w, h, unit, opts, defaults=defaults)


def variables(with_rank: bool) -> dict:
    def query_var(name: str, label: str, query: str, multi: bool, all_: bool | None = None) -> dict:
        v = {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": DS,
            "query": {"query": query, "refId": f"var-{name}"},
            "refresh": 2,
            "sort": 3,
            "hide": 0,
            "multi": multi,
            "includeAll": multi if all_ is None else all_,
        }
        if v["includeAll"]:
            v["allValue"] = ".*"
        return v

    out = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "hide": 0,
            "refresh": 1,
        },
        query_var("cluster", "Cluster", "label_values(watchdog_host_ranks, cluster)", False, True),
        query_var(
            "namespace", "Namespace", 'label_values(watchdog_host_ranks{cluster=~"$cluster"}, namespace)', False, True
        ),
        query_var("training_job", "Training job", f"label_values(watchdog_host_ranks{{{NC}}}, training_job)", False),
        # On the rank dashboard no "All": its panels show every selected host's ranks,
        # and all of a 16,384-rank job's would be 2,048 hosts' worth of series.
        query_var("host", "Host", f"label_values(watchdog_host_ranks{{{J}}}, host)", True, not with_rank),
    ]
    if with_rank:
        out.append(query_var("rank", "Rank", f"label_values(watchdog_rank_alive{{{JH}}}, rank)", True))
    base = {"text": RUNBOOK_BASE, "value": RUNBOOK_BASE}
    out.append(
        {
            "name": "runbooks",
            "label": "Runbooks at",
            "type": "textbox",
            "query": RUNBOOK_BASE,
            "current": base,
            "hide": 2,
        }
    )
    return {"list": out}


def annotations() -> dict:
    return {
        "list": [
            {
                "name": "Annotations & Alerts",
                "builtIn": 1,
                "enable": True,
                "hide": True,
                "iconColor": "rgba(0, 211, 255, 1)",
                "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                "type": "dashboard",
            },
            {
                "name": "Coordinator findings",
                "enable": True,
                "iconColor": "orange",
                "datasource": DS,
                "expr": "sum by (kind) (increase(watchdog_coordinator_findings_total[2m])"
                f" * on ({TARGET}) group_left () watchdog_coordinator_info{{{J}}}) > 0",
                "titleFormat": "finding: {{kind}}",
                "step": "60s",
            },
            # Actions: the commands (stacks, signals, checkpoint requests) the job's agents ran.
            {
                "name": "Actions",
                "enable": True,
                "iconColor": "purple",
                "datasource": DS,
                "expr": "sum by (type, result) (increase(watchdog_agent_commands_executed_total[2m])"
                f" and on ({TARGET}) watchdog_host_ranks{{{J}}}) > 0",
                "titleFormat": "action: {{type}} ({{result}})",
                "step": "60s",
            },
            {
                "name": "Firing alerts",
                "enable": True,
                "iconColor": "red",
                "datasource": DS,
                "expr": f'ALERTS{{alertstate="firing", {J}}}',
                "titleFormat": "{{alertname}}",
                "tagKeys": "severity,rank,host",
                "step": "60s",
            },
        ]
    }


def dashboard(uid: str, title: str, desc: str, panels: list[dict], with_rank: bool, links: list[dict]) -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": desc,
        "tags": ["rank-watchdog", "training"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "templating": variables(with_rank),
        "annotations": annotations(),
        "links": links,
        "panels": panels,
    }


def job_dashboard() -> dict:
    lay = Layout()
    thr_bad = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
    p = [
        stat(
            lay,
            "Ranks alive",
            "Rank processes that exist (pid and start time), running or stopped, across the job's hosts.",
            RANKS_LIVE,
        ),
        stat(
            lay, "Ranks expected", "World size the job's ranks declare.", f"max(job:watchdog_ranks_expected:max{{{J}}})"
        ),
        stat(
            lay,
            "Dead ranks",
            "Processes gone without a clean exit (RankWatchdogRankDead).",
            f'sum(job:watchdog_ranks:sum{{{J}, state="dead"}}) or vector(0)',
            thresholds=thr_bad,
        ),
        stat(
            lay,
            "Oldest heartbeat",
            "Seconds since the stalest live rank's hook heartbeat, anywhere in the job. Above 30 s "
            "a rank is frozen or stopped (RankWatchdogRankFrozen names it; the rank dashboard shows it).",
            f"max(job:watchdog_heartbeat_age_seconds:max{{{J}}})",
            unit="s",
            thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 30}],
        ),
        stat(
            lay,
            "Steps / s",
            "Training steps per second (per rank, the most advanced host's).",
            f"max(job:watchdog_host_steps:rate1m{{{J}}})",
        ),
        stat(
            lay,
            "Active findings",
            "The coordinator's findings whose condition holds now.",
            f"sum({of_job('watchdog_coordinator_findings_active')}) or vector(0)",
            thresholds=thr_bad,
        ),
        ts(
            lay,
            "Step time: all ranks and the slowest host",
            "Mean step time over the last minute, all ranks together, and the slowest host's ranks. "
            "In synchronous training they are nearly equal; see the split for where time goes.",
            [
                target(f"job:watchdog_host_step_seconds:mean1m{{{J}}}", "mean", "A"),
                target(f"job:watchdog_host_step_seconds:max1m{{{J}}}", "slowest host", "B"),
            ],
            unit="s",
        ),
        ts(
            lay,
            "Where step time goes",
            "Seconds per step, all ranks together, split into data wait, "
            "collective wait and compute (compute = step - data - collective). Stacked: the top is the step time.",
            [target(f"job:watchdog_host_step_part_seconds:mean1m{{{J}}}", "{{part}}")],
            unit="s",
            stack=True,
        ),
        panel(
            lay,
            "heatmap",
            f"Straggler heatmap: compute vs job mean, the {TOP} slowest ranks",
            "Each row is a rank; colour is its compute time per step over the job's mean (1 = typical). "
            f"The {TOP} slowest selected ranks at each point in time, not all of a large job's. A rank that "
            "stays red is a straggler (RankWatchdogStraggler fires at 1.1 for 15 min). At "
            "--metrics.rank-detail=summary the agents export each host's slowest ranks, which are these.",
            [target(f"topk({TOP}, {compute_vs_job(JH)})", "{{rank}}")],
            12,
            8,
            "none",
            {
                "calculate": False,
                "cellGap": 1,
                "color": {"mode": "scheme", "scheme": "RdYlGn", "reverse": True, "min": 0.8, "max": 1.5, "steps": 64},
                "yAxis": {"axisPlacement": "left", "reverse": False},
                "rowsFrame": {"layout": "auto"},
                "cellValues": {"decimals": 2},
                "legend": {"show": True},
                "tooltip": {"mode": "single", "yHistogram": False},
            },
        ),
        ts(
            lay,
            "Throughput",
            "Steps per second (per rank, the most advanced host's); samples are steps x global batch.",
            [target(f"job:watchdog_host_steps:rate1m{{{J}}}", "steps/s")],
            unit="ops",
        ),
        ts(
            lay,
            f"Accelerator utilisation: the job and the {TOP} least busy hosts",
            "Mean NVML utilisation of the hosts' accelerators, over the selected hosts and for the least busy. "
            "Low utilisation next to a high data-wait share means the input pipeline starves the job.",
            [
                target(f"avg(host:watchdog_accelerator_utilization:avg and on (host) {JOB_HOSTS})", "all hosts", "A"),
                target(
                    f"bottomk({TOP}, host:watchdog_accelerator_utilization:avg and on (host) {JOB_HOSTS})",
                    "{{host}}",
                    "B",
                ),
            ],
            unit="percentunit",
            defaults={"min": 0, "max": 1},
        ),
        ts(
            lay,
            f"Data-wait share: the job and the {TOP} hungriest hosts",
            "Share of step time spent waiting on the data iterator, all ranks together and per host. "
            "One host high: its loader or storage (RankWatchdogRankDataStarvation names the rank); "
            "the job high: the pipeline.",
            [
                target(
                    f'job:watchdog_host_step_part_seconds:mean1m{{{J}, part="data"}}'
                    f" / ignoring (part) job:watchdog_host_step_seconds:mean1m{{{J}}}",
                    "job",
                    "A",
                ),
                target(f'topk({TOP}, host:watchdog_step_part:share1m{{{JH}, part="data"}})', "{{host}}", "B"),
            ],
            unit="percentunit",
            defaults={"min": 0},
        ),
        ts(
            lay,
            "Ranks by state vs expected",
            "The job's ranks by state (alive, stopped, dead, exited), against the declared world size.",
            [
                target(f"sum by (state) (job:watchdog_ranks:sum{{{J}}})", "{{state}}", "A"),
                target(f"max(job:watchdog_ranks_expected:max{{{J}}})", "expected", "B"),
            ],
        ),
        ts(
            lay,
            f"Oldest heartbeat: the {TOP} stalest hosts",
            "Seconds since the hook heartbeat (every 0.5 s) of each host's stalest live rank. Above 30 s "
            "with the process alive, the rank is frozen; the rank dashboard for that host names it.",
            [target(f"topk({TOP}, watchdog_host_heartbeat_age_max_seconds{{{JH}}})", "{{host}}")],
            unit="s",
        ),
        ts(
            lay,
            f"Coordinator: straggler score, the {TOP} highest ranks",
            "The coordinator's windowed compute ratio vs the median of the other ranks (1 = typical).",
            [target(f"topk({TOP}, {of_job('watchdog_coordinator_straggler_score')})", "rank {{rank}}")],
        ),
        ts(
            lay,
            "Coordinator: time without progress vs deadline",
            "Seconds since any live rank made progress, against the adaptive collective-hang deadline.",
            [
                target(of_job("watchdog_coordinator_hang_seconds"), "no progress", "A"),
                target(of_job("watchdog_coordinator_hang_deadline_seconds"), "deadline", "B"),
            ],
            unit="s",
        ),
        stat(
            lay,
            "Bottleneck",
            "The coordinator's live verdict: what limits each step (data, communication, "
            "straggler, memory; compute = healthy). It changes only when the evidence does, and never pages; "
            "`watchdog status` gives the reason with its numbers.",
            f"max by (verdict) ({of_job('watchdog_coordinator_bottleneck')}) == 1",
            w=6,
            h=8,
            text="name",
            legend="{{verdict}}",
        ),
        stat(
            lay,
            "Goodput",
            "Productive share of the job's wall time so far: the median rank's compute plus "
            "the job's own baseline communication, against all of the wall time.",
            of_job("watchdog_coordinator_goodput_ratio"),
            unit="percentunit",
            w=6,
            h=8,
            thresholds=[
                {"color": "red", "value": None},
                {"color": "yellow", "value": 0.6},
                {"color": "green", "value": 0.8},
            ],
        ),
        stat(
            lay,
            "Monitor: job state",
            "The coordinator's state machine for the job: running, degraded (findings open), checkpointing, "
            "restarting, aborting (its policy acts: the job's other alerts are held back), failed.",
            f"max by (state) ({of_job('watchdog_coordinator_job_state')}) == 1",
            w=6,
            h=8,
            text="name",
            legend="{{state}}",
        ),
        ts(
            lay,
            "Bottleneck evidence: share of step time per cause",
            "Recent steps: data wait (median rank), "
            "collective time of the rank that waits least (communication itself), the slowest rank's extra "
            "compute (straggler); memory is the fullest accelerator's memory in use. Thresholds: 20%, 30%, 8%, 90%.",
            [target(of_job("watchdog_coordinator_bottleneck_share"), "{{cause}}")],
            unit="percentunit",
            defaults={"min": 0},
        ),
        ts(
            lay,
            "Where the wall time goes (goodput)",
            "The job's wall time by category, per second of wall time "
            "(stacked, the top is 1): productive, data wait, collective wait beyond the job's baseline, "
            "straggler, checkpoint/eval, restart downtime, redone steps, startup.",
            [
                target(
                    f"sum by (category) (rate(watchdog_coordinator_goodput_seconds_total[{RI}])"
                    f" * on ({TARGET}) group_left () watchdog_coordinator_info{{{J}}})",
                    "{{category}}",
                )
            ],
            unit="percentunit",
            stack=True,
        ),
    ]
    return dashboard(
        "rank-watchdog-job",
        "rank-watchdog / job",
        "One training job: ranks alive, where step time goes, stragglers, starvation, accelerators.",
        p,
        False,
        [
            {
                "title": "Rank detail",
                "type": "link",
                "url": "/d/rank-watchdog-rank?${__url_time_range}&var-cluster=${cluster}&var-namespace=${namespace}"
                "&var-training_job=${training_job}&${host:queryparam}",
                "targetBlank": False,
                "asDropdown": False,
                "includeVars": False,
                "keepTime": False,
                "icon": "dashboard",
                "tags": [],
                "tooltip": "",
            }
        ],
    )


def rank_dashboard() -> dict:
    lay = Layout()
    state_map = [
        {
            "type": "value",
            "options": {
                "-2": {"text": "exited", "color": "blue", "index": 0},
                "0": {"text": "dead", "color": "red", "index": 1},
                "1": {"text": "running", "color": "green", "index": 2},
                "2": {"text": "stopped", "color": "orange", "index": 3},
            },
        }
    ]
    phase_map = [
        {
            "type": "value",
            "options": {
                str(i): {"text": p, "color": c, "index": i}
                for i, (p, c) in enumerate(
                    (
                        ("train", "green"),
                        ("init", "blue"),
                        ("checkpoint", "purple"),
                        ("eval", "yellow"),
                        ("shutdown", "grey"),
                        ("other", "orange"),
                    )
                )
            },
        }
    ]
    tl_opts = {
        "showValue": "never",
        "mergeValues": True,
        "rowHeight": 0.9,
        "alignValue": "left",
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "single", "sort": "none"},
    }
    p = [
        panel(
            lay,
            "state-timeline",
            "Process state",
            "running / stopped (SIGSTOP, tracer) / dead (gone without a clean exit) / exited (clean interpreter exit).",
            [
                target(
                    f"watchdog_rank_alive{{{JHR}}} + watchdog_rank_process_stopped{{{JHR}}}"
                    f" - 2 * watchdog_rank_exited{{{JHR}}}",
                    "rank {{rank}}",
                )
            ],
            12,
            6,
            "none",
            tl_opts,
            defaults={"mappings": state_map},
        ),
        panel(
            lay,
            "state-timeline",
            "Phase",
            "The phase the hook marks: train, init, checkpoint, eval, shutdown.",
            [target(f"max by ({JOB_KEY}, rank) ({PHASE_CODE})", "rank {{rank}}")],
            12,
            6,
            "none",
            tl_opts,
            defaults={"mappings": phase_map},
        ),
        ts(
            lay,
            "Step time split",
            "Seconds per step in data wait, collective wait and compute, per rank (windowed mean).",
            [target(per_step(JHR, JHR), "rank {{rank}} {{part}}")],
            unit="s",
        ),
        ts(
            lay,
            "Last step split",
            "The last completed step's parts, as the agent last saw them.",
            [target(f"watchdog_rank_last_step_part_seconds{{{JHR}}}", "rank {{rank}} {{part}}")],
            unit="s",
        ),
        ts(
            lay,
            "Compute vs job mean",
            "Compute per step over the mean of all the job's ranks; 1 = typical.",
            [target(compute_vs_job(JHR), "rank {{rank}}")],
        ),
        ts(
            lay,
            "Ages: heartbeat, step, collective",
            "Seconds since the heartbeat, since the step in progress "
            "started, and inside the outstanding collective (0 when none).",
            [
                target(f"watchdog_rank_heartbeat_age_seconds{{{JHR}}}", "rank {{rank}} heartbeat", "A"),
                target(f"watchdog_rank_step_age_seconds{{{JHR}}}", "rank {{rank}} step", "B"),
                target(f"watchdog_rank_collective_age_seconds{{{JHR}}}", "rank {{rank}} collective", "C"),
            ],
            unit="s",
        ),
        ts(
            lay,
            "Collective sequence",
            "Sequence number of the last collective each rank entered: in a hang the culprit is the rank behind.",
            [target(f"watchdog_rank_collective_seq{{{JHR}}}", "rank {{rank}}")],
        ),
        ts(
            lay,
            "Steps completed",
            "The step counter per rank.",
            [target(f"watchdog_rank_step{{{JHR}}}", "rank {{rank}}")],
        ),
        ts(
            lay,
            "CPU",
            "CPU time of the rank's process per second (1 = one core).",
            [target(f"rate(watchdog_rank_cpu_seconds_total{{{JHR}}}[{RI}])", "rank {{rank}}")],
        ),
        ts(
            lay,
            "Resident memory",
            "RSS of the rank's process.",
            [target(f"watchdog_rank_resident_memory_bytes{{{JHR}}}", "rank {{rank}}")],
            unit="bytes",
        ),
        ts(
            lay,
            "Accelerator utilisation and memory",
            "NVML utilisation of the selected hosts' accelerators (kernels and memory traffic).",
            [
                target(f"watchdog_accelerator_utilization_ratio{{{H}}}", "{{host}} gpu {{gpu}}", "A"),
                target(f"watchdog_accelerator_memory_utilization_ratio{{{H}}}", "{{host}} gpu {{gpu}} mem", "B"),
            ],
            unit="percentunit",
        ),
        ts(
            lay,
            "Accelerator SM clock",
            "A straggler's GPU often runs at a lower clock (throttling).",
            [target(f"watchdog_accelerator_sm_clock_hertz{{{H}}}", "{{host}} gpu {{gpu}}")],
            unit="hertz",
        ),
        ts(
            lay,
            "Accelerator temperature",
            "Core temperature of the selected hosts' accelerators.",
            [target(f"watchdog_accelerator_temperature_celsius{{{H}}}", "{{host}} gpu {{gpu}}")],
            w=6,
            unit="celsius",
        ),
        ts(
            lay,
            "Accelerator power",
            "Power draw of the selected hosts' accelerators.",
            [target(f"watchdog_accelerator_power_watts{{{H}}}", "{{host}} gpu {{gpu}}")],
            w=6,
            unit="watt",
        ),
        ts(
            lay,
            "Throttle reasons and XID errors",
            "NVML throttle-reason bitmask (0 or 1 = unthrottled) and critical XID events in the window.",
            [
                target(f"watchdog_accelerator_throttle_reasons{{{H}}}", "{{host}} gpu {{gpu}} throttle", "A"),
                target(
                    f"increase(watchdog_accelerator_xid_errors_total{{{H}}}[{RI}])",
                    "{{host}} gpu {{gpu}} xid {{xid}}",
                    "B",
                ),
            ],
        ),
        ts(
            lay,
            "Hook errors",
            "Errors the rank's hook caught (never raised into training).",
            [target(f"increase(watchdog_rank_hook_errors_total{{{JHR}}}[{RI}])", "rank {{rank}}")],
            w=24,
            h=6,
        ),
    ]
    return dashboard(
        "rank-watchdog-rank",
        "rank-watchdog / rank",
        "Selected ranks of one job: state, phase, step split, ages, resources and their host's accelerators.",
        p,
        True,
        [
            {
                "title": "Job overview",
                "type": "link",
                "url": "/d/rank-watchdog-job?${__url_time_range}&var-cluster=${cluster}&var-namespace=${namespace}"
                "&var-training_job=${training_job}",
                "targetBlank": False,
                "asDropdown": False,
                "includeVars": False,
                "keepTime": False,
                "icon": "dashboard",
                "tags": [],
                "tooltip": "",
            }
        ],
    )


# -- Grafana-managed alert rules from the Prometheus rules --------------------------
_QUERY_RANGE = re.compile(r"\{\{ range .*?\| query \}\}.*?\{\{ else \}\}.*?\{\{ end \}\}", re.S)


def grafana_text(text: str) -> str:
    """Prometheus alert templates -> Grafana's: Grafana has no `query` function, and
    the value of query A is $values.A.Value, not $value."""
    text = _QUERY_RANGE.sub("see `watchdog status` (the rank whose collective sequence is behind)", text)
    return text.replace("$value", "$values.A.Value")


def grafana_alerts() -> dict:
    rules = {
        r["alert"]: r for g in yaml.safe_load(PROM_ALERTS.read_text())["groups"] for r in g["rules"] if "alert" in r
    }
    out = []
    for name in GRAFANA_ALERTS:
        r = rules[name]
        uid = re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()  # RankWatchdogJobHang -> rank-watchdog-job-hang
        out.append(
            {
                "uid": uid,
                "title": name,
                "condition": "C",
                "data": [
                    {
                        "refId": "A",
                        "relativeTimeRange": {"from": 900, "to": 0},
                        "datasourceUid": DATASOURCE_UID,
                        "model": {
                            "refId": "A",
                            "expr": r["expr"],
                            "instant": True,
                            "range": False,
                            "datasource": {"type": "prometheus", "uid": DATASOURCE_UID},
                        },
                    },
                    # The Prometheus expression already filters to the firing series, so
                    # every value it returns fires (Grafana's own import of Prometheus
                    # rules uses the same condition).
                    {
                        "refId": "C",
                        "datasourceUid": "__expr__",
                        "model": {
                            "refId": "C",
                            "type": "math",
                            "expression": "is_number($A) || is_nan($A) || is_inf($A)",
                            "datasource": {"type": "__expr__", "uid": "__expr__"},
                        },
                    },
                ],
                "noDataState": "OK",  # no series = nothing firing
                "execErrState": "Error",
                "for": r.get("for", "0s"),
                "labels": dict(r["labels"]),
                "annotations": {
                    "summary": r["annotations"]["summary"],
                    "description": grafana_text(r["annotations"]["description"]),
                    "runbook_url": r["annotations"]["runbook_url"],
                },
                "isPaused": False,
            }
        )
    return {
        "apiVersion": 1,
        "groups": [{"orgId": 1, "name": "rank-watchdog", "folder": "rank-watchdog", "interval": "30s", "rules": out}],
    }


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)
)

ALERTS_HEADER = """\
# Grafana-managed alert rules for rank-watchdog: GENERATED by grafana/generate.py from
# deploy/prometheus/rules/watchdog-alerts.rules.yml (the tested source of truth).
# Do not edit; change the Prometheus rules and regenerate. Same names, expressions,
# durations, severities, summaries and runbook links; descriptions differ only
# where Grafana's templating differs ($values.A.Value, no `query`).
# Query A is the Prometheus expression; condition C fires for every series it returns.
"""


def outputs() -> dict[Path, str]:
    dump = lambda d: json.dumps(d, indent=2, ensure_ascii=False) + "\n"  # noqa: E731
    return {
        HERE / "dashboards" / "rank-watchdog-job.json": dump(job_dashboard()),
        HERE / "dashboards" / "rank-watchdog-rank.json": dump(rank_dashboard()),
        HERE / "provisioning" / "alerting" / "rank-watchdog-alerts.yml": ALERTS_HEADER
        + yaml.dump(grafana_alerts(), Dumper=_Dumper, sort_keys=False, width=100_000, allow_unicode=True),
    }


def main() -> int:
    for path, text in outputs().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
