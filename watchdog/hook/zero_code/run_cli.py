"""``watchdog run -- <command>``: run any launcher command with every rank instrumented.

    watchdog run -- torchrun --nproc-per-node=4 train.py
    watchdog run -- srun python train.py
    watchdog run -- python train.py

No edit to the script: the command runs with our bootstrap directory first on
PYTHONPATH, whose sitecustomize instruments each rank process at interpreter
start (``watchdog.hook.zero_code.auto``). The command replaces this process (exec), so its
pid, signals and exit status are the command's own; the pid is left in
WATCHDOG_RUN_PID so a plain ``python train.py`` knows it is the one rank.
Settings are the hook's usual WATCHDOG_* variables (job name, run dir, ...).

With WATCHDOG_COORDINATOR_URL and WATCHDOG_JOB_NAME set (the agent's and the
hook's variables, so one export in a job script sets all three), ``watchdog run``
stays as the command's parent instead: it waits for it, tells the coordinator its
exit status directly (launcherexit.py: evidence about the host while its agent is
silent), and exits with the same status (killed by a signal: the same signal).
WATCHDOG_HOST_NAME (default: the host name) and the job token (WATCHDOG_JOB_TOKEN_FILE
or WATCHDOG_JOB_TOKEN) are the agent's. SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 are
passed on to the command; SIGINT and SIGQUIT are ignored while it runs (a
terminal's ^C reaches the command itself, as with ``system()``).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from watchdog import flags, jobtoken, launcherexit
from watchdog.hook.zero_code import auto

BOOTSTRAP_DIR = str(Path(__file__).resolve().parent / "bootstrap")
USAGE = "usage: watchdog run [--] <command> [args...]   (e.g. watchdog run -- torchrun --nproc-per-node=4 train.py)"


def command_env(env: dict[str, str], pid: int) -> dict[str, str]:
    """The environment the command runs in."""
    out = dict(env)
    old = out.get("PYTHONPATH", "")
    parts = [p for p in old.split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    out["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *parts])
    out[auto.ROOT_PID_ENV] = str(pid)
    out.pop(auto.RANK_PID_ENV, None)  # `watchdog run` started from inside a rank starts a new job
    return out


COORDINATOR_URL_ENV = flags.env_of("coordinator.url")
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
IGNORED = (signal.SIGINT, signal.SIGQUIT)


def exit_target(env: dict[str, str]) -> tuple[str, str, str, str] | None:
    """(coordinator URL, token, job, host) to tell the launcher's exit to, or None
    (exec as plain ``watchdog run``). A token file that cannot be read: FlagError."""
    url, job = env.get(COORDINATOR_URL_ENV, "").strip(), env.get(flags.env_of(flags.JOB_NAME), "").strip()
    if not url or not job:
        return None
    host = env.get(flags.env_of(flags.HOST_NAME), "").strip() or socket.gethostname()
    token = jobtoken.read(
        {
            flags.dest_of(jobtoken.FILE): env.get(flags.env_of(jobtoken.FILE), ""),
            flags.dest_of(jobtoken.INLINE): env.get(jobtoken.INLINE_ENV, ""),
        }
    )
    return url, token, job, host


def supervise(
    args: list[str],
    target: tuple[str, str, str, str],
    send: Callable[[str, str, launcherexit.Exit], None] = launcherexit.send,
) -> int:
    """Run ``args`` as a child, tell the coordinator how it ended, end the same way."""
    url, token, job, host = target
    child = [0]

    def forward(sig: int, _frame: object) -> None:
        if child[0]:
            os.kill(child[0], sig)

    # Before the fork, so none is missed once the child runs (exec resets caught signals
    # to their default); the ignored ones after it (exec keeps an ignored signal ignored).
    for sig in FORWARDED:
        signal.signal(sig, forward)
    pid = os.fork()
    if pid == 0:  # the child: the command, in this environment with its own pid
        try:
            os.execvpe(args[0], args, command_env(dict(os.environ), os.getpid()))
        except OSError as exc:
            print(f"watchdog run: cannot run {args[0]!r}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        os._exit(127)
    child[0] = pid
    for sig in IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    _, wstatus = os.waitpid(pid, 0)  # retried by Python across the forwarded signals (PEP 475)
    status = os.waitstatus_to_exitcode(wstatus)
    try:
        send(url, token, launcherexit.Exit(job=job, host=host, pid=pid, status=status))
    except (OSError, ValueError) as exc:  # the job's status matters more than the coordinator hearing it
        print(f"watchdog run: could not tell the coordinator at {url} the exit status: {exc}", file=sys.stderr)
    if status < 0:  # killed by a signal: end the same way, so whoever waits for us sees it
        sys.stdout.flush()
        if -status not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught: already default
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    elif args and args[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{__doc__}")
        return 0
    if not args:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        target = exit_target(dict(os.environ))
    except flags.FlagError as exc:
        print(f"watchdog run: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    if target is not None:
        return supervise(args, target)
    env = command_env(dict(os.environ), os.getpid())
    try:
        os.execvpe(args[0], args, env)
    except OSError as exc:
        print(f"watchdog run: cannot run {args[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - exec does not return
