"""py-spy missing on a real job with an abort policy: the evidence says why, and the
abort is still carried out (it waits for the stack answers, and a failed dump is an
answer). A 2-rank torchrun job (gloo, CPU) hung before an all-reduce."""

from __future__ import annotations

import os
import secrets

import pytest
from waiting import wait_for

from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.dev import localjob

pytestmark = pytest.mark.integration


def test_abort_works_and_evidence_says_py_spy_is_missing(tmp_path):
    job = "nopyspy-" + secrets.token_hex(3)
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(16))
    os.chmod(token, 0o600)
    env = {**os.environ, "WATCHDOG_JOB_TOKEN_FILE": str(token)}
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[actions]\ncollective_hang = "abort"\nfrozen_rank = "abort"\n[limits]\n'
        "min_finding_age_seconds = 0\nabort_grace_seconds = 3\n"
    )
    run_dir, jpath = tmp_path / "run", tmp_path / "journal.jsonl"
    run_dir.mkdir()
    torchrun = localjob.TorchrunJob(
        nproc=2,
        run_dir=run_dir,
        job=job,
        work_dir=tmp_path,
        script_args=["--steps", "2000", "--compute-ms", "30", "--fault=hang:1@15"],
    )
    procs = []
    try:
        coord = localjob.start_coordinator(
            tmp_path, job, 2, jpath, env=env, extra=["--tick.interval-seconds", "0.25", "--policy.file", str(policy)]
        )
        procs.append(coord)
        procs.append(
            localjob.start_agent(
                tmp_path,
                run_dir,
                job,
                env=env,
                extra=[
                    "--coordinator.url",
                    coord.url,
                    "--report.interval-seconds",
                    "0.25",
                    "--stacks.py-spy",
                    str(tmp_path / "no-such-dir" / "py-spy"),
                ],
            )
        )
        torchrun.start()

        def events(name):
            return [r for r in journal.read(str(jpath)) if r["event"] == name]

        outcome = wait_for(lambda: events(je.ACTION_OUTCOME), 180, "the abort's outcome", log=coord.log_path)
        assert outcome[0]["action"] == "abort" and outcome[0]["ok"] is True, outcome
        assert torchrun.wait(60) != 0  # the job was stopped, not left hanging
        findings = events(je.FINDING)
        assert findings and findings[0]["ranks"] == [1], findings
        stacks = [r for r in events(je.EVIDENCE) if r.get("type") == "dump_stacks"]
        assert stacks and all("py-spy not found" in r["error"] for r in stacks), [(r["ok"], r["error"]) for r in stacks]
    finally:
        for p in procs:
            p.stop()
        torchrun.stop()
