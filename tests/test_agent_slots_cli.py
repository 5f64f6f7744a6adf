"""``watchdog slots``: a table (or JSON) straight from the slot files."""

import json
import os
import subprocess
import sys
import time

import psutil

from watchdog import rundir
from watchdog.agent import testing
from watchdog.agent.slots_cli import main

S = 1_000_000_000


def dead_identity(job, rank):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start_us = int(psutil.Process(child.pid).create_time() * 1e6)
    child.wait()
    return testing.identity(job, rank, 3, pid=child.pid, proc_start_us=start_us)


def test_table_and_json(tmp_path, capsys):
    run = str(tmp_path)
    live = testing.RankSlot(run, testing.identity("j", 0, 3))
    live.step(400_000_000, 50_000_000, 150_000_000)
    live.enter_collective(7)
    now = time.monotonic_ns()
    old = testing.RankSlot(run, dead_identity("j", 1), mono_ns=now - 120 * S, wall_ns=time.time_ns() - 120 * S)
    died = testing.RankSlot(run, dead_identity("j", 2))
    died.step(100_000_000)
    (tmp_path / "junk.slot").write_bytes(b"\x00" * 2000)

    assert main(["--run-dir", run]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:6] == ["job", "rank", "pid", "state", "proc", "step"]
    row0, row1, row2 = (next(line.split() for line in lines[1:4] if line.split()[1] == r) for r in "012")
    assert row0[3] == "alive" and row0[5] == "1"
    assert "in #7 all_reduce" in out
    assert row0[8:12] == ["0.400", "0.050", "0.150", "0.200"]
    assert row1[3] == "stale" and row2[3] == "dead"
    assert "unreadable:" in out and "junk.slot: corrupt" in out

    assert main(["--run-dir", run, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    states = {r["rank"]: (r["state"], r["alive"], r["proc_status"]) for r in doc["ranks"]}
    assert states[0][:2] == ("alive", True)
    assert states[1] == ("stale", False, "gone") and states[2] == ("dead", False, "gone")
    assert doc["errors"][0]["reason"] == "corrupt"
    for w in (live, old, died):
        w.close()


def test_superseded_and_empty(tmp_path, capsys):
    run = str(tmp_path)
    assert main(["--run-dir", run]) == 0
    assert "(no slot files)" in capsys.readouterr().out
    a = testing.RankSlot(run, dead_identity("j", 0))
    b = testing.RankSlot(run, testing.identity("j", 0, 3), wall_ns=time.time_ns() + S)
    assert main(["--run-dir", run, "--json"]) == 0
    states = sorted(r["state"] for r in json.loads(capsys.readouterr().out)["ranks"])
    assert states == ["alive", "superseded"]
    a.close()
    b.close()


def test_without_run_dir_it_reads_the_hooks_default_and_says_which(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("WATCHDOG_RUN_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert main([]) == 0
    assert f"reading the hook's default: {rundir.default_run_dir(os.environ)}" in capsys.readouterr().err
