"""Faults injected into a running rank from outside, as an operator or a bad host would.

The script under test is not touched: ``kill`` (SIGKILL), ``stop`` (SIGSTOP) and
``NoisyNeighbour`` (busy processes pinned to the core the rank is pinned to, every
thread of it included). Each returns the wall time of the injection, the zero of
a detection latency. Used by ``benchmarks/corpus.py`` and the corpus test; usable
against any job (``python -m watchdog.dev.inject hog PID``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

HOG_CODE = "while True:\n    pass\n"


def kill(pid: int) -> float:
    os.kill(pid, signal.SIGKILL)
    return time.time()


def stop(pid: int) -> float:
    os.kill(pid, signal.SIGSTOP)
    return time.time()


def threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def pin(pid: int, cpu: int) -> None:
    """Pin every thread of ``pid`` (the process itself, gloo's and the loader's threads) to ``cpu``."""
    for tid in threads(pid) or [pid]:
        try:
            os.sched_setaffinity(tid, {cpu})
        except OSError:  # a thread that ended meanwhile
            continue


@dataclass
class NoisyNeighbour:
    """``count`` busy-looping processes pinned to one core. ``start(victim, others)``
    pins the victim rank to that core and the other ranks to the remaining ones
    (so only the victim shares its core), then starts the hogs."""

    cpu: int
    count: int = 1
    procs: list[subprocess.Popen] = field(default_factory=list)

    def start(self, victim: int, others: Sequence[int] = ()) -> float:
        spare = sorted(os.sched_getaffinity(0) - {self.cpu}) or [self.cpu]
        for i, pid in enumerate(others):
            pin(pid, spare[i % len(spare)])
        pin(victim, self.cpu)
        cpu = self.cpu
        for _ in range(self.count):
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", HOG_CODE],
                    preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    # With autogroup on (a desktop and many server kernels) a core is shared
                    # between sessions, not processes: hogs sharing the caller's session would
                    # take one share however many. One session each: N hogs take N shares of
                    # the core against the rank's one, as N neighbours would.
                    start_new_session=True,
                )
            )
        return time.time()

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(5)
        self.procs.clear()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m watchdog.dev.inject", description=__doc__.splitlines()[0])
    p.add_argument("fault", choices=("kill", "stop", "hog"))
    p.add_argument("pid", type=int)
    p.add_argument("--cpu", type=int, default=None, help="hog: the core (default: the last one this may use)")
    p.add_argument("--count", type=int, default=1, help="hog: busy processes on that core")
    p.add_argument("--seconds", type=float, default=60.0, help="hog: how long")
    args = p.parse_args(argv)
    if args.fault == "kill":
        kill(args.pid)
    elif args.fault == "stop":
        stop(args.pid)
    else:
        hog = NoisyNeighbour(args.cpu if args.cpu is not None else max(os.sched_getaffinity(0)), args.count)
        try:
            hog.start(args.pid)
            time.sleep(args.seconds)
        finally:
            hog.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
