"""Live: the shipped Alertmanager configuration holds back a job's pages while the
monitor acts on it (RankWatchdogActionInProgress), and only that job's; the
action's outcome still pages. A real Alertmanager, alerts posted to its API."""

from __future__ import annotations

import json
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest
from test_alert_live import Alertmanager, Webhook, webhook_alertmanager_config
from waiting import wait_for

pytestmark = pytest.mark.integration


def alert(name: str, job: str, severity: str, **labels: str) -> dict:
    end = datetime.now(timezone.utc) + timedelta(minutes=10)
    return {
        "labels": {"alertname": name, "training_job": job, "namespace": "ml", "cluster": "c1", "severity": severity}
        | labels,
        "endsAt": end.isoformat(),
    }


def test_an_action_in_progress_inhibits_the_jobs_other_pages(tmp_path):
    webhook = Webhook()
    am = Alertmanager(tmp_path, webhook_alertmanager_config(tmp_path / "am.yml", webhook.url))
    try:
        posted = [
            alert("RankWatchdogActionInProgress", "train", "warning", state="restarting"),
            alert("RankWatchdogRankDead", "train", "critical", rank="1", host="n1"),
            alert("RankWatchdogCoordinatorFinding", "train", "critical", kind="dead_rank"),
            alert("RankWatchdogRestartFailed", "train", "critical", action="restart", outcome="failed"),
            alert("RankWatchdogRankDead", "other", "critical", rank="1", host="n2"),
        ]
        req = urllib.request.Request(
            am.url + "/api/v2/alerts",
            data=json.dumps(posted).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200

        def states() -> dict[tuple[str, str], str] | None:
            got = {(a["labels"]["alertname"], a["labels"]["training_job"]): a["status"] for a in am.alerts()}
            if len(got) < len(posted) or not got[("RankWatchdogRankDead", "train")]["inhibitedBy"]:
                return None
            return {k: v["state"] for k, v in got.items()}

        got = wait_for(states, 20, what="the inhibition applied", interval_s=0.2, log=am.log_path)
        assert got[("RankWatchdogRankDead", "train")] == "suppressed"
        assert got[("RankWatchdogCoordinatorFinding", "train")] == "suppressed"
        assert got[("RankWatchdogActionInProgress", "train")] == "active"
        assert got[("RankWatchdogRestartFailed", "train")] == "active"  # the outcome always pages
        assert got[("RankWatchdogRankDead", "other")] == "active"  # another job's page is not held
    finally:
        am.stop()
        webhook.close()
