"""Past one job: two training jobs on one host, each with its own agent and its own
coordinator (one coordinator per job is the design), sharing the node's run
directory the way a node-wide hostPath or /run/rank-watchdog is shared. Each
agent watches only its job's slots (--job.name, the value the deploy files take
from the Kubernetes label or the Slurm job id), each coordinator sees only its
job's ranks, a rank killed in one job is a finding of that job's coordinator
only, and one Prometheus holds both jobs apart by their `training_job` label
(`job` stays the scrape job's), in the raw series, the recording rules and the
dashboards' coordinator join. A global Prometheus federating with the shipped
deploy/prometheus/fleet/federate.yml gets both jobs' aggregates and no per-rank
series.

The ranks are fake ones writing their slots through the real hook writer
(agent/testing.py): what is under test is which monitor sees which rank."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from promserver import Prometheus
from waiting import wait_coordinator, wait_for

from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.dev import localjob

pytestmark = pytest.mark.integration

JOBS = ("alpha", "beta")
DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"
PROM_RULES = sorted((DEPLOY / "rules").glob("*.rules.yml"))
HOST = "shared-node"


def _rank(run_dir, job: str, rank: int, env: dict) -> subprocess.Popen:
    argv = [sys.executable, "-m", "watchdog.agent.testing", "--run-dir", str(run_dir), "--job", job]
    argv += ["--rank", str(rank), "--world-size", "2"]
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)


def _by_job(prom: Prometheus, promql: str) -> dict[str, float]:
    return {s["metric"].get("training_job", ""): float(s["value"][1]) for s in prom.query(promql)}


def test_two_jobs_on_one_host_stay_apart(tmp_path):
    if Prometheus.binary() is None:
        pytest.fail("Debian's prometheus is not installed (run .ci/setup)")
    run_dir = tmp_path / "run"  # one per node, shared by both jobs
    run_dir.mkdir()
    procs: list[localjob.Process] = []
    ranks: dict[str, list[subprocess.Popen]] = {}
    coords: dict[str, localjob.Process] = {}
    agents: dict[str, localjob.Process] = {}
    prom = fleet = None
    try:
        for job in JOBS:
            work = tmp_path / job
            work.mkdir()
            token = work / "token"  # each job its own secret
            token.write_text(secrets.token_hex(16))
            os.chmod(token, 0o600)
            env = {**os.environ, "WATCHDOG_JOB_TOKEN_FILE": str(token)}
            coords[job] = localjob.start_coordinator(
                work, job, 2, work / "journal.jsonl", ["--tick.interval-seconds", "0.25"], env
            )
            procs.append(coords[job])
            ranks[job] = [_rank(run_dir, job, r, env) for r in range(2)]
            agents[job] = localjob.start_agent(
                work,
                run_dir,
                job,
                ["--host.name", HOST, "--coordinator.url", coords[job].url, "--report.interval-seconds", "0.5"],
                env,
            )
            procs.append(agents[job])

        def events(job: str, name: str, since: float = 0.0) -> list[dict]:
            path = tmp_path / job / "journal.jsonl"
            return [r for r in journal.read(str(path)) if r["event"] == name and r["t_wall"] >= since]

        for job in JOBS:

            def two_joined(j: str = job) -> bool:
                return len(events(j, je.RANK_JOINED)) >= 2

            wait_for(two_joined, 60, f"{job}'s ranks", log=coords[job].log_path)
        for job in JOBS:  # a few more reports (1.5 s of them): a neighbour's rank would have joined by now
            wait_coordinator(coords[job].url, reports=3, log=coords[job].log_path)
        for job in JOBS:
            joined = sorted((e["rank"], e["pid"]) for e in events(job, je.RANK_JOINED))
            assert joined == [(r, p.pid) for r, p in enumerate(ranks[job])], (job, joined)
            assert events(job, je.FINDING) == []
            metrics = localjob.http_get(agents[job].url + "/metrics")
            other = next(j for j in JOBS if j != job)
            assert f'training_job="{job}"' in metrics and f'training_job="{other}"' not in metrics

        targets = [p.address for p in procs]
        prom = Prometheus(tmp_path, targets, scrape_interval_s=0.5, rule_files=PROM_RULES).start()
        wait_for(  # every target scraped at least once: the agents' series and both coordinators'
            lambda: (
                _by_job(prom, 'job:watchdog_ranks:sum{state="alive"}') == {"alpha": 2, "beta": 2}
                and _by_job(prom, "count by (training_job) (watchdog_coordinator_info)") == {"alpha": 1, "beta": 1}
            ),
            60,
            "both jobs' rank counts from the recording rules, and both coordinators",
            log=tmp_path / "prometheus.log",
        )
        assert _by_job(prom, "count by (training_job) (watchdog_rank_alive)") == {"alpha": 2, "beta": 2}
        # The dashboards' join of a coordinator series to its training job finds that job's coordinator only.
        for job in JOBS:
            (hit,) = prom.query(
                "watchdog_coordinator_hang_deadline_seconds"
                f' * on (cluster, job, instance) group_left () watchdog_coordinator_info{{training_job="{job}"}}'
            )
            assert hit["metric"]["instance"] == coords[job].address

        # A rank of beta dies: beta's coordinator names it, alpha's sees nothing.
        t_kill = time.time()
        ranks["beta"][1].send_signal(signal.SIGKILL)
        ranks["beta"][1].wait(10)
        found = wait_for(
            lambda: events("beta", je.FINDING, t_kill), 60, "beta's dead rank", log=coords["beta"].log_path
        )
        assert [(f["kind"], f["ranks"]) for f in found] == [("dead_rank", [1])]
        wait_for(
            lambda: _by_job(prom, 'job:watchdog_ranks:sum{state="dead"}') == {"alpha": 0, "beta": 1},
            30,
            "beta's dead rank in Prometheus",
            log=tmp_path / "prometheus.log",
        )
        assert events("alpha", je.FINDING) == []

        # The fleet view: a global Prometheus federating the shipped match[] selectors.
        (tmp_path / "fleet").mkdir()
        fleet = Prometheus(tmp_path / "fleet", [])
        doc = yaml.safe_load((DEPLOY / "fleet" / "federate.yml").read_text())
        doc["global"] = {"scrape_interval": "500ms", "evaluation_interval": "500ms"}
        (sc,) = doc["scrape_configs"]
        sc.update(
            scrape_interval="500ms", scrape_timeout="500ms", static_configs=[{"targets": [f"127.0.0.1:{prom.port}"]}]
        )
        (tmp_path / "fleet" / "prometheus.yml").write_text(yaml.safe_dump(doc))
        fleet.start()
        wait_for(
            lambda: (
                _by_job(fleet, 'job:watchdog_ranks:sum{state="dead"}') == {"alpha": 0, "beta": 1}
                and _by_job(fleet, "count by (training_job) (watchdog_coordinator_info)") == {"alpha": 1, "beta": 1}
            ),
            30,
            "both jobs and both coordinators in the federated Prometheus",
            log=tmp_path / "fleet" / "prometheus.log",
        )
        assert fleet.query('count({__name__=~"watchdog_rank_.+|rank:watchdog_.+|watchdog_host_.+"})') == []
    finally:
        for p in (fleet, prom):
            if p is not None:
                p.stop()
        for rs in ranks.values():
            for r in rs:
                r.kill()
                r.wait(10)
        for proc in procs:
            proc.stop()
