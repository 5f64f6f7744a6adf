"""Start a monitored job on this machine: agent, coordinator and a torchrun job.

Used by ``watchdog demo`` and by the integration tests, so both exercise the same
real processes: each daemon is a subprocess of ``python -m watchdog.cli`` on
127.0.0.1 with port 0, and its bound address is read back from the address file
it writes. torchrun runs in its own session so a teardown can signal the whole
group (launcher and workers) at once.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from watchdog import procstart
from watchdog.contracts import slot as wire

WATCHDOG_RUN = (sys.executable, "-m", "watchdog.cli", "run", "--")  # TorchrunJob(prefix=...): zero-code mode

# The example job ships inside the package (a checkout's examples/train_ddp.py
# links to it), so ``watchdog demo`` works from an installed wheel. Its directory
# has no __init__.py on purpose: py-spy names a file from the first directory up
# without one, so stacks say ``train_ddp.py:237`` as for a user's own script, not
# ``watchdog/dev/examples/train_ddp.py:237``. (setuptools still ships it: package
# discovery from pyproject.toml includes namespace directories.)
EXAMPLE_SCRIPT = Path(__file__).resolve().parent / "examples" / "train_ddp.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Process:
    """A child process with its log file; stop() is idempotent."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    address: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, grace_s: float = 5.0, group: bool = False, done: Callable[[], bool] | None = None) -> int | None:
        """SIGTERM, and SIGKILL after ``grace_s``, or as soon as ``done()`` says
        what the SIGTERM was for has happened (a launcher's workers gone)."""
        if self.popen.poll() is None:
            self._signal(signal.SIGTERM, group)
            deadline = time.monotonic() + grace_s
            while self.popen.poll() is None and time.monotonic() < deadline and not (done and done()):
                time.sleep(0.05)
            if self.popen.poll() is None:
                self._signal(signal.SIGKILL, group)
                self.popen.wait(grace_s)
        if group:  # workers can outlive a launcher that was SIGKILLed
            self._signal(signal.SIGKILL, True)
        return self.popen.returncode

    def _signal(self, sig: int, group: bool) -> None:
        try:
            if group:
                os.killpg(self.popen.pid, sig)
            else:
                self.popen.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass


def _spawn(
    name: str,
    argv: Sequence[str],
    log_dir: Path,
    env: dict | None = None,
    new_session: bool = False,
    cwd: Path | None = None,
) -> Process:
    log_path = log_dir / f"{name}.log"
    log = open(log_path, "ab")
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    popen = subprocess.Popen(
        list(argv),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=full_env,
        start_new_session=new_session,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )
    log.close()
    return Process(name=name, popen=popen, log_path=log_path)


def _await_address(proc: Process, address_file: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if address_file.exists():
            text = address_file.read_text().strip()
            if text:
                proc.address = text
                return
        if not proc.alive():
            raise RuntimeError(
                f"{proc.name} exited with {proc.popen.returncode} before listening:\n{proc.log()[-3000:]}"
            )
        time.sleep(0.05)
    proc.stop()
    raise RuntimeError(f"{proc.name} did not write {address_file} within {timeout_s} s:\n{proc.log()[-3000:]}")


def start_daemon(
    name: str,
    subcommand: str,
    flags: Sequence[str],
    work_dir: Path,
    env: dict | None = None,
    timeout_s: float = 30.0,
    prefix: Sequence[str] = (),
) -> Process:
    """``prefix``: a command the daemon runs under (e.g. setpriv dropping a capability)."""
    address_file = work_dir / f"{name}.address"
    address_file.unlink(missing_ok=True)
    argv = [
        *prefix,
        sys.executable,
        "-m",
        "watchdog.cli",
        subcommand,
        "--web.listen-address",
        "127.0.0.1:0",
        "--web.address-file",
        str(address_file),
        *flags,
    ]
    proc = _spawn(name, argv, work_dir, env)
    _await_address(proc, address_file, timeout_s)
    return proc


def start_agent(
    work_dir: Path,
    run_dir: Path,
    job: str,
    extra: Sequence[str] = (),
    env: dict | None = None,
    prefix: Sequence[str] = (),
) -> Process:
    return start_daemon(
        "agent", "agent", ["--run-dir", str(run_dir), "--job.name", job, *extra], work_dir, env, prefix=prefix
    )


def start_coordinator(
    work_dir: Path, job: str, world_size: int, journal: Path, extra: Sequence[str] = (), env: dict | None = None
) -> Process:
    flags = ["--job.name", job, "--job.world-size", str(world_size), "--journal", str(journal), *extra]
    return start_daemon("coordinator", "coordinator", flags, work_dir, env)


@dataclass
class TorchrunJob:
    """``torchrun --standalone`` running the example (or another script)."""

    nproc: int
    run_dir: Path
    job: str
    work_dir: Path
    script: Path = EXAMPLE_SCRIPT
    script_args: Sequence[str] = ()
    torchrun_args: Sequence[str] = ()
    env: dict = field(default_factory=dict)
    # the command torchrun runs under, e.g. ``watchdog run --`` (it execs: torchrun keeps the pid)
    prefix: Sequence[str] = ()
    # the job's working directory (default: this process's): scripts that read data/ or write
    # checkpoints relative to where they are run
    cwd: Path | None = None
    proc: Process | None = None

    def start(self) -> TorchrunJob:
        env = dict(os.environ)
        env.update(
            WATCHDOG_RUN_DIR=str(self.run_dir),
            WATCHDOG_JOB_NAME=self.job,
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.env)
        argv = [
            *self.prefix,
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={self.nproc}",
            *self.torchrun_args,
            str(self.script),
            *self.script_args,
        ]
        self.proc = _spawn("torchrun", argv, self.work_dir, env, new_session=True, cwd=self.cwd)
        return self

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        return self.proc.popen.wait(timeout_s)

    def stop(self) -> None:
        """Stop torchrun and every worker, stopped ones included.

        torchrun starts each worker in a session of its own, so signalling the
        launcher's group misses them; a SIGSTOPped worker never handles the SIGTERM
        torchrun forwards, and torchrun SIGKILLed before its own 30 s timeout leaves
        it behind for good. So: SIGCONT the workers, stop the launcher, then SIGKILL
        whichever worker (identified by pid and start time) is still there."""
        if self.proc is None:
            return
        workers = self.worker_identities()
        for pid, start in workers:
            _signal_if_same(pid, start, signal.SIGCONT)
        # Once the workers it forwarded the SIGTERM to are gone, the launcher's own shutdown (its
        # store, its interpreter's teardown: 1-3 s, past the grace on a busy machine) serves nobody.
        self.proc.stop(
            grace_s=3.0, group=True, done=lambda: bool(workers) and not any(_running(p, s) for p, s in workers)
        )
        workers = sorted({*workers, *self.worker_identities()})  # any a restart was starting meanwhile
        for pid, start in workers:
            _signal_if_same(pid, start, signal.SIGCONT)
            _signal_if_same(pid, start, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(_running(pid, start) for pid, start in workers):
            time.sleep(0.05)

    def worker_identities(self) -> list[tuple[int, int]]:
        """(pid, start time in us) of the launcher's descendants and of every rank a
        slot of this job names: a worker whose launcher was SIGKILLed has been
        reparented, but its slot still names it."""
        found: dict[int, int] = {}
        if self.proc is not None:
            for pid in _descendants(self.proc.popen.pid):
                start = procstart.start_us(pid)
                if start is not None:
                    found[pid] = start
        for path in wire.list_slot_files(str(self.run_dir)):
            try:
                ident = wire.read_slot(path).header.identity
            except (wire.SlotError, OSError):
                continue
            if ident.job == self.job and procstart.start_us(ident.pid) == ident.proc_start_us:
                found[ident.pid] = ident.proc_start_us
        return sorted(found.items())

    def rank_pids(self) -> dict[int, int]:
        """rank -> pid of the newest live-or-dead slot per rank of this job."""
        newest: dict[int, tuple[int, int]] = {}
        for path in wire.list_slot_files(str(self.run_dir)):
            try:
                header = wire.read_slot(path).header
            except (wire.SlotError, OSError):
                continue
            ident = header.identity
            if ident.job != self.job:
                continue
            if ident.rank not in newest or header.created_wall_ns > newest[ident.rank][0]:
                newest[ident.rank] = (header.created_wall_ns, ident.pid)
        return {rank: pid for rank, (_, pid) in newest.items()}

    def wait_for_ranks(self, timeout_s: float) -> dict[int, int]:
        deadline = time.monotonic() + timeout_s
        pids: dict[int, int] = {}
        while time.monotonic() < deadline:
            pids = self.rank_pids()
            if len(pids) >= self.nproc:
                return pids
            if self.proc is not None and not self.proc.alive():
                break
            time.sleep(0.1)
        log = self.proc.log()[-3000:] if self.proc else ""
        raise RuntimeError(f"only ranks {sorted(pids)} of {self.nproc} registered within {timeout_s} s:\n{log}")


def _descendants(pid: int, proc_root: str = "/proc") -> list[int]:
    """Every live descendant of ``pid``, from /proc (standard library: the demo's
    dependencies stay those of an agent install)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir(proc_root):
        if not name.isdigit():
            continue
        stat = procstart.read_text(f"{proc_root}/{name}/stat")
        if stat is None:
            continue
        try:
            ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        except (IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _running(pid: int, start_us: int) -> bool:
    """The process that started at ``start_us`` still exists and is not a zombie."""
    stat = procstart.read_text(f"/proc/{pid}/stat") or ""
    return bool(stat) and stat[stat.rfind(")") + 2 :][:1] != "Z" and procstart.start_us(pid) == start_us


def _signal_if_same(pid: int, start_us: int, sig: int) -> None:
    """Signal ``pid`` only while it is still the process that started at ``start_us`` (pid reuse)."""
    if procstart.start_us(pid) != start_us:
        return
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def http_get(url: str, timeout_s: float = 5.0, headers: dict | None = None) -> str:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.read().decode("utf-8", "replace")
