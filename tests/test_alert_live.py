"""Live: a real 2-rank torchrun job (gloo, CPU) with rank 1 SIGSTOPping itself, a real
agent, a real Prometheus evaluating the shipped rules, a real Alertmanager with the
shipped routing, and a webhook in this test thread that receives the page.

The shipped rules wait production times (30 s heartbeat, `for:` up to 15 min); this
test loads a copy with short thresholds and `for: 0s` (templated below, each edit
asserted so the test breaks when the rules change shape). Alertmanager's receivers
are swapped for the webhook and its group timers shortened; routes and inhibitions
are the shipped ones.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import yaml
from promserver import Prometheus
from waiting import wait_for

from watchdog.dev import localjob

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "alerts"))
import promcheck
from test_grafana_dashboards import dashboard_exprs

pytestmark = pytest.mark.integration

STOP_STEP = 30
FROZEN_AFTER_S = 2  # production: 30
HANG_FLOOR_S = 8  # production: 120; above the frozen threshold, as in production


def fast_rules(dst: Path) -> Path:
    text = promcheck.ALERT_RULES.read_text()
    edits = [
        ("watchdog_rank_heartbeat_age_seconds > 30 and", f"watchdog_rank_heartbeat_age_seconds > {FROZEN_AFTER_S} and"),
        ("(watchdog_rank_window_step_seconds), 120)", f"(watchdog_rank_window_step_seconds), {HANG_FLOOR_S})"),
    ]
    for old, new in edits:
        assert text.count(old) == 1, f"the shipped rules changed shape: {old!r}"
        text = text.replace(old, new)
    text, n = re.subn(r"(?m)^(\s+)for: \S+$", r"\1for: 0s", text)
    assert n >= 10, n
    dst.write_text(text)
    return dst


def webhook_alertmanager_config(dst: Path, webhook_url: str) -> Path:
    doc = yaml.safe_load((promcheck.REPO / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    doc.pop("templates", None)  # the webhook sends JSON; templates are for chat and pager text
    doc["receivers"] = [
        {"name": r["name"], "webhook_configs": [{"url": webhook_url, "send_resolved": False}]} for r in doc["receivers"]
    ]
    routes = [doc["route"], *doc["route"].get("routes", [])]
    for r in routes:
        r.update(group_wait="0s", group_interval="1s")
    dst.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dst


def prometheus_config(dst: Path, agent: str, coordinator: str, rules: Path, alertmanager: str) -> None:
    """The shipped static example with its targets, rules and Alertmanager pointed here."""
    doc = yaml.safe_load((promcheck.REPO / "deploy" / "prometheus" / "scrape" / "static.yml").read_text())
    doc["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    # The recording rules too: the dashboards' job-wide panels read them.
    doc["rule_files"] = [str(rules), str(promcheck.RECORDING_RULES), str(promcheck.SCALE_RULES)]
    doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [alertmanager]
    jobs = {sc["job_name"]: sc for sc in doc["scrape_configs"]}
    jobs["rank-watchdog-agent"]["static_configs"][0]["targets"] = [agent]
    jobs["rank-watchdog-coordinator"]["static_configs"][0]["targets"] = [coordinator]
    dst.write_text(yaml.safe_dump(doc, sort_keys=False))


class Webhook:
    """Records every notification Alertmanager posts, with its arrival time."""

    def __init__(self) -> None:
        self.received: list[tuple[float, dict]] = []
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with hook.lock:
                    hook.received.append((time.monotonic(), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, name="webhook", daemon=True)
        self.thread.start()

    def all(self) -> list[tuple[float, dict]]:
        with self.lock:
            return [(at, alert) for at, note in self.received for alert in note["alerts"]]

    def first(self, predicate) -> tuple[float, dict] | None:
        return next(((at, a) for at, a in self.all() if predicate(at, a)), None)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


class Alertmanager:
    def __init__(self, work_dir: Path, config: Path) -> None:
        self.port = localjob.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = work_dir / "alertmanager.log"
        binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
        if binary is None:
            pytest.fail("Debian's prometheus-alertmanager is not installed (run .ci/setup)")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.path={work_dir / 'am-data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        wait_for(lambda: self._ready(), 30, what="alertmanager ready", interval_s=0.2, log=self.log_path)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError("alertmanager exited:\n" + self.log_path.read_text()[-3000:])
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def alerts(self) -> list[dict]:
        with urllib.request.urlopen(self.url + "/api/v2/alerts", timeout=5) as r:
            return json.load(r)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def prometheus_alert(prom: Prometheus, name: str) -> dict | None:
    with urllib.request.urlopen(prom.url + "/api/v1/alerts", timeout=5) as r:
        alerts = json.load(r)["data"]["alerts"]
    return next((a for a in alerts if a["labels"]["alertname"] == name and a["state"] == "firing"), None)


JOB = "live-alert"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """The whole chain, up until rank 1 has stopped itself; torn down after the
    module's tests. Yields a namespace with prom, am, webhook and stopped_at."""
    if Prometheus.binary() is None:
        pytest.fail("Debian's prometheus is not installed (run .ci/setup)")
    tmp_path = tmp_path_factory.mktemp("live")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stack: list = []
    try:
        webhook = Webhook()
        stack.append(webhook.close)
        am = Alertmanager(tmp_path, webhook_alertmanager_config(tmp_path / "am.yml", webhook.url))
        stack.append(am.stop)
        coord = localjob.start_coordinator(tmp_path, JOB, 2, tmp_path / "journal.jsonl")
        stack.append(coord.stop)
        agent = localjob.start_agent(
            tmp_path,
            run_dir,
            JOB,
            extra=[
                "--poll.interval-seconds",
                "0.1",
                "--collector.accelerator",
                "false",
                "--coordinator.url",
                coord.url,
            ],
        )
        stack.append(agent.stop)
        prom = Prometheus(tmp_path, [agent.address])
        prometheus_config(
            tmp_path / "prometheus.yml",
            agent.address,
            coord.address,
            fast_rules(tmp_path / "rules.yml"),
            f"127.0.0.1:{am.port}",
        )
        prom.start()
        stack.append(prom.stop)
        torchrun = localjob.TorchrunJob(
            nproc=2,
            run_dir=run_dir,
            job=JOB,
            work_dir=tmp_path,
            script_args=["--steps", "100000", "--compute-ms", "40", "--fault", f"stop:1@{STOP_STEP}"],
        ).start()
        stack.append(torchrun.stop)
        job_proc = torchrun.proc
        assert job_proc is not None
        pids = torchrun.wait_for_ranks(90)

        def cont_rank1():  # a stopped worker would survive the group's SIGTERM
            try:
                os.kill(pids[1], signal.SIGCONT)
            except ProcessLookupError:
                pass

        stack.append(cont_rank1)

        # The rank stops itself at step STOP_STEP: that instant is the fault's onset.
        def stopped() -> float | None:
            try:
                return time.monotonic() if psutil.Process(pids[1]).status() == psutil.STATUS_STOPPED else None
            except psutil.NoSuchProcess:
                # the job's log says why, not psutil's error
                raise AssertionError("rank 1 died instead of stopping:\n" + job_proc.log()[-2000:]) from None

        stopped_at = wait_for(stopped, 90, what="rank 1 stopped", interval_s=0.05)
        yield SimpleNamespace(prom=prom, am=am, webhook=webhook, stopped_at=stopped_at, log=tmp_path / "prometheus.log")
    finally:
        for close in reversed(stack):
            close()


def after_stop(live, name: str, **labels):
    """A predicate for webhook.first: this alert, arrived after the stop. Earlier
    ones do not count: with a 2 s threshold, a rank whose heartbeat thread starves
    while torch starts up on 2 busy cores can blip."""
    return lambda at, a: (
        at > live.stopped_at - 0.2
        and a["labels"].get("alertname") == name
        and all(a["labels"].get(k) == v for k, v in labels.items())
    )


def test_frozen_rank_pages_with_its_rank(live):
    arrived_at, alert = wait_for(
        lambda: live.webhook.first(after_stop(live, "RankWatchdogRankFrozen")),
        45,
        what="RankWatchdogRankFrozen at the webhook",
        interval_s=0.2,
        log=live.log,
    )
    latency = arrived_at - live.stopped_at
    print(
        f"\nSIGSTOP -> RankWatchdogRankFrozen at the webhook after {latency:.1f} s "
        f"(thresholds: heartbeat > {FROZEN_AFTER_S} s, for 0s; scrape and evaluation every 1 s)"
    )
    assert alert["status"] == "firing"
    assert alert["labels"]["rank"] == "1", alert
    assert alert["labels"]["training_job"] == JOB and alert["labels"]["severity"] == "critical", alert
    # job/instance stay Prometheus' own (no honor_labels): the scrape job and target.
    assert alert["labels"]["job"] == "rank-watchdog-agent" and alert["labels"]["instance"], alert
    assert "exported_job" not in alert["labels"] and "exported_host" not in alert["labels"], alert
    assert alert["labels"]["host"] and alert["labels"]["host"] in alert["annotations"]["summary"], alert
    assert alert["annotations"]["runbook_url"].endswith("/RankWatchdogRankFrozen.md"), alert
    assert latency < 30, latency  # generous: 2 s threshold + 1 s scrape + 1 s eval on a busy 2-core box
    # Rank 0 is alive and waiting, not frozen: only rank 1 was paged.
    assert (
        live.webhook.first(
            lambda at, a: after_stop(live, "RankWatchdogRankFrozen")(at, a) and a["labels"].get("rank") != "1"
        )
        is None
    )


def test_hang_names_the_culprit_and_is_inhibited(live):
    # The hang the frozen rank causes: Prometheus names rank 1 as the one behind, and
    # the shipped inhibition keeps it off the pager while the frozen rank's alert fires.
    hang = wait_for(
        lambda: prometheus_alert(live.prom, "RankWatchdogJobHang"),
        30,
        what="RankWatchdogJobHang firing",
        interval_s=0.2,
    )
    assert hang["labels"]["training_job"] == JOB and "job" not in hang["labels"], hang["labels"]
    assert re.search(r"culprits\): rank 1 on ", hang["annotations"]["description"]), hang["annotations"]
    suppressed = wait_for(
        lambda: next(
            (
                a
                for a in live.am.alerts()
                if a["labels"]["alertname"] == "RankWatchdogJobHang"
                and a["status"]["state"] == "suppressed"
                and a["status"]["inhibitedBy"]
            ),
            None,
        ),
        20,
        what="RankWatchdogJobHang inhibited in Alertmanager",
        interval_s=0.2,
    )
    assert suppressed["labels"]["training_job"] == JOB
    assert live.webhook.first(after_stop(live, "RankWatchdogJobHang")) is None


def test_coordinator_finding_arrives_with_the_training_job(live):
    # The coordinator's metrics carry no training job (it adopts it from the first
    # report); the rule joins watchdog_coordinator_info's training_job on the target.
    _, alert = wait_for(
        lambda: live.webhook.first(after_stop(live, "RankWatchdogCoordinatorFinding", training_job=JOB)),
        45,
        what="RankWatchdogCoordinatorFinding at the webhook",
        interval_s=0.2,
        log=live.log,
    )
    assert alert["labels"]["kind"] in ("frozen_rank", "collective_hang"), alert["labels"]
    assert alert["labels"]["severity"] == "critical"
    assert alert["labels"]["job"] == "rank-watchdog-coordinator", alert["labels"]


def test_dashboard_panels_return_data(live):
    """Every dashboard query returns series from the live agent and coordinator,
    except the accelerator panels (no NVML on this machine), the coordinator's
    straggler score (it needs straggler.windows x straggler.window-steps steps; this
    job stops at step 30) and the actions annotation (only after a command ran)."""
    wait_for(
        lambda: prometheus_alert(live.prom, "RankWatchdogRankFrozen"),
        30,
        what="alerts for the annotations",
        interval_s=0.2,
    )
    time.sleep(3)  # at least a few rate windows of data; the job has run for several seconds already
    empty = []
    for path in sorted((promcheck.REPO / "grafana" / "dashboards").glob("*.json")):
        for where, expr in dashboard_exprs(json.loads(path.read_text())).items():
            if re.search(r"watchdog_accelerator_|watchdog_coordinator_straggler_score|commands_executed", expr):
                continue
            q = re.sub(r"\$__rate_interval\b", "10s", expr).replace('"$training_job"', f'"{JOB}"')
            if not live.prom.query(re.sub(r"\$\w+", ".*", q)):
                empty.append(f"{path.name}: {where}")
    assert not empty, "queries with no data:\n" + "\n".join(empty)


def test_job_state_and_actions_in_a_real_scrape(live):
    """The coordinator's job state (one-hot) and its action counters, as Prometheus
    scraped them: an alert-only policy acts on nothing, so running or degraded."""
    states = wait_for(
        lambda: live.prom.query('watchdog_coordinator_job_state{watchdog_component="coordinator"} == 1'),
        30,
        what="watchdog_coordinator_job_state scraped",
        interval_s=0.2,
    )
    assert [s["metric"]["state"] for s in states] in (["running"], ["degraded"]), states
    actions = live.prom.query('watchdog_coordinator_actions_total{action="restart"}')
    assert {s["metric"]["outcome"] for s in actions} == {"started", "succeeded", "failed", "dry_run"}
    assert all(float(s["value"][1]) == 0 for s in actions)
