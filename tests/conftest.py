"""Fixtures shared by several test modules."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TypedDict

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """Our wheel, built once per session from this checkout's files: what users install.

    Built from a copy of the files git knows (edits included), not in place:
    setuptools reuses ./build/lib, where a module deleted since an earlier build
    lingers and would ship in the wheel."""
    src = tmp_path_factory.mktemp("src")
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
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        check=True,
        timeout=300,
    )
    (whl,) = out.glob("rank_watchdog-*.whl")
    return whl


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

    runs: dict[str, object] = {}

    def get(fault: str):
        if fault not in runs:
            work = tmp_path_factory.mktemp("fault-" + fault.split(":")[0])
            try:
                runs[fault] = scenario.run([fault], work_dir=str(work), **SHARED_RUN)
            except Exception as exc:  # noqa: BLE001 - kept to fail the next reader the same way, without a rerun
                runs[fault] = exc
        got = runs[fault]
        if isinstance(got, Exception):
            raise got
        return got

    return get


# -- the healthy run, shared ---------------------------------------------------------------------------
# test_e2e_faults.py (no finding, a compute-bound verdict, goodput adding up) and test_e2e_actions.py (no
# action under a policy that would restart on anything) assert on the same healthy job: jittery steps of
# 100 ms and three checkpoint pauses of 8 s, under that policy. One run for both.


@pytest.fixture(scope="session")
def healthy_run(tmp_path_factory):
    """The ScenarioResult of a fault-free 200-step run under a restart-on-every-finding policy."""
    from watchdog.contracts.finding import ACTIONABLE_KINDS
    from watchdog.dev import scenario

    tmp = tmp_path_factory.mktemp("healthy")
    policy = tmp / "policy.toml"
    actions = "".join(f'{k} = "restart"\n' for k in ACTIONABLE_KINDS)
    policy.write_text(f"[actions]\n{actions}[limits]\nmin_finding_age_seconds = 0\ncooldown_seconds = 0\n")
    # 100 ms of compute a step: at the example's 50 ms, a slow CI run's load stretched gloo's
    # all-reduce to 31-33% of the step and the verdict rightly said communication-bound.
    return scenario.run(
        [],
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
def reference_params(tmp_path_factory):
    """``reference_params(steps, ranks)``: the path of the final parameters of a fault-free run of the
    example (its default seed) of that many steps on that many ranks. The simulated compute is a sleep
    that changes no number, so the reference runs without it; run on first use and kept for the session."""
    from watchdog.dev import scenario

    paths: dict[tuple[int, int], Path] = {}

    def get(steps: int, ranks: int) -> Path:
        if (steps, ranks) not in paths:
            tmp = tmp_path_factory.mktemp(f"reference-{steps}x{ranks}")
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
            paths[steps, ranks] = tmp / "final.pt"
        return paths[steps, ranks]

    return get


# -- a restart, shared ------------------------------------------------------------------------------------
# test_e2e_actions.py (the restarted job finishes bit-exact, its journal tells finding -> action -> restart
# -> resumed) and test_timeline_real.py (the post-mortem of a restarted job) read the same restart.
RESTART_STEPS = 60
RESTART_RANKS = 3  # the culprit (rank 1 or 2) and peers on both sides of it


@pytest.fixture(scope="session")
def restart_run(tmp_path_factory):
    """``restart_run("hang:2@30")``: the ScenarioResult of ``watchdog demo --action restart`` with that
    fault (RESTART_RANKS, RESTART_STEPS, a checkpoint every 10 steps), its final parameters in
    ``res.work_dir.parent / "final.pt"``; run on first use and kept for the session."""
    from watchdog.dev import scenario

    runs: dict[str, object] = {}

    def get(fault: str):
        if fault not in runs:
            work = tmp_path_factory.mktemp("restart-" + fault.split(":")[0])
            try:
                runs[fault] = scenario.run(
                    [fault],
                    ranks=RESTART_RANKS,
                    steps=RESTART_STEPS,
                    timeout_s=240,
                    work_dir=str(work),
                    action="restart",
                    script_args=["--final-params", str(work / "final.pt")],
                )
            except Exception as exc:  # noqa: BLE001 - kept to fail the next reader the same way, without a rerun
                runs[fault] = exc
        got = runs[fault]
        if isinstance(got, Exception):
            raise got
        return got

    return get


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


def pytest_sessionfinish(session, exitstatus) -> None:
    """Fail the run if a test left a process behind, and end them (SIGCONT first: a stopped
    process would not act on anything else, and SIGKILL works on it but a stopped parent
    would not reap it)."""
    deadline = time.monotonic() + 10.0  # a daemon still handling its SIGTERM is not a leak yet
    while (left := _marked_pids()) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not left:
        return
    lines = [_describe(pid) for pid in left]
    for pid in left:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    text = f"{len(left)} process(es) started by this test session were still running at its end (killed now):"
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
