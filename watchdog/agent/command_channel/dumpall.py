"""Run a host's stack dumps in parallel within one stated time bound.

At a hang every rank of the host is dumped at once: one py-spy after the other
would take (ranks x dump time), and a rank whose dump hangs would hold up the
rest. Here at most ``parallel`` dumps run at a time on a short-lived pool, each
is started with the time left until the host's deadline as its own timeout
(py-spy is killed when it runs out), and a dump that has not started by the
deadline is not started at all: the whole command takes about
``deadline_s`` at most, plus the moment it takes to kill a py-spy. What missed
the deadline is said in the result (``late``) and journaled with the evidence.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ALL_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

PARALLEL = 8  # py-spy processes at once per host: a host rarely runs more ranks, and each dump is mostly waiting
HOST_DEADLINE_S = 10.0
KILL_GRACE_S = 2.0  # beyond the deadline: a py-spy being killed, a thread being scheduled


@dataclass(frozen=True)
class Outcome(Generic[T]):
    results: list[T]  # one per job, in the jobs' order
    late: list[int]  # indexes of the jobs that did not run (or finish) before the deadline
    duration_s: float


def run(
    jobs: Sequence[Callable[[float], T]],
    late: Callable[[int, str], T],
    *,
    parallel: int = PARALLEL,
    deadline_s: float = HOST_DEADLINE_S,
    grace_s: float = KILL_GRACE_S,
    mono: Callable[[], float] = time.monotonic,
) -> Outcome[T]:
    """``jobs[i](remaining_s)`` runs one dump with ``remaining_s`` as its timeout;
    ``late(i, why)`` stands in for a job that missed the deadline."""
    t0 = mono()
    end = t0 + deadline_s
    missed: set[int] = set()
    results: list[T | None] = [None] * len(jobs)

    def one(i: int) -> T:
        left = end - mono()
        if left <= 0:
            missed.add(i)
            return late(i, f"not dumped: this host's deadline of {deadline_s:g} s was reached before its turn")
        return jobs[i](left)

    if jobs:
        pool = ThreadPoolExecutor(max_workers=max(1, min(parallel, len(jobs))), thread_name_prefix="watchdog-dump")
        try:
            futures = {pool.submit(one, i): i for i in range(len(jobs))}
            wait(futures, timeout=deadline_s + grace_s, return_when=ALL_COMPLETED)
            for fut, i in futures.items():
                if fut.done() and fut.exception() is None:
                    results[i] = fut.result()
                else:  # still running past deadline + grace, or crashed: never a crash of the command
                    missed.add(i)
                    exc = fut.exception() if fut.done() else None
                    results[i] = late(
                        i,
                        f"dump failed: {type(exc).__name__}: {exc}"
                        if exc
                        else f"not dumped: still running {deadline_s + grace_s:g} s after the start",
                    )
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
    return Outcome(results=[r for r in results if r is not None], late=sorted(missed), duration_s=round(mono() - t0, 4))
