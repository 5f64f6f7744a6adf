"""Fixtures shared by several test modules."""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TypedDict

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Bytecode caches are written. Where the environment sets PYTHONDONTWRITEBYTECODE (this machine's
# does), each xdist worker rewrote the asserts of every test module anew (collection: 11.2 s of CPU
# against 4.2 s from the cache), and each of the suite's hundreds of ranks, agents and coordinators
# compiled the package from source. Set here, before the workers and the real processes start.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


# -- made once per test session, also across pytest-xdist's workers --------------------------------------
# A real job behind several tests runs once: the first worker that needs it makes it under an exclusive
# lock on a file named by its key; a worker needing it meanwhile waits on that lock, then reads the pickled
# product (or the failure, raised again for every reader without a rerun).


def _shared_dir(tmp_path_factory) -> Path:
    """This session's directory that every xdist worker sees (each worker's basetemp sits in it)."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "kept"
    shared.mkdir(exist_ok=True)
    return shared


def _kept(tmp_path_factory, name: str, make):
    """``get(*key)``: ``make(work_dir, *key)`` made once per session for that key (``work_dir`` an empty
    directory of its own) and kept; every caller, in any worker, gets the same product or failure."""
    shared = _shared_dir(tmp_path_factory)
    local: dict[tuple, object] = {}

    def get(*key):
        if key not in local:
            tag = re.sub(r"[^\w.@-]", "_", "-".join([name, *map(str, key)]))
            with open(shared / f"{tag}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                kept = shared / f"{tag}.pickle"
                if kept.exists():
                    local[key] = pickle.loads(kept.read_bytes())
                else:
                    work = shared / tag
                    work.mkdir()
                    try:
                        got = make(work, *key)
                    except Exception as exc:  # noqa: BLE001 - kept to fail the next reader the same way, without a rerun
                        got = exc
                    try:
                        data = pickle.dumps(got)
                    except Exception:  # noqa: BLE001 - an exception that does not pickle: its text does
                        data = pickle.dumps(RuntimeError(f"{name}{key} failed: {got!r}"))
                    kept.write_bytes(data)
                    local[key] = got
        got = local[key]
        if isinstance(got, Exception):
            raise got
        return got

    return get


def _make_wheel(out: Path) -> Path:
    """Built from a copy of the files git knows (edits included), not in place:
    setuptools reuses ./build/lib, where a module deleted since an earlier build
    lingers and would ship in the wheel."""
    src = out / "src"
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, listed):
        path = ROOT / rel
        if path.is_symlink() or path.is_file():  # a file deleted but not yet staged is still listed
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / rel, follow_symlinks=False)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out / "wheel"), str(src)],
        check=True,
        timeout=300,
    )
    (whl,) = (out / "wheel").glob("rank_watchdog-*.whl")
    return whl


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """Our wheel, built once per session from this checkout's files: what users install."""
    return _kept(tmp_path_factory, "wheel", _make_wheel)()


# -- one real run per fault scenario, shared ------------------------------------------------------------
# Several test files assert on the same injected fault (the finding and its latency, the evidence, the
# timeline of the journal). Each assertion stays its own test; the job behind them runs once per session.
# The settings are the strictest any of them needs: 400 steps (never the end of the job before the fault
# is found), 5 s after the first finding (every rank's stack in the evidence, and time for a false finding
# to show up).
class _SharedRun(TypedDict):
    steps: int
    timeout_s: float
    linger_s: float


SHARED_RUN: _SharedRun = {"steps": 400, "timeout_s": 150, "linger_s": 5}


@pytest.fixture(scope="session")
def fault_run(tmp_path_factory):
    """``fault_run("hang:2@30")``: the ScenarioResult of ``watchdog demo --fault=hang:2@30`` (4 ranks,
    SHARED_RUN), run on first use and kept for the session; a run that failed fails every test reading it."""
    from watchdog.dev import scenario

    return _kept(tmp_path_factory, "fault", lambda work, fault: scenario.run([fault], work_dir=str(work), **SHARED_RUN))


# -- the healthy run, shared ---------------------------------------------------------------------------
# test_e2e_faults.py (no finding, a compute-bound verdict, goodput adding up) and test_e2e_actions.py (no
# action under a policy that would restart on anything) assert on the same healthy job: jittery steps of
# 100 ms and three checkpoint pauses of 8 s, under that policy. One run for both.


def _make_healthy(tmp: Path):
    from watchdog.contracts.finding import ACTIONABLE_KINDS
    from watchdog.dev import scenario

    policy = tmp / "policy.toml"
    actions = "".join(f'{k} = "restart"\n' for k in ACTIONABLE_KINDS)
    policy.write_text(f"[actions]\n{actions}[limits]\nmin_finding_age_seconds = 0\ncooldown_seconds = 0\n")
    # 100 ms of compute a step: at the example's 50 ms, a slow CI run's load stretched gloo's
    # all-reduce to 31-33% of the step and the verdict rightly said communication-bound.
    # 3 ranks: a straggler or a hang is named against two peers; a fourth adds start-up and a worker, not proof.
    return scenario.run(
        [],
        ranks=3,
        steps=200,
        timeout_s=240,
        work_dir=str(tmp),
        policy=str(policy),
        script_args=[
            *("--compute-ms", "100", "--jitter", "0.3"),
            *("--ckpt-dir", str(tmp / "ckpt"), "--ckpt-every", "60", "--ckpt-pause-s", "8"),
        ],
    )


@pytest.fixture(scope="session")
def healthy_run(tmp_path_factory):
    """The ScenarioResult of a fault-free 200-step run under a restart-on-every-finding policy."""
    return _kept(tmp_path_factory, "healthy", _make_healthy)()


def _make_reference(tmp: Path, steps: int, ranks: int) -> Path:
    from watchdog.dev import scenario

    # linger: it runs to the end whatever it finds; only its parameters matter
    res = scenario.run(
        [],
        ranks=ranks,
        steps=steps,
        compute_ms=0.0,
        linger_s=1000,
        timeout_s=240,
        work_dir=str(tmp),
        script_args=["--final-params", str(tmp / "final.pt")],
    )
    assert res.summary["job_exit_code"] == 0, res.output[-2000:]
    return tmp / "final.pt"


@pytest.fixture(scope="session")
def reference_params(tmp_path_factory):
    """``reference_params(steps, ranks)``: the path of the final parameters of a fault-free run of the
    example (its default seed) of that many steps on that many ranks. The simulated compute is a sleep
    that changes no number, so the reference runs without it; run on first use and kept for the session."""
    return _kept(tmp_path_factory, "reference", _make_reference)


# -- a restart, shared ------------------------------------------------------------------------------------
# test_e2e_actions.py (the restarted job finishes bit-exact, its journal tells finding -> action -> restart
# -> resumed) and test_timeline_real.py (the post-mortem of a restarted job) read the same restart.
RESTART_STEPS = 60
RESTART_RANKS = 3  # the culprit (rank 1 or 2) and peers on both sides of it


def _make_restart(work: Path, fault: str):
    from watchdog.dev import scenario

    return scenario.run(
        [fault],
        ranks=RESTART_RANKS,
        steps=RESTART_STEPS,
        timeout_s=240,
        work_dir=str(work),
        action="restart",
        script_args=["--final-params", str(work / "final.pt")],
    )


@pytest.fixture(scope="session")
def restart_run(tmp_path_factory):
    """``restart_run("hang:2@30")``: the ScenarioResult of ``watchdog demo --action restart`` with that
    fault (RESTART_RANKS, RESTART_STEPS, a checkpoint every 10 steps), its final parameters in
    ``res.work_dir.parent / "final.pt"``; run on first use and kept for the session."""
    return _kept(tmp_path_factory, "restart", _make_restart)


@pytest.fixture(scope="session")
def restart_reference(reference_params) -> Path:
    """The final parameters of a fault-free run as long as restart_run's."""
    return reference_params(RESTART_STEPS, RESTART_RANKS)


# -- nothing left running ----------------------------------------------------------------------------
# Every process a test starts inherits this variable (subprocess copies os.environ; so do torchrun and its
# workers), with a value unique to this session: at the end, whatever still carries it was left behind by
# this session. Processes of other sessions (other checkouts, other engineers) carry another value or none,
# so they are never touched. A child started with an environment built from scratch escapes the check.
SESSION_MARK = "WATCHDOG_TEST_SESSION"
_SESSION_VALUE = f"{os.getpid()}-{uuid.uuid4().hex}"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's default (``-n`` alone: ``--dist load``), except that a module whose tests
    share one job runs on one worker, in order (shared_job_order)."""
    if config.getvalue("dist") != "load":
        return None  # a --dist the user chose
    from shared_job_order import SharedJobScheduling

    return SharedJobScheduling(config, log)


def pytest_configure(config) -> None:
    os.environ[SESSION_MARK] = _SESSION_VALUE


def _marked_pids() -> list[int]:
    needle = f"{SESSION_MARK}={_SESSION_VALUE}".encode() + b"\0"
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = b"\0" + fh.read()
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # gone, or not ours to read
            continue
        if b"\0" + needle in env and stat[stat.rfind(b")") + 2 :][:1] != b"Z":
            out.append(int(name))
    return out


def _describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().replace(b"\0", b" ").decode(errors="replace")
        return f"{pid}: {argv[:160]}"
    except OSError:
        return f"{pid}: (gone)"


def _end_leftovers() -> list[str]:
    """The processes this session (this xdist worker) left behind, described, then ended (SIGCONT first: a
    stopped process would not act on anything else, and SIGKILL works on it but a stopped parent would not
    reap it)."""
    deadline = time.monotonic() + 10.0  # a daemon still handling its SIGTERM is not a leak yet
    while (left := _marked_pids()) and time.monotonic() < deadline:
        time.sleep(0.2)
    lines = [_describe(pid) for pid in left]
    for pid in left:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
    return lines


_LEAKED = pytest.StashKey[list[str]]()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist's controller: a worker's leftovers (it checked its own tests' processes) fail the run here."""
    node.config.stash.setdefault(_LEAKED, []).extend(getattr(node, "workeroutput", {}).get("leaked", []))


def pytest_sessionfinish(session, exitstatus) -> None:
    """Fail the run if a test left a process behind, and end them. Under xdist each worker checks its own
    (the controller runs no test; its workers carry its mark) and hands the list to the controller."""
    config = session.config
    if config.pluginmanager.has_plugin("dsession"):
        lines = config.stash.get(_LEAKED, [])
    else:
        lines = _end_leftovers()
        if hasattr(config, "workeroutput"):
            config.workeroutput["leaked"] = lines
            return
    if not lines:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    text = f"{len(lines)} process(es) started by this test session were still running at its end (killed now):"
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", "processes left behind", red=True)
        reporter.write_line(text)
        for line in lines:
            reporter.write_line(f"  {line}")
    else:
        print(text, *lines, sep="\n  ", file=sys.stderr)
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# -- what each test costs ---------------------------------------------------------------------------------
# WATCHDOG_TEST_COST=path appends one JSON line per test: its wall seconds, the CPU seconds of the test
# process (its threads: in-process servers) and of every process this session started while it ran
# (torchrun and its ranks, agents, coordinators, Prometheus), and the load average at its end. Those carry
# SESSION_MARK, so a thread samples their /proc/PID/stat CPU times every SAMPLE_S and keeps each one's last
# figure (what getrusage(RUSAGE_CHILDREN) would miss: ranks orphaned when their launcher is killed are
# reaped by init; a process's last SAMPLE_S is missed instead). Wall time grows with the machine's load; CPU
# seconds hardly do: plan the suite's parallelism with them. A session fixture's cost lands on its first
# reader; .ci/cost sums a log.
COST_LOG = "WATCHDOG_TEST_COST"
SAMPLE_S = 0.25
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


class _TreeCpu(threading.Thread):
    """CPU seconds of this session's processes (not this one), summed over every one seen."""

    def __init__(self) -> None:
        super().__init__(name="test-cost-sampler", daemon=True)
        self._last: dict[int, float] = {}  # pid -> its CPU seconds when last read
        self._others: set[int] = set()  # pids not ours (pid_max is large: no reuse within a session)
        self._lock = threading.Lock()

    def total(self) -> float:
        self.sample()
        with self._lock:
            return sum(self._last.values())

    def run(self) -> None:
        while True:
            self.sample()
            time.sleep(SAMPLE_S)

    def sample(self) -> None:
        needle = b"\0" + f"{SESSION_MARK}={_SESSION_VALUE}".encode() + b"\0"
        for name in os.listdir("/proc"):
            if not name.isdigit() or (pid := int(name)) in self._others:
                continue
            try:
                if pid not in self._last:
                    with open(f"/proc/{name}/environ", "rb") as fh:
                        if pid == os.getpid() or needle not in b"\0" + fh.read():
                            self._others.add(pid)
                            continue
                with open(f"/proc/{name}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
            except OSError:  # gone, or not ours to read
                continue
            with self._lock:
                self._last[pid] = (int(fields[11]) + int(fields[12])) * _TICK_S  # utime + stime


_TREE: list[_TreeCpu] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.environ.get(COST_LOG)
    if not path:
        yield
        return
    if not _TREE:
        _TREE.append(_TreeCpu())
        _TREE[0].start()
    t0 = time.monotonic()
    self0, tree0 = resource.getrusage(resource.RUSAGE_SELF), _TREE[0].total()
    yield
    self1, tree1 = resource.getrusage(resource.RUSAGE_SELF), _TREE[0].total()
    line = {
        "test": item.nodeid,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
        "wall_s": round(time.monotonic() - t0, 3),
        "self_cpu_s": round(self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime, 3),
        "children_cpu_s": round(tree1 - tree0, 3),
        "load1": os.getloadavg()[0],
    }
    with open(path, "a") as fh:  # one short append per line: workers' lines do not interleave
        fh.write(json.dumps(line) + "\n")
