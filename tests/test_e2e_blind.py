"""The monitor's blindness is not the job's failure, on real processes.

A job on two hosts simulated on this machine: two torchrun nodes of 2 ranks each
(gloo, a c10d rendezvous on a store of their own), each node with its own agent and
host name (hosta: ranks 0-1, hostb: ranks 2-3), one coordinator under a policy that
restarts on any finding that names a rank. Agents report every 0.5 s: a host is
silent past its limit after 2.5 s.

- Host B's agent stopped for 12 s, then killed and started again 10 s later, then
  its link to the coordinator cut for 10 s (a network namespace: the ranks' own
  traffic is untouched): nothing names a rank, nothing is acted on, the job trains
  through and finishes; each silence is one ``host_unobserved`` naming host B.
- Every rank stopped within a millisecond: one ``wedged`` verdict, no rank blamed.
  Then host B lost for real (its launcher, ranks and agent killed together):
  ``dead_rank`` for ranks 2-3 within the silence limit.
- One node, a rank killed: torchrun (``--max-restarts``) restarts the group by itself,
  and that restart is spent from the coordinator's budget, its steps lost journaled.
- One node, its agent stopped, then its launcher failed: the launcher's exit, told by
  ``watchdog run``, is the evidence that names the ranks.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from waiting import wait_coordinator, wait_for

from watchdog.contracts import slot as wire
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.dev import localjob

pytestmark = pytest.mark.integration

IP = shutil.which("ip")
INTERVAL_S = 0.5
LIMIT_S = 5 * INTERVAL_S  # host_silence_intervals x the report interval
POLICY = (
    '[actions]\ndead_rank = "restart"\nfrozen_rank = "restart"\ncollective_hang = "restart"\n'
    "[limits]\nmin_finding_age_seconds = 3\n"
)
NAMES_RANKS = {"dead_rank", "frozen_rank", "collective_hang", "never_joined", "straggler", "loader_starvation"}


def _ip(*args: str, ns: str = "") -> None:
    argv = [IP or "ip", *(["netns", "exec", ns, IP or "ip"] if ns else []), *args]
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture
def netns():
    """Namespaces c (coordinator, host A's agent) and b (host B's agent) joined by veth;
    the ranks, launchers and store stay in this one: cutting b's link cuts only the agent."""
    if os.geteuid() != 0 or IP is None:
        pytest.skip("needs root and iproute2 (ip) to create network namespaces")
    tag = secrets.token_hex(3)
    ns_c, ns_b = f"wdb-c-{tag}", f"wdb-b-{tag}"
    net = int(tag, 16) % 250 + 1
    made = []
    try:
        for ns in (ns_c, ns_b):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("link", "set", "lo", "up", ns=ns)
        _ip("link", "add", "vc", "netns", ns_c, "type", "veth", "peer", "name", "vb", "netns", ns_b)
        _ip("addr", "add", f"10.232.{net}.1/30", "dev", "vc", ns=ns_c)
        _ip("addr", "add", f"10.232.{net}.2/30", "dev", "vb", ns=ns_b)
        _ip("link", "set", "vc", "up", ns=ns_c)
        _ip("link", "set", "vb", "up", ns=ns_b)
    except subprocess.CalledProcessError as exc:
        for ns in made:
            subprocess.run([IP, "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot create network namespaces here: {exc.stderr.decode(errors='replace').strip()}")
    yield ns_c, ns_b, f"10.232.{net}.1"
    for ns in made:
        subprocess.run([IP, "netns", "del", ns], capture_output=True, timeout=30)


class TwoHosts:
    """The coordinator, two agents, a rendezvous store and two torchrun nodes."""

    def __init__(
        self,
        tmp: Path,
        ns_c: str = "",
        ns_b: str = "",
        coord_ip: str = "127.0.0.1",
        max_restarts: int = 0,
        policy: str = POLICY,
        script: tuple[str, ...] = (),
        intervals: dict[str, float] | None = None,
    ) -> None:
        """``script``: the command each node's torchrun runs, under ``watchdog run``
        (default: the example, its hook set up by itself); ``intervals``: report
        intervals by host (default INTERVAL_S)."""
        self.tmp, self.ns = tmp, {"hosta": ns_c, "hostb": ns_b}
        self.script, self.intervals = script, intervals or {}
        self.job = "blind-" + secrets.token_hex(3)
        token = tmp / "token"
        token.write_text(secrets.token_hex(16))
        os.chmod(token, 0o600)
        self.env = {**os.environ, "WATCHDOG_JOB_TOKEN_FILE": str(token)}
        self.jpath = tmp / "journal.jsonl"
        self.max_restarts = max_restarts
        self.stop_file = tmp / "stop"
        self.procs: list[localjob.Process] = []
        self.agents: dict[str, localjob.Process] = {}
        self.nodes: dict[str, localjob.Process] = {}
        (tmp / "policy.toml").write_text(policy)
        self.coord = localjob.start_daemon(
            "coordinator",
            "coordinator",
            [
                *("--job.name", self.job, "--job.world-size", "4", "--journal", str(self.jpath)),
                *("--tick.interval-seconds", "0.25", "--policy.file", str(tmp / "policy.toml")),
                *("--web.listen-address", f"{coord_ip}:0"),
            ],
            tmp,
            self.env,
            prefix=self._in("hosta"),
        )
        self.procs.append(self.coord)
        for host in ("hosta", "hostb"):
            (tmp / host).mkdir()
            self.start_agent(host)
        port = localjob.free_port()
        store = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import time, torch.distributed as d; "
                f"s = d.TCPStore('127.0.0.1', {port}, is_master=True, wait_for_workers=False); time.sleep(3600)",
            ],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        self.procs.append(localjob.Process(name="store", popen=store, log_path=tmp / "store.log"))
        for host in ("hosta", "hostb"):
            self.nodes[host] = self._node(host, port)

    def _in(self, host: str) -> tuple[str, ...]:
        ns = self.ns[host]
        return (IP or "ip", "netns", "exec", ns) if ns else ()

    def start_agent(self, host: str) -> localjob.Process:
        agent = localjob.start_daemon(
            f"agent-{host}",
            "agent",
            [
                *("--run-dir", str(self.tmp / host), "--job.name", self.job, "--host.name", host),
                *("--coordinator.url", self.coord.url),
                *("--report.interval-seconds", str(self.intervals.get(host, INTERVAL_S))),
            ],
            self.tmp,
            self.env,
            prefix=self._in(host),
        )
        self.agents[host] = agent
        self.procs.append(agent)
        return agent

    def _node(self, host: str, port: int) -> localjob.Process:
        env = {
            **self.env,
            "WATCHDOG_RUN_DIR": str(self.tmp / host),
            "WATCHDOG_JOB_NAME": self.job,
            "WATCHDOG_HOST_NAME": host,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        argv = [
            *(localjob.WATCHDOG_RUN if self.script else ()),
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc_per_node=2",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id={self.job}",
            "--rdzv-conf=is_host=false,join_timeout=120",
            f"--max-restarts={self.max_restarts}",
            *(
                self.script
                or (
                    str(localjob.EXAMPLE_SCRIPT),
                    *("--steps", "5000", "--compute-ms", "30", "--until-file", str(self.stop_file)),
                    *("--ckpt-dir", str(self.tmp / "ckpt"), "--ckpt-every", "10"),
                )
            ),
        ]
        log = open(self.tmp / f"torchrun-{host}.log", "ab")
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, stdin=subprocess.DEVNULL
        )
        log.close()
        node = localjob.Process(name=f"torchrun-{host}", popen=proc, log_path=self.tmp / f"torchrun-{host}.log")
        self.procs.append(node)
        return node

    def records(self, *events: str, since: float = 0.0) -> list[dict]:
        if not self.jpath.exists():
            return []
        return [r for r in journal.read(str(self.jpath)) if r["event"] in events and r["t_wall"] >= since]

    def slots(self, host: str) -> dict[int, wire.SlotHeader]:
        """Each rank's newest incarnation's slot header."""
        out: dict[int, wire.SlotHeader] = {}
        for path in wire.list_slot_files(str(self.tmp / host)):
            try:
                h = wire.read_slot(path).header
            except (wire.SlotError, OSError):
                continue
            r = h.identity.rank
            if h.identity.job == self.job and (r not in out or h.created_wall_ns > out[r].created_wall_ns):
                out[r] = h
        return out

    def step(self) -> int:
        """The fewest steps any rank has completed."""
        steps = [h[wire.H_STEP] for host in ("hosta", "hostb") for h in self.slots(host).values()]
        return min(steps) if len(steps) == 4 else 0

    def training(self, past: int, timeout_s: float = 120.0) -> int:
        return wait_for(lambda: self.step() > past and self.step(), timeout_s, f"every rank past step {past}")

    def pids(self, host: str) -> list[int]:
        return sorted(h.identity.pid for h in self.slots(host).values())

    def close(self) -> None:
        for pid in [*self.pids("hosta"), *self.pids("hostb")]:
            try:
                os.kill(pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass
        for p in reversed(self.procs):
            if p.name.startswith("agent") and p.alive():
                os.kill(p.popen.pid, signal.SIGCONT)
            p.stop(grace_s=3.0, group=p.name.startswith("torchrun"))
        for pid in [*self.pids("hosta"), *self.pids("hostb")]:  # workers a SIGKILLed launcher left behind
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _unobserved(job: TwoHosts, what: str, since: float, timeout_s: float = 60.0) -> None:
    """Host B's silence opens one host_unobserved naming it and no rank, its ranks provably alive."""
    opened = wait_for(
        lambda: job.records(je.FINDING, since=since), timeout_s, f"{what}: host B unobserved", log=job.coord.log_path
    )
    assert [(f["kind"], f["ranks"], f["hosts"]) for f in opened] == [("host_unobserved", [], ["hostb"])], opened
    assert "provably alive" in opened[0]["reason"], opened[0]["reason"]


def _back(job: TwoHosts, since: float) -> None:
    """Host B reports again: its host_unobserved resolves."""
    wait_for(
        lambda: [r for r in job.records(je.RESOLVED, since=since) if r["kind"] == "host_unobserved"],
        30,
        "host_unobserved resolved",
        log=job.coord.log_path,
    )


@pytest.mark.timeout(420)
def test_a_silent_agent_names_no_rank_and_stops_nothing(tmp_path, netns):
    ns_c, ns_b, coord_ip = netns
    job = TwoHosts(tmp_path, ns_c, ns_b, coord_ip)
    try:
        job.training(past=10)
        start = time.time()

        # Each silence outlasts every deadline that could name host B's ranks on a stale view (the
        # silence limit 2.5 s, frozen 3 s, the hang deadline: 5 s at these steps) plus the policy's 3 s wait.
        # 1. Host B's agent stopped for 12 s: its ranks train on with host A's.
        t0 = time.time()
        os.kill(job.agents["hostb"].popen.pid, signal.SIGSTOP)
        _unobserved(job, "agent stopped", t0)
        at = job.step()
        time.sleep(max(0.0, 12.0 - (time.time() - t0)))
        assert job.step() > at + 20  # the job trained on through the agent's silence
        os.kill(job.agents["hostb"].popen.pid, signal.SIGCONT)
        _back(job, t0)

        # 2. Host B's agent killed, started again 10 s later.
        t1 = time.time()
        job.agents["hostb"].popen.kill()
        job.agents["hostb"].popen.wait(10)
        _unobserved(job, "agent killed", t1)
        time.sleep(max(0.0, 10.0 - (time.time() - t1)))
        job.start_agent("hostb")
        _back(job, t1)

        # 3. Only the agent's link to the coordinator cut for 10 s (the ranks' traffic is this namespace's).
        t2 = time.time()
        _ip("link", "set", "vb", "down", ns=ns_b)
        _unobserved(job, "link cut", t2)
        at = job.step()
        time.sleep(max(0.0, 10.0 - (time.time() - t2)))
        assert job.step() > at + 10
        _ip("link", "set", "vb", "up", ns=ns_b)
        _back(job, t2)

        # The job finishes, every rank of its first incarnation.
        job.stop_file.write_text("")
        for node in job.nodes.values():
            assert node.popen.wait(120) == 0, node.log()[-3000:]
        found = job.records(je.FINDING, je.EXPECTED_FINDING, since=start)
        assert {f["kind"] for f in found} == {"host_unobserved"}, [(f["kind"], f["reason"]) for f in found]
        assert all(f["ranks"] == [] and f["hosts"] == ["hostb"] for f in found)
        assert job.records(je.HOST_LOST, *je.ACTION_STEPS, je.RANK_RESTARTED) == []
        signals = [c for c in job.records(je.COMMAND) if c.get("type") in ("signal", "checkpoint")]
        assert signals == []
        assert "done:" in job.nodes["hosta"].log()
    finally:
        job.close()


@pytest.mark.timeout(300)
def test_a_job_wide_stop_blames_nobody_and_a_real_host_loss_is_named(tmp_path):
    job = TwoHosts(tmp_path)
    try:
        job.training(past=10)
        # 1. Every rank stopped within a millisecond: one wedged verdict, no rank named.
        pids = [*job.pids("hosta"), *job.pids("hostb")]
        t0 = time.time()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        wedge = wait_for(
            lambda: job.records(je.FINDING, since=t0), 30, "a verdict on the stopped job", log=job.coord.log_path
        )
        wait_coordinator(job.coord.url, reports=12, ticks=2, log=job.coord.log_path)  # 3 s of reports: nothing else
        found = job.records(je.FINDING, je.EXPECTED_FINDING, since=t0)
        assert [(f["kind"], f["ranks"], f["hosts"]) for f in found] == [("wedged", [], ["hosta", "hostb"])], [
            (f["kind"], f["ranks"], f["reason"]) for f in found
        ]
        assert "froze together" in wedge[0]["reason"]
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: job.records(je.RESOLVED, since=t0), 30, "the wedge resolved", log=job.coord.log_path)
        job.training(past=job.step() + 5)

        at = job.step()

        # 2. Host B lost for real: its launcher, ranks and agent killed together.
        t1 = time.time()
        b_pids = job.pids("hostb")
        os.killpg(job.nodes["hostb"].popen.pid, signal.SIGKILL)
        for pid in b_pids:
            os.kill(pid, signal.SIGKILL)
        job.agents["hostb"].popen.kill()
        lost = wait_for(
            lambda: [f for f in job.records(je.FINDING, since=t1) if f["kind"] == "dead_rank"],
            30,
            "host B named lost",
            log=job.coord.log_path,
        )
        assert [(f["ranks"], f["hosts"]) for f in lost] == [([2, 3], ["hostb"])], lost
        assert "host hostb lost" in lost[0]["reason"]
        named_after_s = lost[0]["detected_wall"] - t1
        # Named once the silence limit passed, as the coordinator measured it: within a tick and
        # a report interval, on evidence (host A's ranks failed inside, or wait in, an all-reduce
        # host B's ranks were not seen entering).
        ev = lost[0]["evidence"]
        assert ev["limit_s"] == pytest.approx(LIMIT_S, abs=0.5) and ev["lost_on"] in ("peer_failed", "peers_waiting"), (
            ev
        )
        assert ev["silent_s"] <= ev["limit_s"] + INTERVAL_S + 0.25 + 0.25, (ev, lost[0]["reason"])
        blamed = [f for f in job.records(je.FINDING, since=t1) if f["kind"] in NAMES_RANKS and f["ranks"] != [2, 3]]
        assert blamed == [], [(f["kind"], f["ranks"], f["reason"]) for f in blamed]
        print(f"\nwedge then host loss: step {at}; hostb named lost {named_after_s:.2f} s after the kill")
    finally:
        job.close()


@pytest.mark.timeout(240)
def test_torchruns_own_restart_spends_the_jobs_restart_budget(tmp_path):
    """torchrun --max-restarts=1 replaces the group after a rank is killed, before the
    coordinator acts (its policy waits 60 s): one restart of the job, counted, and the
    steps it cost (from where the kill stopped the job to the checkpoint the new group
    resumed from) journaled and exported."""
    job = "budget-" + secrets.token_hex(3)
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(16))
    os.chmod(token, 0o600)
    env = {**os.environ, "WATCHDOG_JOB_TOKEN_FILE": str(token)}
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.replace("min_finding_age_seconds = 3", "min_finding_age_seconds = 60"))
    jpath, run_dir = tmp_path / "journal.jsonl", tmp_path / "run"
    run_dir.mkdir()
    procs: list = []
    train = localjob.TorchrunJob(
        nproc=2,
        run_dir=run_dir,
        job=job,
        work_dir=tmp_path,
        script_args=(
            *("--steps", "5000", "--compute-ms", "30", "--until-file", str(tmp_path / "stop")),
            *("--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "10"),
            *("--fault", "kill:1@15"),  # SIGKILLs itself at step 15 (first attempt only): 5 steps past a checkpoint
        ),
        torchrun_args=("--max-restarts=1",),
        env={"WATCHDOG_JOB_TOKEN_FILE": str(token)},
    )

    def records(*events: str) -> list[dict]:
        return [r for r in journal.read(str(jpath)) if r["event"] in events] if jpath.exists() else []

    def counted() -> list[str]:
        return [ln for ln in coord.log().splitlines() if '"restart_budget_spent"' in ln]

    try:
        flags = ["--tick.interval-seconds", "0.25", "--policy.file", str(policy)]
        coord = localjob.start_coordinator(tmp_path, job, 2, jpath, env=env, extra=flags)
        procs.append(coord)
        agent_flags = ["--coordinator.url", coord.url, "--report.interval-seconds", str(INTERVAL_S)]
        procs.append(localjob.start_agent(tmp_path, run_dir, job, agent_flags, env))
        train.start().wait_for_ranks(120)
        wait_for(lambda: len(records(je.RANK_JOINED)) >= 2, 120, "both ranks known", log=coord.log_path)
        wait_for(lambda: len(records(je.RANK_RESTARTED)) >= 2, 120, "the group restarted by torchrun")
        first = wait_for(counted, 30, "the launcher's restart counted", log=coord.log_path)
        assert len(first) == 1 and '"restarts_used": 1' in first[0], first
        assert records(je.ACTION) == []  # the coordinator restarted nothing itself
        wait_for(lambda: records(je.RESUMED), 120, "the restarted group resumed", log=coord.log_path)
        (tmp_path / "stop").write_text("")
        assert train.wait(120) == 0, train.proc.log()[-3000:] if train.proc else ""
        assert len(counted()) == 1  # two ranks back, one restart
        # journaled as the launcher's own restart, once, with no action of the monitor's
        assert [(r["restart"], r["by"]) for r in records(je.LAUNCHER_RESTART)] == [(1, "launcher")]
        # and what it cost: from the step the replaced ranks had reached to the checkpoint resumed from
        (resumed,) = records(je.RESUMED)
        reached = max(r["old_step"] for r in records(je.RANK_RESTARTED))
        assert (resumed["by"], resumed["restart"], resumed["world_size"]) == ("launcher", 1, 2), resumed
        assert (reached, resumed["step"], resumed["steps_lost"]) == (15, 10, 5), resumed  # the checkpoint at 10
        metrics = localjob.http_get(coord.url + "/metrics")
        assert f"watchdog_coordinator_steps_lost_total {float(resumed['steps_lost'])}" in metrics
        # and in goodput: the time down is the restart's, not productive (the redone steps are
        # only those the ledger had split before the kill: timing, tests/test_coord_goodput.py)
        goodput = {
            ln.split('category="')[1].split('"')[0]: float(ln.rsplit(" ", 1)[1])
            for ln in metrics.splitlines()
            if ln.startswith("watchdog_coordinator_goodput_seconds_total{")
        }
        assert goodput["restart"] > 0, goodput
    finally:
        train.stop()
        for p in reversed(procs):
            p.stop()


@pytest.mark.timeout(240)
def test_a_one_host_job_whose_launcher_failed_while_its_agent_was_silent_is_named(tmp_path):
    """One host, its agent stopped: nobody to vouch for its ranks, so cannot see (host_unobserved).
    Then a rank is killed and torchrun (no restarts) exits 1: ``watchdog run`` tells the
    coordinator, and that exit is the evidence: dead_rank names the ranks, with the status."""
    job = "exit-" + secrets.token_hex(3)
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(16))
    os.chmod(token, 0o600)
    env = {**os.environ, "WATCHDOG_JOB_TOKEN_FILE": str(token)}
    jpath, run_dir = tmp_path / "journal.jsonl", tmp_path / "run"
    run_dir.mkdir()
    procs: list = []

    def records(*events: str) -> list[dict]:
        return [r for r in journal.read(str(jpath)) if r["event"] in events] if jpath.exists() else []

    train = None
    agent = None
    try:
        coord = localjob.start_coordinator(tmp_path, job, 2, jpath, env=env, extra=["--tick.interval-seconds", "0.25"])
        procs.append(coord)
        agent_flags = ["--coordinator.url", coord.url, "--report.interval-seconds", str(INTERVAL_S)]
        agent = localjob.start_agent(tmp_path, run_dir, job, agent_flags, env)
        procs.append(agent)
        train = localjob.TorchrunJob(
            nproc=2,
            run_dir=run_dir,
            job=job,
            work_dir=tmp_path,
            script_args=("--steps", "5000", "--compute-ms", "30", "--until-file", str(tmp_path / "stop")),
            env={"WATCHDOG_JOB_TOKEN_FILE": str(token), "WATCHDOG_COORDINATOR_URL": coord.url},
            prefix=(sys.executable, "-m", "watchdog.cli", "run", "--"),
        )
        pids = train.start().wait_for_ranks(120)
        wait_for(lambda: len(records(je.RANK_JOINED)) >= 2, 120, "both ranks known", log=coord.log_path)
        os.kill(agent.popen.pid, signal.SIGSTOP)
        t0 = time.time()
        opened = wait_for(lambda: records(je.FINDING), 60, "the silent host", log=coord.log_path)
        assert [(f["kind"], f["ranks"]) for f in opened] == [("host_unobserved", [])], opened
        assert "cannot see whether they run" in opened[0]["reason"]
        os.kill(pids[1], signal.SIGKILL)
        assert train.wait(60) == 1  # torchrun's status, passed on by watchdog run
        (told,) = wait_for(lambda: records(je.LAUNCHER_EXITED), 30, "the launcher's exit told")
        dead = wait_for(
            lambda: [f for f in records(je.FINDING) if f["kind"] == "dead_rank"], 30, "dead_rank", log=coord.log_path
        )
        assert [f["ranks"] for f in dead] == [[0, 1]], dead
        assert f"its launcher (pid {told['pid']}) exited with status 1" in dead[0]["reason"], dead[0]["reason"]
        assert told["status"] == 1 and dead[0]["evidence"]["launcher_status"] == 1
        blamed = [f for f in records(je.FINDING) if f["kind"] in NAMES_RANKS and f["kind"] != "dead_rank"]
        assert blamed == [], blamed
        print(f"\nlauncher exit while the agent was silent: dead_rank {time.time() - t0:.1f} s after the stop")
    finally:
        if agent is not None and agent.alive():
            os.kill(agent.popen.pid, signal.SIGCONT)
        if train is not None:
            train.stop()
        for p in reversed(procs):
            p.stop()
