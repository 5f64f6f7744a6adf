"""One site-wide agent, per-job coordinators: each job's reports go to the coordinator
its job wrote into ``<run-dir>/<job>.coordinator`` (watchdog/agent/reporting/discovery.py).

Pure tests on a fake tree first (who is believed), then the proof with real
processes: one agent, started before any job, follows two jobs to their two
coordinators, and a third job without a file is exported but not reported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from waiting import wait_for

from watchdog.agent import config
from watchdog.agent.reporting import discovery
from watchdog.agent.reporting.discovery import Discovery, examine
from watchdog.agent.slotfiles import listing
from watchdog.agent.slotfiles.local_rank import LocalRank
from watchdog.coordinator.journal import event_names as je
from watchdog.dev import localjob
from watchdog.flags import FlagError

FILE = 0o100644


class Tree:
    """path -> (uid, mode, text): what lstat and read see."""

    def __init__(self, files: dict[str, tuple[int, int, str]]):
        self.files = files

    def lstat(self, path):
        if path not in self.files:
            raise FileNotFoundError(path)
        uid, mode, _ = self.files[path]
        return SimpleNamespace(st_uid=uid, st_mode=mode)

    def read(self, path):
        return self.files[path][2]


def ranks(*uids: int, where: str = "/r"):
    return [SimpleNamespace(uid=u, path=f"{where}/job.{i}.slot") for i, u in enumerate(uids)]


@pytest.mark.parametrize(
    "entry,owners,url,why",
    [
        ((1000, FILE, "http://node1:40123\n"), (1000, 1000), "http://node1:40123", ""),
        ((1000, FILE, "https://c.example/base/ \n# comment"), (1000,), "https://c.example/base", ""),
        (None, (1000,), "", "no such file yet"),
        # another user's file: never redirects the job's reports
        ((1001, FILE, "http://evil:1"), (1000, 1000), "", "owned by uid 1001"),
        # another user joined the job's name with a slot of their own: nobody is believed
        ((1000, FILE, "http://node1:1"), (1000, 1001), "", "believed only when all are one"),
        ((1000, 0o120777, "http://node1:1"), (1000,), "", "not a regular file"),  # a symlink
        ((1000, FILE, "node1:40123"), (1000,), "", "no http(s) URL"),
        ((1000, FILE, ""), (1000,), "", "no http(s) URL"),
    ],
)
def test_who_is_believed(entry, owners, url, why):
    path = "/run/rank-watchdog/job-7.coordinator"
    tree = Tree({path: entry} if entry else {})
    found = examine(path, ranks(*owners), tree.lstat, tree.read)
    assert found.url == url and why in found.why_not, found


def test_a_jobs_own_token_beside_its_url():
    url, token = "/run/rank-watchdog/job-7/j.coordinator", "/run/rank-watchdog/job-7/j.token"
    both = {url: (1000, FILE, "http://n:1"), token: (1000, 0o100640, "per-job-secret\n")}
    tree = Tree(both)
    assert examine(url, ranks(1000), tree.lstat, tree.read) == discovery.Found("http://n:1", "", "per-job-secret")
    for bad, why in (
        ((1000, 0o100644, "s"), "readable by every user"),
        ((1001, 0o100640, "s"), "owned by uid 1001"),
        ((1000, 0o100640, "\n"), "is empty"),
    ):
        tree = Tree({**both, token: bad})
        found = examine(url, ranks(1000), tree.lstat, tree.read)
        assert found.url == "" and why in found.why_not, found  # never reported with the wrong token


def test_slots_are_listed_one_directory_down(tmp_path: Path):
    (tmp_path / "a.rank0.pid1.slot").write_bytes(b"")
    (tmp_path / "job-7").mkdir()
    (tmp_path / "job-7" / "b.rank0.pid2.slot").write_bytes(b"")
    (tmp_path / "job-7" / "deeper").mkdir()
    (tmp_path / "job-7" / "deeper" / "c.rank0.pid3.slot").write_bytes(b"")
    (tmp_path / "link").symlink_to(tmp_path / "job-7")
    got = listing.list_slots(str(tmp_path))
    assert sorted(Path(p).relative_to(tmp_path).as_posix() for p in got) == [
        "a.rank0.pid1.slot",
        "job-7/b.rank0.pid2.slot",
    ]


def test_unusable_job_names_and_state_change_logging():
    events = []
    log = SimpleNamespace(info=lambda event, **kw: events.append((event, kw)))
    tree = Tree({"/r/a.coordinator": (5, FILE, "http://h:1")})
    d = Discovery("/r", lstat=tree.lstat, read=tree.read, log=log)
    assert d("../etc/passwd", ranks(5)) == "" and d(".hidden", ranks(5)) == ""
    assert d("a", ranks(5)) == "http://h:1" and d.token_of("a") == ""
    assert d("a", ranks(5)) == "http://h:1"
    assert [e for e, kw in events if kw.get("job") == "a"] == ["coordinator found"], "logged once, not per report"
    split = [SimpleNamespace(uid=5, path="/r/x/a.0.slot"), SimpleNamespace(uid=5, path="/r/y/a.1.slot")]
    split_ranks = cast("list[LocalRank]", split)  # Discovery reads only a rank's uid and path
    assert d("a", split_ranks) == "" and "several directories" in events[-1][1]["reason"]
    tree.files["/r/a.coordinator"] = (5, FILE, "http://h:2")  # the job's coordinator moved
    assert d("a", ranks(5)) == "http://h:2"
    assert [kw["url"] for e, kw in events if e == "coordinator found"] == ["http://h:1", "http://h:2"]


def test_flag_excludes_a_fixed_url():
    assert config.load(["--run-dir", "/r", "--coordinator.url-from-run-dir", "true"], {}).coordinator_from_run_dir
    assert config.load(
        [], {"WATCHDOG_RUN_DIR": "/r", "WATCHDOG_COORDINATOR_URL_FROM_RUN_DIR": "true"}
    ).coordinator_from_run_dir
    with pytest.raises(FlagError, match="exclude each other"):
        config.load(
            ["--run-dir", "/r", "--coordinator.url-from-run-dir", "true", "--coordinator.url", "http://c:1"], {}
        )


def journal(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def joined(path: Path) -> tuple[str, set[int]]:
    """(the job the coordinator serves, the ranks that joined it)."""
    records = journal(path)
    job = next((r["job"] for r in records if r["event"] == je.START), "")
    return job, {r["rank"] for r in records if r["event"] == je.RANK_JOINED}


@pytest.mark.integration
def test_one_agent_follows_two_jobs_to_their_two_coordinators(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = dict(os.environ, WATCHDOG_JOB_TOKEN="site-token-of-at-least-32-bytes-xx", PYTHONUNBUFFERED="1")
    started: list = []
    try:
        # the site-wide agent, started once, before any job
        agent = localjob.start_daemon(
            "agent",
            "agent",
            ["--run-dir", str(run), "--coordinator.url-from-run-dir", "true", "--report.interval-seconds", "0.25"],
            tmp_path,
            env,
        )
        started.append(agent)
        # job-a writes into the shared run dir and its coordinator takes the agent's token;
        # job-b has a directory of its own (as Slurm's Prolog makes) and a token of its own
        own_token = "job-b-own-token-of-at-least-32-bytes"
        dirs = {"job-a": run, "job-b": run / "job-b"}
        dirs["job-b"].mkdir(mode=0o750)
        coords = {}
        for job, world in (("job-a", 2), ("job-b", 1)):
            work = tmp_path / job
            work.mkdir()
            coords[job] = localjob.start_daemon(
                "coordinator",
                "coordinator",
                ["--job.name", job, "--job.world-size", str(world), "--journal", str(work / "journal.jsonl")],
                work,
                dict(env, WATCHDOG_JOB_TOKEN=own_token) if job == "job-b" else env,
            )
            started.append(coords[job])
        token_file = dirs["job-b"] / f"job-b{discovery.TOKEN_SUFFIX}"
        token_file.touch(mode=0o640)
        token_file.write_text(own_token + "\n")
        writers = []
        for job, rank, world in (("job-a", 0, 2), ("job-a", 1, 2), ("job-b", 0, 1), ("job-c", 0, 1)):
            argv = [sys.executable, "-m", "watchdog.agent.testing", "--run-dir", str(dirs.get(job, run)), "--job", job]
            argv += ["--rank", str(rank), "--world-size", str(world), "--step-seconds", "0.1"]
            writers.append(subprocess.Popen(argv, env=env))
        # each job announces its coordinator as train.sbatch does: atomically, once it listens
        for job, coord in coords.items():
            tmp = dirs[job] / f".{job}.tmp"
            tmp.write_text(coord.url + "\n")
            tmp.rename(dirs[job] / f"{job}{discovery.SUFFIX}")
        journal_a, journal_b = tmp_path / "job-a" / "journal.jsonl", tmp_path / "job-b" / "journal.jsonl"
        wait_for(
            lambda: joined(journal_a) == ("job-a", {0, 1}),
            30,
            "job-a's ranks at job-a's coordinator",
            log=agent.log_path,
        )
        wait_for(
            lambda: joined(journal_b) == ("job-b", {0}), 30, "job-b's rank at job-b's coordinator", log=agent.log_path
        )
        # job-c wrote no file: exported here, reported nowhere
        with urllib.request.urlopen(f"{agent.url}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        assert 'training_job="job-c"' in metrics
        (unaddressed,) = [
            ln for ln in metrics.splitlines() if ln.startswith("watchdog_agent_reports_unaddressed_total ")
        ]
        assert float(unaddressed.split()[1]) > 0, "job-c's reports are counted as not sent"
        log = agent.log()
        # no report went astray: a coordinator refuses another job's report (409) or another token (401)
        assert '"report failed"' not in log and "HTTP 40" not in log, log[-2000:]
        assert '"coordinator not found"' in log and "job-c.coordinator" in log, log[-2000:]
    finally:
        for w in locals().get("writers", []):
            if w.poll() is None:
                w.send_signal(signal.SIGCONT)
                w.kill()
            w.wait()
        for p in started:
            p.stop()
