"""``watchdog run -- torchrun ...`` on real jobs (gloo on CPU, a real agent and
coordinator): a custom training loop that knows nothing of rank-watchdog
(tests/fixtures/unmodified/custom_loop.py: plain init_process_group("gloo"), a
DataLoader, torch.save checkpoints and a resume), unchanged.

- rank 1 SIGKILLed: dead_rank names it, the coordinator's restart brings the
  group back (the hook's restart-safe init: without it the restarted group
  fails at init, test_e2e_restart_outcomes) and the job finishes from its checkpoint;
- rank 1 hangs in Python before its step: collective_hang names rank 1 alone,
  from the DDP buckets the others wait in (counted by the automatic comm hook);
- the example, which uses the explicit API, leaves the same slot data with and
  without ``watchdog run``.
Bounds are generous: a busy 2-core machine.
"""

from __future__ import annotations

import importlib.util
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
from watchdog.hook.testing import records_of, step_splits

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parent / "fixtures" / "unmodified" / "custom_loop.py"
FSDP2_SCRIPT = SCRIPT.with_name("fsdp2_loop.py")


def records(path: Path, *names: str) -> list[dict]:
    try:
        recs = journal.read(str(path))
    except OSError:
        return []
    return [r for r in recs if not names or r["event"] in names]


class Stack:
    """Coordinator, agent and ``watchdog run -- torchrun`` of the unmodified loop
    (``prefix=()``: plain torchrun, for scripts that call the API themselves)."""

    def __init__(
        self,
        tmp: Path,
        nproc: int,
        policy: str | None,
        script_args: list[str],
        env: dict | None = None,
        script: Path = SCRIPT,
        prefix: tuple = localjob.WATCHDOG_RUN,
        coordinator_flags: tuple = (),
    ):
        self.tmp, self.nproc, self.job = tmp, nproc, "zero-" + secrets.token_hex(3)
        token = tmp / "token"
        token.write_text(secrets.token_hex(16))
        self.env = {**os.environ, "WATCHDOG_JOB_TOKEN_FILE": str(token)}
        self.jpath, self.run_dir = tmp / "journal.jsonl", tmp / "run"
        self.run_dir.mkdir()
        self.policy, self.coordinator_flags = policy, coordinator_flags
        self.procs: list[localjob.Process] = []
        self.torchrun = localjob.TorchrunJob(
            nproc=nproc,
            run_dir=self.run_dir,
            job=self.job,
            work_dir=tmp,
            script=script,
            script_args=script_args,
            torchrun_args=["--max-restarts=1"] if policy else [],
            env={**self.env, **(env or {})},
            prefix=prefix,
        )

    def start(self) -> Stack:
        extra = ["--tick.interval-seconds", "0.25", *self.coordinator_flags]
        if self.policy:
            (self.tmp / "policy.toml").write_text(self.policy)
            extra += ["--policy.file", str(self.tmp / "policy.toml")]
        coord = localjob.start_coordinator(self.tmp, self.job, self.nproc, self.jpath, env=self.env, extra=extra)
        self.procs.append(coord)
        self.procs.append(
            localjob.start_agent(
                self.tmp,
                self.run_dir,
                self.job,
                env=self.env,
                extra=["--coordinator.url", coord.url, "--report.interval-seconds", "0.25"],
            )
        )
        self.torchrun.start()
        return self

    def step_of(self, rank: int) -> int:
        pid = self.torchrun.rank_pids().get(rank)
        for path in wire.list_slot_files(str(self.run_dir)):
            try:
                header = wire.read_slot(path).header
            except (wire.SlotError, OSError):
                continue
            if header.identity.pid == pid:
                return header.words[wire.H_STEP]
        return 0

    def stop(self) -> None:
        self.torchrun.stop()
        for p in reversed(self.procs):
            p.stop(grace_s=3.0)

    def logs(self) -> str:
        return "\n".join(p.log()[-2500:] for p in [*self.procs, self.torchrun.proc] if p is not None)


def test_an_unmodified_script_killed_rank_is_named_and_the_restart_brings_the_job_back(tmp_path):
    policy = (
        '[actions]\ndead_rank = "restart"\n[limits]\nmin_finding_age_seconds = 0\n'
        "cooldown_seconds = 0\nabort_grace_seconds = 3\nmax_restarts = 1\n"
    )
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    # 4 ranks: with 2 the previous attempt's addresses did not always break the restart
    # here; with 4, WATCHDOG_RESTART_SAFE_INIT=0 ends in "Gloo connectFullMesh failed"
    stack = Stack(tmp_path, 4, policy, ["--steps", "50", "--step-ms", "40", "--ckpt-dir", str(ckpt)])
    try:
        stack.start()
        assert stack.torchrun.proc is not None
        job_log = stack.torchrun.proc.log_path
        wait_for(lambda: stack.step_of(1) >= 15, timeout_s=90, what="rank 1 past step 15", log=job_log)
        victim = stack.torchrun.rank_pids()[1]
        os.kill(victim, signal.SIGKILL)
        code = stack.torchrun.wait(150)
        wait_for(lambda: records(stack.jpath, je.RESUMED), timeout_s=30, what="the resumed record")
    finally:
        stack.stop()
    log = stack.logs()
    assert code == 0, log
    recs = records(stack.jpath)
    dead = [r for r in recs if r["event"] == je.FINDING and r["kind"] == "dead_rank"]
    assert dead and dead[0]["ranks"] == [1], (dead, log)
    assert all(r["ranks"] == [1] for r in recs if r["event"] == je.FINDING), [r for r in recs if "ranks" in r]
    actions = [r for r in recs if r["event"] == je.ACTION]
    assert [a["action"] for a in actions] == ["restart"], actions
    assert records(stack.jpath, je.RESUMED), log
    assert stack.torchrun.proc is not None
    torchrun_log = stack.torchrun.proc.log()
    assert "resumed at step " in torchrun_log and "done: 50 steps of 4 ranks" in torchrun_log, torchrun_log[-3000:]
    assert "connectFullMesh" not in torchrun_log
    print(f"\nzero-code kill: {dead[0]['reason'][:140]}; restart -> resumed {records(stack.jpath, je.RESUMED)[0]}")


def test_an_unmodified_script_hanging_rank_is_the_only_one_named(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    stack = Stack(
        tmp_path,
        3,
        None,
        ["--steps", "400", "--step-ms", "40", "--ckpt-dir", str(ckpt)],
        env={"CUSTOM_LOOP_HANG": "1@15"},
    )
    try:
        stack.start()
        found = wait_for(
            lambda: [r for r in records(stack.jpath, je.FINDING) if r["kind"] == "collective_hang"],
            timeout_s=120,
            what="collective_hang",
            log=stack.procs[0].log_path,
        )
        findings = records(stack.jpath, je.FINDING)
    finally:
        stack.stop()
    assert found[0]["ranks"] == [1], (found, stack.logs())
    assert all(1 in f["ranks"] and 0 not in f["ranks"] and 2 not in f["ranks"] for f in findings), findings
    print(f"\nzero-code hang: {found[0]['reason'][:200]}")


def _slot_data(run_dir: Path) -> dict[int, tuple]:
    """rank -> what the slot says about the run: steps with their collectives,
    data waits and phase; phase and process-group records; collective counters."""
    out = {}
    for path in wire.list_slot_files(str(run_dir)):
        snap = wire.read_slot(path)
        h = snap.header
        steps = [(s.step, s.collectives, s.last_coll_seq, s.data_waits, s.phase) for s in step_splits(snap)]
        phases = [tuple(r.payload[:2]) for r in records_of(snap, wire.RecordKind.PHASE)]
        pgs = [r.payload[0] for r in records_of(snap, wire.RecordKind.PG)]
        words = h.words
        out[h.identity.rank] = (steps, phases, pgs, words[wire.H_STEP], words[wire.H_COLL_SEQ], words[wire.H_COLL_OP])
    return out


def test_the_explicit_api_gives_the_same_slot_data_with_and_without_watchdog_run(tmp_path):
    results = []
    for prefix in ((), localjob.WATCHDOG_RUN):
        work = tmp_path / ("run" if prefix else "plain")
        work.mkdir()
        job = localjob.TorchrunJob(
            nproc=2,
            run_dir=work / "slots",
            job="same-" + secrets.token_hex(3),
            work_dir=work,
            script_args=["--steps", "12", "--compute-ms", "5", "--ckpt-dir", str(work / "ckpt"), "--ckpt-every", "5"],
            prefix=prefix,
        )
        try:
            job.start()
            assert job.proc is not None
            assert job.wait(120) == 0, job.proc.log()[-3000:]
        finally:
            job.stop()
        assert len(list(wire.list_slot_files(str(work / "slots")))) == 2  # one monitor per rank, not two
        results.append(_slot_data(work / "slots"))
    plain, run = results
    assert sorted(plain) == [0, 1] and plain[0][3] == 12, plain
    assert run == plain


def test_fsdp2_all_gathers_and_reduce_scatters_are_recorded_and_a_rank_missing_one_is_named(tmp_path):
    """FSDP2 (fully_shard) on gloo, 2 ranks, unmodified, under watchdog run: its
    all-gathers and reduce-scatters (torch 2.13: all_gather_single /
    reduce_scatter_single) are collectives with the same sequence on every rank;
    rank 1 stopping between forward and backward is named by collective_hang,
    rank 0 waiting in the reduce-scatter."""
    stack = Stack(
        tmp_path, 2, None, ["--steps", "400", "--step-ms", "30"], env={"FSDP2_HANG": "1@12"}, script=FSDP2_SCRIPT
    )
    try:
        stack.start()
        found = wait_for(
            lambda: [r for r in records(stack.jpath, je.FINDING) if r["kind"] == "collective_hang"],
            timeout_s=120,
            what="collective_hang",
            log=stack.procs[0].log_path,
        )
        slots = {}
        for path in wire.list_slot_files(str(stack.run_dir)):
            snap = wire.read_slot(path)
            slots[snap.header.identity.rank] = snap
    finally:
        stack.stop()
    assert found[0]["ranks"] == [1], (found, stack.logs())
    assert "reduce_scatter" in found[0]["reason"], found[0]["reason"]
    per_rank = {r: [(s.step, s.collectives, s.last_coll_seq) for s in step_splits(snap)] for r, snap in slots.items()}
    steps = [s for s in per_rank[0] if s[0] <= 12]
    assert len(steps) == 12 and all(n == 4 for _, n, _ in steps), per_rank  # 2 all-gathers + 2 reduce-scatters
    assert per_rank[1][: len(steps)] == steps  # the same sequence on both ranks
    h0 = slots[0].header.words
    assert wire.CollOp(h0[wire.H_COLL_OP]) == wire.CollOp.REDUCE_SCATTER and h0[wire.H_COLL_OUTSTANDING] == 1
    print(f"\nfsdp2 hang: {found[0]['reason'][:200]}")


@pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None, reason="lightning not installed (pip install lightning)"
)
def test_a_lightning_script_under_watchdog_run_names_the_rank_that_hangs(tmp_path):
    """PyTorch Lightning (DDP strategy on CPU), unmodified: its optimizer steps,
    DataLoader and DDP buckets are seen with no callback; rank 1 stopping in its
    training_step is named by collective_hang, rank 0 waiting in DDP's all-reduce."""
    stack = Stack(
        tmp_path,
        2,
        None,
        [],
        env={"LIGHTNING_HANG": "1@12", "LIGHTNING_STEPS": "400"},
        script=SCRIPT.with_name("lightning_loop.py"),
    )
    try:
        stack.start()
        found = wait_for(
            lambda: [r for r in records(stack.jpath, je.FINDING) if r["kind"] == "collective_hang"],
            timeout_s=150,
            what="collective_hang",
            log=stack.procs[0].log_path,
        )
        steps = {rank: stack.step_of(rank) for rank in (0, 1)}
    finally:
        stack.stop()
    assert found[0]["ranks"] == [1], (found, stack.logs())
    assert "ddp_all_reduce" in found[0]["reason"], found[0]["reason"]
    assert steps == {0: 12, 1: 12}, steps  # steps counted from Lightning's optimizer.step()
    print(f"\nlightning hang: {found[0]['reason'][:200]}")


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None,
    reason="transformers/accelerate not installed (pip install transformers accelerate)",
)
def test_a_hugging_face_trainer_script_under_watchdog_run_names_the_rank_that_hangs(tmp_path):
    """A transformers Trainer (DDP through accelerate, gloo on CPU), unmodified: rank 1
    stopping in its forward is named by collective_hang, rank 0 waiting in DDP's all-reduce."""
    stack = Stack(
        tmp_path,
        2,
        None,
        [],
        env={"HF_HANG": "1@12", "HF_STEPS": "400"},
        script=SCRIPT.with_name("hf_loop.py"),
    )
    try:
        stack.start()
        found = wait_for(
            lambda: [r for r in records(stack.jpath, je.FINDING) if r["kind"] == "collective_hang"],
            timeout_s=150,
            what="collective_hang",
            log=stack.procs[0].log_path,
        )
        steps = {rank: stack.step_of(rank) for rank in (0, 1)}
    finally:
        stack.stop()
    assert found[0]["ranks"] == [1], (found, stack.logs())
    assert "ddp_all_reduce" in found[0]["reason"], found[0]["reason"]
    assert steps == {0: 12, 1: 12}, steps  # steps from the Trainer's optimizer.step()
    print(f"\nhf hang: {found[0]['reason'][:200]}")


PLAIN = """
import subprocess, sys, torch
from torch.utils.data import DataLoader
opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
for _ in DataLoader(list(range(5)), batch_size=1):
    opt.step()
# a helper python this script starts is not a rank (nor is any child of one)
subprocess.run([sys.executable, "-c", "import torch"], check=True)
print("plain done", flush=True)
"""


def test_plain_python_under_watchdog_run_is_one_rank_and_its_children_are_not(tmp_path):
    run_dir = tmp_path / "slots"
    env = {**os.environ, "WATCHDOG_RUN_DIR": str(run_dir), "WATCHDOG_JOB_NAME": "plain", "OMP_NUM_THREADS": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(var, None)
    out = subprocess.run(
        [*localjob.WATCHDOG_RUN, sys.executable, "-c", PLAIN], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "plain done" in out.stdout, out.stderr[-3000:]
    (path,) = wire.list_slot_files(str(run_dir))  # the helper python made none
    snap = wire.read_slot(path)
    assert (snap.header.identity.rank, snap.header.identity.world_size) == (0, 1)
    assert [(s.step, s.data_waits) for s in step_splits(snap)] == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1)]
    assert "not monitored" not in out.stderr, out.stderr


def test_a_command_that_cannot_run_says_so():
    out = subprocess.run([*localjob.WATCHDOG_RUN, "no-such-command-xyz"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 127 and "cannot run 'no-such-command-xyz'" in out.stderr


def test_a_bad_setting_leaves_the_script_running_unmonitored_with_one_line_why(tmp_path):
    env = {**os.environ, "WATCHDOG_RUN_DIR": str(tmp_path), "WATCHDOG_RING_CAPACITY": "lots"}
    out = subprocess.run(
        [*localjob.WATCHDOG_RUN, sys.executable, "-c", "print('script ran')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout == "script ran\n", out
    (line,) = [ln for ln in out.stderr.splitlines() if "watchdog" in ln]
    assert "not monitored" in line and "WATCHDOG_RING_CAPACITY='lots'" in line, out.stderr
    assert not wire.list_slot_files(str(tmp_path))
