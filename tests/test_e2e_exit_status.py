"""A nonzero exit is a failure, whatever caught the exception, on real jobs:
``watchdog run -- torchrun --max-restarts=2`` (2 gloo ranks on CPU) with a
restart policy, a real agent and coordinator. Each job fails once per attempt
(tests/fixtures/exits/) and then finishes:

- a plain loop: rank 1 catches an exception, prints it and calls ``sys.exit(1)``;
  then rank 1 calls ``os._exit(3)``;
- a real ``@hydra.main`` script (hydra prints the exception and calls
  ``sys.exit(1)``): rank 1 raises; then rank 1's DataLoader worker is SIGKILLed
  (as the OOM killer does) and the rank fails on it.

- a click command's ``ClickException`` (click prints "Error: ..." and exits 1 after
  its except block); an exception in a Lightning ``training_step`` (ddp on gloo); a
  ``transformers.Trainer`` callback that raises, then an ``accelerate`` loop that raises.

Each failure is a dead_rank finding for rank 1 with its cause (the exception) and
its exit status, journaled before the restarted group's first step; each is
restarted once, by torchrun, and journaled as the launcher's restart (the
policy's restart action does not restart the group again); the final attempt's
clean finish raises nothing.
Bounds are generous: a busy 2-core machine.

On two torchrun nodes with an agent each, a death whose successor the launcher
started before every host reported is still named, and not restarted again.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_for

from watchdog.contracts import slot as wire
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.dev import localjob

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "exits"
POLICY = (
    '[actions]\ndead_rank = "restart"\n[limits]\nmin_finding_age_seconds = 0\n'
    "cooldown_seconds = 0\nabort_grace_seconds = 3\nmax_restarts = 3\n"
)


def run_job(tmp: Path, script: Path, script_args: list[str], env: dict | None = None) -> list[dict]:
    """Coordinator (restart policy), agent, and the job to its end; the journal."""
    job = "exits-" + secrets.token_hex(3)
    token = tmp / "token"
    token.write_text(secrets.token_hex(16))
    base = {**os.environ, "WATCHDOG_JOB_TOKEN_FILE": str(token)}
    jpath, run_dir = tmp / "journal.jsonl", tmp / "run"
    run_dir.mkdir()
    (tmp / "policy.toml").write_text(POLICY)
    flags = ["--tick.interval-seconds", "0.25", "--policy.file", str(tmp / "policy.toml")]
    procs = [localjob.start_coordinator(tmp, job, 2, jpath, env=base, extra=flags)]
    job_proc = localjob.TorchrunJob(
        nproc=2,
        run_dir=run_dir,
        job=job,
        work_dir=tmp,
        script=script,
        script_args=script_args,
        torchrun_args=["--max-restarts=2"],
        env={**base, **(env or {})},
        prefix=localjob.WATCHDOG_RUN,
    )
    try:
        procs.append(
            localjob.start_agent(
                tmp,
                run_dir,
                job,
                env=base,
                extra=["--coordinator.url", procs[0].url, "--report.interval-seconds", "0.25"],
            )
        )
        job_proc.start()
        rc = job_proc.wait(240)
        logs = "\n".join(p.log()[-3000:] for p in [*procs, job_proc.proc] if p is not None)
        assert rc == 0, logs
    finally:
        job_proc.stop()
        for p in reversed(procs):
            p.stop(grace_s=3.0)
    return journal.read(str(jpath))


def check_failures(recs: list[dict], expected: list[tuple[str, str]]) -> None:
    """Each failure in ``expected`` (text of its cause, its exit) is a dead_rank finding
    for rank 1, journaled with its death before its successor's first step; one
    restart each; nothing raised about the attempt that finished."""
    findings = [r for r in recs if r["event"] == je.FINDING and r["kind"] == "dead_rank"]
    assert len(findings) == len(expected), [f["reason"] for f in findings]
    for f, (cause, exit_text) in zip(findings, expected):
        assert f["ranks"] == [1], f
        # Its own exit status, or its launcher's SIGTERM: a gloo rank takes seconds to tear down
        # after its exception, and where rank 0 (failed on the closed connection) exits first,
        # torchrun stops the group while rank 1 is still exiting. The cause is named either way.
        exits = {exit_text: int(exit_text.split()[1]), "exit -15 (SIGTERM)": -15}
        assert f"died: {cause}" in f["reason"] and any(e in f["reason"] for e in exits), f["reason"]
        assert "clean exit" not in f["reason"], f["reason"]
        pid = f["evidence"]["pids"]["1"]
        death = f["evidence"]["death"]["1"]
        assert death["exit_code"] in exits.values(), death
        at = recs.index(f)
        # its death, with the cause, journaled before the new rank 1 and its first step
        died = next(
            i
            for i, r in enumerate(recs)
            if r["event"] == je.STATE and r.get("pid") == pid and "alive" in r.get("changed", {})
        )
        assert cause in recs[died].get("cause", ""), recs[died]
        replaced = next(i for i, r in enumerate(recs) if r["event"] == je.RANK_RESTARTED and r.get("old_pid") == pid)
        new_pid = recs[replaced]["pid"]
        first_step = next(
            i for i, r in enumerate(recs) if r.get("pid") == new_pid and r["event"] == je.STATE and r.get("step", 0) > 0
        )
        assert died < replaced and at < first_step, (died, at, replaced, first_step)
    # One restart per failure, the launcher's (torchrun tore the group down before the
    # policy's grace ran out), journaled as such; the policy never restarts it again: its
    # action waits for the launcher's restart, or is held where that restart was seen first.
    actions = [r for r in recs if r["event"] == je.ACTION]
    held = [r for r in recs if r["event"] == je.ACTION_HELD and "restarted by its launcher already" in r["reason"]]
    assert [a["kind"] for a in actions + held] == ["dead_rank"] * len(expected), (actions, held)
    assert not [r for r in recs if r["event"] == je.RESTART]
    launcher = [r for r in recs if r["event"] == je.LAUNCHER_RESTART]
    assert len(launcher) == len(expected), launcher
    assert sorted(r["action_id"] for r in launcher if r.get("action_id")) == sorted(a["action_id"] for a in actions)
    assert [r["by"] for r in launcher if not r.get("action_id")] == ["launcher"] * len(held), launcher
    outcomes = [r for r in recs if r["event"] == je.ACTION_OUTCOME]
    assert [o["ok"] for o in outcomes] == [True] * len(actions), outcomes
    # The last attempt finished cleanly: no finding after its group resumed, both ranks exited.
    last_resumed = max(i for i, r in enumerate(recs) if r["event"] == je.RESUMED)
    assert not [r for r in recs[last_resumed:] if r["event"] == je.FINDING]
    exited = [
        r
        for r in recs[last_resumed:]
        if r["event"] == je.STATE and r.get("changed", {}).get("status", [""])[-1:] == ["exited"]
    ]
    assert sorted(r["rank"] for r in exited) == [0, 1], exited
    assert not [
        r
        for r in recs[last_resumed:]
        if r["event"] == je.STATE and r.get("changed", {}).get("status", [""])[-1:] == ["failed"]
    ]


def timeline(tmp: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "watchdog.cli", "timeline", str(tmp / "journal.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_caught_exception_and_os_exit_are_named_with_cause_and_status(tmp_path):
    recs = run_job(
        tmp_path,
        FIXTURES / "exit_loop.py",
        ["--steps", "30", "--ckpt-every", "5", "--ckpt-dir", str(tmp_path), "--faults", "exit1:1@8,os_exit3:1@16"],
    )
    check_failures(
        recs,
        [
            ("ValueError: bad batch at step 8 at exit_loop.py:", "exit 1 by sys.exit(1)"),
            ("exit 3 by os._exit(3)", "exit 3 by os._exit(3)"),
        ],
    )
    text = timeline(tmp_path)
    assert "ValueError: bad batch at step 8" in text and "os._exit(3)" in text, text
    assert "restart 1 by the launcher" in text and "restart 2 by the launcher" in text, text


def test_hydra_failures_and_a_killed_dataloader_worker_are_named(tmp_path):
    recs = run_job(
        tmp_path,
        FIXTURES / "hydra_loop.py",
        ["steps=30", "ckpt_every=5", f"ckpt_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'hydra'}"],
        env={"EXIT_FAULTS": "raise:1@8,loader_kill:1@16"},
    )
    check_failures(
        recs,
        [
            ("ValueError: bad batch at step 8 at hydra_loop.py:", "exit 1 by sys.exit(1)"),
            ("RuntimeError: DataLoader worker (pid", "exit 1 by sys.exit(1)"),
        ],
    )
    text = timeline(tmp_path)
    assert "DataLoader worker" in text, text


def _first_step_wall(job, old: set[int]) -> float | None:
    """When the earliest new incarnation (pid not in ``old``) completed its first step,
    on the wall clock, from its slot's own step records; None before any did."""
    out = []
    for host in ("hosta", "hostb"):
        for path in wire.list_slot_files(str(job.tmp / host)):
            try:
                slot = wire.read_slot(path)
            except (wire.SlotError, OSError):
                continue
            h = slot.header
            if h.identity.job != job.job or h.identity.pid in old:
                continue
            ends = [r.t_ns for r in slot.records if r.kind == wire.RecordKind.STEP_END]
            if ends:
                out.append((h.created_wall_ns + min(ends) - h.created_mono_ns) / 1e9)
    return min(out, default=None)


@pytest.mark.timeout(300)
def test_a_death_on_one_host_replaced_before_every_host_reported_is_named(tmp_path):
    """Two torchrun nodes (hosta: ranks 0-1, hostb: ranks 2-3; test_e2e_blind.TwoHosts)
    under ``watchdog run``, --max-restarts=1, a restart policy. Rank 2 catches an
    exception and exits 1; hostb's torchrun replaces it. hosta's agent (every 3 s) is
    stopped from just before the failure until hostb's new rank 2 is journaled: a late
    report, so dead_rank still waits for hosta (it may hold an earlier death) when the
    successor arrives. The death is named for rank 2 with its cause and exit status,
    after the successor's arrival and before the new group's first step; the launcher's
    restart is journaled once and the policy restarts nothing; the job finishes."""
    from test_e2e_blind import TwoHosts

    script = (
        str(FIXTURES / "exit_loop.py"),
        *("--steps", "40", "--step-ms", "100", "--ckpt-every", "5", "--ckpt-dir", str(tmp_path)),
        *("--faults", "exit1:2@25", "--round-store"),
    )
    job = TwoHosts(tmp_path, max_restarts=1, policy=POLICY, script=script, intervals={"hosta": 3.0})
    try:
        job.training(past=15, timeout_s=180)
        old = {*job.pids("hosta"), *job.pids("hostb")}
        agent_a = job.agents["hosta"].popen.pid
        os.kill(agent_a, signal.SIGSTOP)
        try:
            replaced = wait_for(
                lambda: [r for r in job.records(je.RANK_RESTARTED) if r["rank"] == 2],
                120,
                "hostb's new rank 2 journaled",
                log=job.coord.log_path,
            )
        finally:
            os.kill(agent_a, signal.SIGCONT)
        found = wait_for(
            lambda: job.records(je.FINDING), 60, "the death named once hosta reports", log=job.coord.log_path
        )
        stepped = wait_for(lambda: _first_step_wall(job, old), 120, "the new group's first step")
        for host, node in job.nodes.items():
            assert node.popen.wait(180) == 0, (host, node.log()[-3000:])
        recs = journal.read(str(job.jpath))
    finally:
        job.close()
    # Only rank 2 is named. Its peers waited for it in an all-reduce while it exited (seconds,
    # under load) and dead_rank waited for hosta: collective_hang may name it first, as designed.
    found = [r for r in recs if r["event"] == je.FINDING]
    assert all(f["ranks"] == [2] for f in found), [(f["kind"], f["reason"]) for f in found]
    dead = [f for f in found if f["kind"] == "dead_rank"]
    assert len(dead) == 1 and {f["kind"] for f in found} <= {"dead_rank", "collective_hang"}, found
    f = dead[0]
    assert "died: ValueError: bad batch at step 25 at exit_loop.py:" in f["reason"], f["reason"]
    assert "exit 1 by sys.exit(1)" in f["reason"] and f["evidence"]["death"]["2"]["exit_code"] == 1, f
    # judged after the successor took its place (the case under test), before the new group stepped
    assert recs.index(replaced[0]) < recs.index(f), "the successor came after the finding: nothing was proven"
    assert f["detected_wall"] < stepped, (f["detected_wall"], stepped)
    # torchrun's restart, journaled once as the launcher's; the policy's restart held back, nothing signalled
    launcher = [r for r in recs if r["event"] == je.LAUNCHER_RESTART]
    assert [(r["restart"], r["by"]) for r in launcher] == [(1, "launcher")], launcher
    assert not [r for r in recs if r["event"] in (je.ACTION, je.RESTART)]
    assert not [r for r in recs if r["event"] == je.COMMAND and r.get("type") == "signal"]
    held = [r for r in recs if r["event"] == je.ACTION_HELD]
    assert held and "restarted by its launcher already" in held[0]["reason"], held


def test_a_click_commands_failure_is_named(tmp_path):
    recs = run_job(
        tmp_path,
        FIXTURES / "click_loop.py",
        ["train", "--steps", "30", "--ckpt-dir", str(tmp_path), "--fail-rank", "1", "--fail-step", "8"],
    )
    check_failures(recs, [("ClickException: bad batch at step 8 at click_loop.py:", "exit 1 by sys.exit(1)")])


def test_an_exception_in_a_lightning_training_step_is_named(tmp_path):
    recs = run_job(
        tmp_path,
        FIXTURES / "lightning_loop.py",
        ["--steps", "30", "--fail-rank", "1", "--fail-step", "8", "--root", str(tmp_path)],
    )
    check_failures(recs, [("ValueError: bad batch at step 8 at lightning_loop.py:", "exit 1")])


def test_failures_in_a_hf_trainer_callback_and_an_accelerate_loop_are_named(tmp_path):
    recs = run_job(
        tmp_path,
        FIXTURES / "hf_loop.py",
        ["--steps", "30", "--fail-rank", "1", "--fail-step", "8", "--out", str(tmp_path / "out")],
    )
    check_failures(
        recs,
        [
            ("ValueError: bad batch at step 8 at hf_loop.py:", "exit 1"),
            ("ValueError: bad batch at step 8 at hf_loop.py:", "exit 1"),
        ],
    )


@pytest.mark.parametrize("callback", [[], ["--callback"]], ids=["zero-code", "explicit-callback"])
def test_a_sigterm_lightning_turns_into_a_clean_exit_is_named(tmp_path, callback):
    """Every rank SIGTERMed at one step (a preemption): Lightning's loop raises
    SIGTERMException, a SystemExit with status 0. With WatchdogCallback (the script's
    own, or the one ``watchdog run`` adds to every Trainer the script makes) the
    ranks exit 143 and the first is named dead, with that cause; torchrun restarts
    once and the job finishes."""
    recs = run_job(
        tmp_path,
        FIXTURES / "lightning_loop.py",
        ["--steps", "30", "--sigterm-step", "8", *callback, "--root", str(tmp_path)],
    )
    # The ranks shut down for seconds after the exception (under load): a wedge naming nobody,
    # or the rank still exiting, may be said first. The death is named, with its cause.
    found = [r for r in recs if r["event"] == je.FINDING]
    dead = [f for f in found if f["kind"] == "dead_rank"]
    assert len(dead) == 1, [(f["kind"], f["reason"]) for f in found]
    f = dead[0]
    # Every rank got the signal at once: one named first ("died: <cause>"), or all named together
    # when their deaths land within milliseconds ("ranks 0-1: <cause>"). The cause is said either way.
    assert "SIGTERMException at training_epoch_loop.py:" in f["reason"], f["reason"]
    assert "exit 143" in f["reason"] and "clean exit" not in f["reason"], f["reason"]
    assert {d["exit_code"] for r, d in f["evidence"]["death"].items() if int(r) in f["ranks"]} == {143}, f
    launcher = [r for r in recs if r["event"] == je.LAUNCHER_RESTART]
    assert len(launcher) == 1 and not [r for r in recs if r["event"] == je.RESTART], launcher
    last_resumed = max(i for i, r in enumerate(recs) if r["event"] == je.RESUMED)
    assert not [r for r in recs[last_resumed:] if r["event"] == je.FINDING]
