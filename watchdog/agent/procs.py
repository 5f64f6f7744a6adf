"""Is the rank's process alive? Process identity is (pid, start time): a pid alone
can be reused by an unrelated process after the rank dies.

psutil errors become a few outcomes here, at the boundary: NoSuchProcess = gone,
ZombieProcess = dead (killed, not yet reaped), AccessDenied = alive but unreadable.
Any of them can happen at any call, since the process can die between two calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import psutil

# psutil's create_time() is derived from /proc/<pid>/stat's start time in clock
# ticks (10 ms) plus the boot time; two reads of one process agree far closer
# than this, a reused pid almost never lands inside it.
START_TOLERANCE_US = 20_000
STOPPED = frozenset({psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP})
_NOT_RUNNING = frozenset({psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD})


@dataclass(frozen=True)
class ProcSample:
    alive: bool
    status: str  # a psutil status ("running", "sleeping", "stopped", "zombie", ...) or gone/reused/unknown
    cpu_seconds: float = 0.0  # user + system, of the process itself
    rss_bytes: int = 0
    sampled_ns: int = 0  # agent monotonic time of the cpu/rss sample (0 = never)

    @property
    def stopped(self) -> bool:
        return self.status in STOPPED


GONE = ProcSample(alive=False, status="gone")


class ProcessTable:
    """One psutil.Process per (pid, start) reused across polls (psutil caches what
    it can on it); a process found dead stays dead: its identity cannot come back."""

    def __init__(self, factory: Callable[[int], Any] = psutil.Process, tolerance_us: int = START_TOLERANCE_US):
        self._factory = factory
        self._tolerance_us = tolerance_us
        self._procs: dict[tuple[int, int], Any] = {}
        self._last: dict[tuple[int, int], ProcSample] = {}
        self._dead: dict[tuple[int, int], ProcSample] = {}
        self.errors = 0  # AccessDenied / OSError: the process exists but could not be read

    def check(self, pid: int, start_us: int, now_ns: int, *, resources: bool) -> ProcSample:
        """Aliveness every call; CPU seconds and RSS only when ``resources`` (they cost
        two more /proc reads and change slowly)."""
        key = (pid, start_us)
        dead = self._dead.get(key)
        if dead is not None:
            return dead
        prev = self._last.get(key)
        try:
            proc = self._procs.get(key)
            if proc is None:
                proc = self._factory(pid)
                if abs(proc.create_time() * 1e6 - start_us) > self._tolerance_us:
                    return self._bury(key, prev, "reused")
                self._procs[key] = proc
            elif not proc.is_running():  # re-reads the start time: catches pid reuse
                return self._bury(key, prev, "gone")
            with proc.oneshot():
                status = proc.status()
                if status in _NOT_RUNNING:
                    return self._bury(key, prev, status)
                if resources:
                    cpu = proc.cpu_times()
                    sample = ProcSample(True, status, cpu.user + cpu.system, proc.memory_info().rss, now_ns)
                elif prev is not None:
                    sample = ProcSample(True, status, prev.cpu_seconds, prev.rss_bytes, prev.sampled_ns)
                else:
                    sample = ProcSample(True, status)
        except psutil.ZombieProcess:  # subclass of NoSuchProcess: catch first
            return self._bury(key, prev, psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return self._bury(key, prev, "gone")
        except (psutil.Error, OSError):  # AccessDenied and kin
            # It exists (we could not have been denied otherwise) but we cannot read it.
            self.errors += 1
            sample = ProcSample(True, "unknown", *(prev.cpu_seconds, prev.rss_bytes, prev.sampled_ns) if prev else ())
        self._last[key] = sample
        return sample

    def _bury(self, key: tuple[int, int], prev: ProcSample | None, status: str) -> ProcSample:
        # Keep the last CPU/RSS figures: a post-mortem wants the RSS at death.
        sample = ProcSample(False, status, *(prev.cpu_seconds, prev.rss_bytes, prev.sampled_ns) if prev else ())
        self._dead[key] = sample
        self._procs.pop(key, None)
        self._last.pop(key, None)
        return sample

    def forget(self, pid: int, start_us: int) -> None:
        """The slot file is gone: drop what we hold for it."""
        for table in (self._procs, self._last, self._dead):
            table.pop((pid, start_us), None)
