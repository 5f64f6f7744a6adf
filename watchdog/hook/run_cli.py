"""``watchdog run -- <command>``: run any launcher command with every rank instrumented.

    watchdog run -- torchrun --nproc-per-node=4 train.py
    watchdog run -- srun python train.py
    watchdog run -- python train.py

No edit to the script: the command runs with our bootstrap directory first on
PYTHONPATH, whose sitecustomize instruments each rank process at interpreter
start (``watchdog.hook.auto``). The command replaces this process (exec), so its
pid, signals and exit status are the command's own; the pid is left in
WATCHDOG_RUN_PID so a plain ``python train.py`` knows it is the one rank.
Settings are the hook's usual WATCHDOG_* variables (job name, run dir, ...).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from watchdog.hook import auto

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
    env = command_env(dict(os.environ), os.getpid())
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(args[0], args, env)
    except OSError as exc:
        print(f"watchdog run: cannot run {args[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - exec does not return
