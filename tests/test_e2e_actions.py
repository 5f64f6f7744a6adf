"""Actions end to end: real torchrun (3 gloo ranks on CPU; two nodes of 2 for
exclude_host_restart; --max-restarts), the example with checkpoints, a real agent
and coordinator with a policy file, driven through ``watchdog demo --json``.

- restart after a kill and after a hang: the job finishes every step and its
  final parameters are bit-identical to a fault-free run's with the same seed
  (nothing lost, nothing applied twice); the journal reads finding -> action ->
  restart -> resumed from the checkpoint step.
- abort on a hang: every rank's stack in the journal (the culprit's at the hang
  line), every process gone, a non-zero exit, within seconds.
- an exhausted restart budget aborts instead, and says so.
- a healthy jittery run with checkpoint pauses under a policy that would restart
  on anything: no action at all (the conftest's healthy_run, shared with
  test_e2e_faults.py).
Bounds are generous: a busy 2-core machine.
"""

from __future__ import annotations

import os

import psutil
import pytest
import torch

from watchdog.agent.command_channel.stacks import find_py_spy
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.dev import localjob, scenario

pytestmark = pytest.mark.integration


def params(path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"parameter {k} differs from the fault-free run"


def test_healthy_run_under_a_restart_everything_policy_takes_no_action(healthy_run):
    res = healthy_run  # 200 jittery steps, three 8 s checkpoint pauses, a restart-on-anything policy
    assert res.summary["job_exit_code"] == 0, res.output[-2000:]
    assert res.findings == [] and res.actions == [], res.output[-2000:]


def journal_events(res, *names):
    return [
        r
        for r in journal.read(res.summary["journal"])
        if r["event"] in names and (r["event"] != je.STATE or "job_state" in r)
    ]


@pytest.mark.parametrize(
    "fault,kind,resume_step", [("kill:1@20", "dead_rank", 20), ("hang:2@30", "collective_hang", 30)]
)
def test_restart_finishes_bit_exact(fault, kind, resume_step, restart_run, restart_reference):
    ref = params(restart_reference)
    res = restart_run(fault)  # the hang's restart is the one test_timeline_real.py reads too
    assert res.summary["job_exit_code"] == 0, res.output[-3000:]
    story = [
        (r["event"], r.get("action") or r.get("kind"))
        for r in journal_events(res, je.FINDING, je.ACTION, je.RESTART, je.LAUNCHER_RESTART, je.RESUMED)
    ]
    # Detection -> action -> restart -> resumed. Dead-rank findings for the workers
    # the restart stopped (or torchrun tore down) may come in between. A dead rank's
    # group is torn down and restarted by torchrun itself: the launcher's restart.
    assert story[0] == (je.FINDING, kind), story
    assert [e for e in story if e[0] != je.FINDING] == [
        (je.ACTION, "restart"),
        (je.LAUNCHER_RESTART if kind == "dead_rank" else je.RESTART, "restart"),
        (je.RESUMED, "restart"),
    ], story
    resumed = res.events(je.RESUMED)[0]
    assert (resumed["restart"], resumed["step"]) == (1, resume_step), resumed
    # Stopped at the step it resumed from (a checkpoint every 10 steps): nothing to do again.
    assert resumed["steps_lost"] == 0, resumed
    assert res.events(je.ACTION_OUTCOME)[0]["ok"] is True
    assert_same(params(res.work_dir.parent / "final.pt"), ref)
    print(f"\n{fault}: resumed from step {resumed['step']} {resumed['seconds']} s after the action")


def all_gone(res) -> None:
    log = (res.work_dir / "torchrun.log").read_text(errors="replace")
    pids = {
        int(p)
        for p in __import__("re").findall(
            r"pid (\d+)",
            " ".join(f"pid {r['pid']}" for r in journal.read(res.summary["journal"]) if r["event"] == je.RANK_JOINED),
        )
    }
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, (alive, log[-2000:])


@pytest.mark.skipif(find_py_spy() is None, reason="py-spy not installed")
def test_hang_abort_takes_every_stack_then_stops_everything(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[actions]\ncollective_hang = "abort"\n[limits]\nmin_finding_age_seconds = 0\nabort_grace_seconds = 3\n'
    )
    res = scenario.run(
        ["hang:2@30"], ranks=3, steps=400, timeout_s=150, work_dir=str(tmp_path), policy=str(policy), max_restarts=3
    )
    assert res.summary["job_exit_code"] not in (0, None), res.output[-3000:]
    recs = journal.read(res.summary["journal"])
    action = next(r for r in recs if r["event"] == je.ACTION)
    assert action["action"] == "abort" and action["reason"].startswith("collective_hang"), action
    stacks = {
        s["rank"]: s
        for r in recs
        if r["event"] == je.EVIDENCE and r["trigger"].get("action") == action["action_id"]
        for s in r["stacks"]
    }
    assert sorted(stacks) == [0, 1, 2] and all(s["ok"] for s in stacks.values()), stacks
    lines = localjob.EXAMPLE_SCRIPT.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if 'announce("hang"' in ln)
    hang_line = next(i for i in range(start, len(lines)) if "time.sleep(3600)" in lines[i]) + 1
    assert f"main (train_ddp.py:{hang_line})" in stacks[2]["text"], stacks[2]["text"]
    first_signal = next(r for r in recs if r["event"] == je.COMMAND and r.get("type") == "signal")
    assert first_signal["target"]["rank"] == -1  # the launcher first: no elastic restart undoes the abort
    outcome = next(r for r in recs if r["event"] == je.ACTION_OUTCOME)
    assert outcome["ok"] and outcome["t_wall"] - action["t_wall"] < 20.0, (action, outcome)
    assert [r["job_state"] for r in recs if r["event"] == je.STATE and "job_state" in r][-1] == "failed"
    assert res.events(je.RESTART) == []  # torchrun did not restart the group
    all_gone(res)
    print(f"\nabort: action -> every worker gone in {outcome['t_wall'] - action['t_wall']:.2f} s")


def test_exhausted_restart_budget_aborts_with_the_reason(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[actions]\ncollective_hang = "restart"\n[limits]\nmin_finding_age_seconds = 0\n'
        "max_restarts = 0\nabort_grace_seconds = 3\n"
    )
    res = scenario.run(["hang:2@30"], ranks=3, steps=400, timeout_s=150, work_dir=str(tmp_path), policy=str(policy))
    assert res.summary["job_exit_code"] not in (0, None), res.output[-3000:]
    action = res.events(je.ACTION)[0]
    assert action["action"] == "abort" and "restart budget exhausted" in action["reason"], action
    assert res.events(je.ACTION_OUTCOME)[0]["ok"] is True
    all_gone(res)


def test_slow_rank_checkpoint_restart_resumes_from_exactly_the_checkpoint_step_bit_exact(reference_params, tmp_path):
    # 300 steps: the straggler is named after four windows of 20 steps, later on a loaded machine.
    # 3 ranks: the straggler (rank 2) and two peers it is measured against; a fourth adds start-up only.
    steps, ranks = 300, 3
    res = scenario.run(
        ["slow:2:1.3"],
        ranks=ranks,
        steps=steps,
        timeout_s=240,
        work_dir=str(tmp_path / "run"),
        action="checkpoint_restart",
        script_args=["--final-params", str(tmp_path / "final.pt")],
    )
    assert res.summary["job_exit_code"] == 0, res.output[-3000:]
    action = res.events(je.ACTION)[0]
    assert (action["action"], action["kind"], action["ranks"]) == ("checkpoint_restart", "straggler", [2])
    asked = next(a for a in res.events(je.ACTION_PROGRESS) if a.get("phase") == "checkpoint")["step"]
    (done,) = res.events(je.CHECKPOINTED)
    assert done["step"] == asked
    assert res.events(je.CHECKPOINT_FAILED) == []
    resumed = res.events(je.RESUMED)[0]
    assert resumed["step"] == asked, (asked, resumed)
    ckpts = sorted(os.listdir(res.work_dir / "ckpt"))
    assert f"step-{asked:08d}.pt" in ckpts
    assert_same(params(tmp_path / "final.pt"), params(reference_params(steps, ranks)))
    print(f"\ncheckpoint_restart: checkpoint at step {asked}, resumed from it, {resumed['seconds']} s after the action")


# -- exclude_host_restart: two torchrun "nodes" on this machine ------------------------


def where_it_stood(started, jpath, survivor, nodes):
    """A failure message that says how far the job got: seconds since the nodes
    started, the journal's findings, actions and restarts (with their times), and
    each launcher's log tail (survivor's longest)."""
    import time as _time

    kinds = {je.FINDING, je.RESOLVED, *je.ACTION_STEPS, je.RANK_RESTARTED}
    recs = journal.read(str(jpath)) if jpath.exists() else []
    events = [  # t: seconds after the start (the coordinator's monotonic clock is this machine's)
        {
            "t": round(r["t_mono"] - started, 1),
            **{k: r[k] for k in ("event", "kind", "action", "hosts", "rank", "step") if k in r},
        }
        for r in recs
        if r.get("event") in kinds
    ]
    tails = {n.name: n.log()[-(4000 if n is survivor else 1200) :] for n in nodes}
    return (
        f"{_time.monotonic() - started:.0f} s after the start; survivor {survivor.name}; journal {events}; logs {tails}"
    )


def start_node(name, run_dir, job, work, port, ckpt, token_env, fault=()):
    import subprocess
    import sys

    env = {
        **os.environ,
        **token_env,
        "WATCHDOG_RUN_DIR": str(run_dir),
        "WATCHDOG_JOB_NAME": job,
        "WATCHDOG_HOST_NAME": name,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "LOGLEVEL": "INFO",  # torchrun's rendezvous and restarts in its log: what a failure is read from
    }
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1:2",
        "--nproc_per_node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={job}",
        "--max-restarts=3",
        "--rdzv-conf=is_host=false,last_call_timeout=3,join_timeout=120",
        str(localjob.EXAMPLE_SCRIPT),
        "--steps",
        "150",
        "--ckpt-dir",
        str(ckpt),
        "--ckpt-every",
        "10",
        *[f"--fault={f}" for f in fault],
    ]
    log = open(work / f"torchrun-{name}.log", "ab")
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, stdin=subprocess.DEVNULL
    )
    log.close()
    return localjob.Process(name=f"torchrun-{name}", popen=proc, log_path=work / f"torchrun-{name}.log")


# Its own timeout: two launchers, a restart and 150 steps on two busy cores took over 240 s
# once in a slow CI run; the deadline below fails first, with what the journal and logs say.
@pytest.mark.timeout(480)
def test_exclude_host_restart_stops_the_culprit_node_and_the_other_carries_on(tmp_path):
    import secrets
    import subprocess
    import sys
    import time as _time

    job = "exclude-" + secrets.token_hex(3)
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(16))
    env = {**os.environ, "WATCHDOG_JOB_TOKEN_FILE": str(token)}
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[actions]\ncollective_hang = "exclude_host_restart"\n[limits]\nmin_finding_age_seconds = 0\n'
        "abort_grace_seconds = 3\n"
    )
    jpath = tmp_path / "journal.jsonl"
    procs = []
    try:
        coord = localjob.start_coordinator(
            tmp_path, job, 0, jpath, env=env, extra=["--tick.interval-seconds", "0.25", "--policy.file", str(policy)]
        )
        procs.append(coord)
        for name in ("node-a", "node-b"):
            (tmp_path / name).mkdir()
            procs.append(
                localjob.start_daemon(
                    f"agent-{name}",
                    "agent",
                    [
                        "--run-dir",
                        str(tmp_path / name),
                        "--job.name",
                        job,
                        "--host.name",
                        name,
                        "--coordinator.url",
                        coord.url,
                        "--report.interval-seconds",
                        "0.25",
                    ],
                    tmp_path,
                    env,
                )
            )
        port = localjob.free_port()
        # The rendezvous store lives apart from both nodes: a c10d store hosted by the
        # excluded node's launcher would go down with it and take the survivor's
        # rendezvous along (torchrun: "The connection to the C10d store has failed").
        store = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import time, torch.distributed as d; "
                f"s = d.TCPStore('127.0.0.1', {port}, is_master=True, wait_for_workers=False); "
                "time.sleep(3600)",
            ],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        procs.append(localjob.Process(name="store", popen=store, log_path=tmp_path / "store.log"))
        # The hang is injected on global rank 1 wherever it lands; node-a's hook only
        # matters through WATCHDOG_HOST_NAME, so both nodes get the same fault spec.
        nodes = [
            start_node(n, tmp_path / n, job, tmp_path, port, tmp_path / "ckpt", env, ["hang:1@30"])
            for n in ("node-a", "node-b")
        ]
        procs += nodes
        started = _time.monotonic()
        deadline = started + 400
        while _time.monotonic() < deadline and all(n.alive() for n in nodes):
            _time.sleep(0.5)
        survivor = next((n for n in nodes if n.alive()), None)
        assert survivor is not None, [n.log()[-1500:] for n in nodes]
        while _time.monotonic() < deadline and survivor.alive():
            _time.sleep(0.5)
        assert survivor.popen.returncode == 0, where_it_stood(started, jpath, survivor, nodes)
        recs = journal.read(str(jpath))
        action = next(r for r in recs if r["event"] == je.ACTION)
        assert action["action"] == "exclude_host_restart", action
        culprit_host = action["hosts"][0]
        stopped = next(n for n in nodes if n is not survivor)
        assert stopped.name == f"torchrun-{culprit_host}"
        resumed = next(r for r in recs if r["event"] == je.RESUMED)
        assert resumed["world_size"] == 2, resumed
        assert "done: 150 steps" in survivor.log()
        # The old world's ranks 2-3, stopped by the restart inside the collective the new ranks
        # reach again after resuming, are named by nothing once a new rank has registered.
        new_world = next(r["t_mono"] for r in recs if r["event"] == je.RANK_RESTARTED)
        later = [
            r
            for r in recs
            if r["event"] in (je.FINDING, je.EXPECTED_FINDING)
            and r["t_mono"] >= new_world
            and any(x >= resumed["world_size"] for x in r["ranks"])
        ]
        assert later == [], [(r["event"], r["kind"], r["ranks"], r["reason"][:200]) for r in later]
        print(
            f"\nexclude_host_restart: {culprit_host} stopped; world 4 -> {resumed['world_size']}, "
            f"resumed from step {resumed['step']} {resumed['seconds']} s after the action"
        )
    finally:
        for p in reversed(procs):
            p.stop(grace_s=3.0, group=p.name.startswith("torchrun"))
