"""Is the rank's process alive? Process identity is (pid, start time): a pid alone
can be reused by an unrelated process after the rank dies.

psutil errors become a few outcomes here, at the boundary: NoSuchProcess = gone,
ZombieProcess = dead (killed, not yet reaped), AccessDenied = alive but unreadable.
Any of them can happen at any call, since the process can die between two calls.

Cost. Reading /proc/<pid>/stat costs 40-60 us of CPU per process when caches are
cold (as they are at 10 Hz), which alone would spend the agent's budget. So on
Linux each process is pinned with a pidfd once its start time matched: one
``poll()`` per agent poll says which pinned processes exited, for all of them at
once, and a pidfd cannot be fooled by pid reuse. /proc is then read only at the
resource interval (status, CPU, RSS). Without pidfds (old kernel, a sandbox, an
injected fake factory) the status is read at every check, and pid reuse is
re-checked at the resource interval.

Namespaces. Identities are what the rank recorded: its pid *in its own pid
namespace*. An agent in another namespace (hostPID DaemonSet, training pods
without hostPID) finds the process under another pid through ``nspid.PidMap``,
once per identity; everything this table does to the process (psutil, pidfd)
uses that pid, ``host_pid`` tells others (signals, py-spy, the launcher).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import select
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from watchdog import procstart
from watchdog.agent.processes import deathcause, steadystart
from watchdog.agent.processes.deathwatch import DeathWatch
from watchdog.agent.processes.nspid import PidMap

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
    gone_ns: int = 0  # agent monotonic time the process exited (precise with pidfds), 0 while alive
    # Seconds its main thread has spent on a CPU and runnable but waiting for one
    # (the run queue) since it started: /proc/<pid>/schedstat's first two fields,
    # read with the CPU time. 0 = not read (no schedstat, a fake process).
    oncpu_s: float = 0.0
    runq_s: float = 0.0

    @property
    def stopped(self) -> bool:
        return self.status in STOPPED


GONE = ProcSample(alive=False, status="gone")
Key = tuple[int, int]

PID_MAX_LIMIT = 4_194_304  # Linux's bound on /proc/sys/kernel/pid_max (and os.pidfd_open takes an int)


def schedstat(pid: int, proc_root: str = "/proc") -> tuple[float, float]:
    """Seconds the process's main thread has run on a CPU, and waited on a run
    queue (runnable, not running), since it started; (0.0, 0.0) where the kernel
    keeps no schedstat or the process is gone. One small read (~10 us): a CPU hog
    sharing the rank's core shows in the second directly, as the time it took."""
    try:
        with open(f"{proc_root}/{pid}/schedstat", "rb") as f:
            on_cpu, waited = f.read().split()[:2]
        return int(on_cpu) / 1e9, int(waited) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


class ProcessTable:
    """One psutil.Process per (pid, start) reused across polls; a process found dead
    stays dead: its identity cannot come back."""

    def __init__(
        self,
        factory: Callable[[int], Any] = psutil.Process,
        tolerance_us: int = START_TOLERANCE_US,
        pidfd: bool | None = None,
        pids: PidMap | None = None,
    ) -> None:
        self._factory = factory
        self._tolerance_us = tolerance_us
        # Recorded pid -> ours. The real /proc goes with real processes; a fake
        # factory without an explicit PidMap numbers processes as they were recorded.
        self._pids = (
            pids if pids is not None else (PidMap(tolerance_us=tolerance_us) if factory is psutil.Process else None)
        )
        self._host: dict[Key, int] = {}
        self._use_pidfd = (factory is psutil.Process and hasattr(os, "pidfd_open")) if pidfd is None else pidfd
        self._procs: dict[Key, Any] = {}
        self._last: dict[Key, ProcSample] = {}
        self._dead: dict[Key, ProcSample] = {}
        self._fds: dict[Key, int] = {}
        self._fd_keys: dict[int, Key] = {}
        self._exited: set[Key] = set()
        self._poller = select.poll()
        # Times exits to the millisecond, so the first death can be told from the
        # victims torchrun tears down right after it (see deathwatch.py).
        self._deathwatch = DeathWatch() if self._use_pidfd else None
        self.errors = 0  # AccessDenied / OSError: the process exists but could not be read

    def refresh(self) -> None:
        """Once per agent poll: which pinned processes exited (one syscall for all)."""
        if self._pids is not None:
            self._pids.invalidate()
        if self._fds:
            for fd, _ in self._poller.poll(0):
                key = self._fd_keys.get(fd)
                if key is not None:
                    self._exited.add(key)

    def _open(self, key: Key, start_us: int, start_ticks: int) -> Any:
        """A process seen for the first time: pinned, and kept where its start is the
        rank's; None where the pid now belongs to another process (psutil's errors
        propagate to ``check``)."""
        host = self._resolve(key, start_ticks)
        self._pin(key, host)  # before the start-time check: then a match proves the pidfd is ours
        proc = self._factory(host)
        # A real process: its start as first read, whatever the clock did since (steadystart).
        real = self._factory is psutil.Process
        started = steadystart.start_us(host) if real else None
        if started is None:
            started = int(proc.create_time() * 1e6)
        if abs(started - start_us) > self._tolerance_us and not (
            real and start_ticks > 0 and procstart.start_ticks(host) == start_ticks
        ):
            return None
        self._procs[key] = proc
        return proc

    def check(self, pid: int, start_us: int, now_ns: int, *, resources: bool, start_ticks: int = 0) -> ProcSample:
        """Aliveness on every call; status, CPU seconds and RSS read from /proc only
        with ``resources`` (about once a second) for pinned processes, and the status
        on every call for unpinned ones. ``start_ticks``: the start in clock ticks the
        rank recorded with ``start_us`` (0: not known); where it is the process's, the
        process is the rank's whatever the wall clock did since (``steadystart``)."""
        key = (pid, start_us)
        prev = self._last.get(key)
        if not 0 < pid <= PID_MAX_LIMIT:  # a corrupt or forged slot: no process has that pid
            return self._bury(key, now_ns, prev, "gone")
        pinned = key in self._fds
        if pinned:  # the common case, first: a pinned process between resource samples
            if key in self._exited:
                return self._bury(key, now_ns, prev, "gone")
            if not resources and prev is not None:
                return prev  # the same object: callers can tell nothing was read
        dead = self._dead.get(key)
        if dead is not None:
            return dead
        try:
            proc = self._procs.get(key)
            if proc is None:
                proc = self._open(key, start_us, start_ticks)
                if proc is None:
                    return self._bury(key, now_ns, prev, "reused")
            elif resources and not pinned and not proc.is_running():  # re-reads the start time
                return self._bury(key, now_ns, prev, "gone")
            with proc.oneshot():
                status = proc.status()
                if status in _NOT_RUNNING:
                    return self._bury(key, now_ns, prev, status)
                if resources:
                    cpu = proc.cpu_times()
                    on_cpu, runq = (
                        schedstat(self._host.get(key, pid)) if self._factory is psutil.Process else (0.0, 0.0)
                    )
                    sample = ProcSample(
                        True, status, cpu.user + cpu.system, proc.memory_info().rss, now_ns, oncpu_s=on_cpu, runq_s=runq
                    )
                elif prev is not None:
                    sample = ProcSample(
                        True,
                        status,
                        prev.cpu_seconds,
                        prev.rss_bytes,
                        prev.sampled_ns,
                        oncpu_s=prev.oncpu_s,
                        runq_s=prev.runq_s,
                    )
                else:
                    sample = ProcSample(True, status)
        except psutil.ZombieProcess:  # subclass of NoSuchProcess: catch first
            return self._bury(key, now_ns, prev, psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return self._bury(key, now_ns, prev, "gone")
        except (psutil.Error, OSError):  # AccessDenied and kin
            # It exists (we could not have been denied otherwise) but we cannot read it.
            self.errors += 1
            sample = (
                dataclasses.replace(prev, alive=True, status="unknown", gone_ns=0)
                if prev
                else ProcSample(True, "unknown")
            )
        self._last[key] = sample
        return sample

    def _resolve(self, key: Key, start_ticks: int = 0) -> int:
        """Our pid for the recorded identity. When nothing matches in any namespace,
        the recorded pid itself: the checks that follow then say gone or reused."""
        host = self._pids.host_pid(*key, start_ticks) if self._pids is not None else None
        host = key[0] if host is None else host
        self._host[key] = host
        return host

    def vouch(self, pid: int, start_us: int, start_ticks: int) -> bool:
        """The rank's own start reading (``start_us`` with ``start_ticks``, from a slot
        whose owner check passed) kept as its process's first (``steadystart.vouch``):
        every later identity check (signals, stacks, the zombie's exit status) then
        reads what the rank recorded, as the coordinator's commands name it."""
        host = self._host.get((pid, start_us))
        if host is None or self._factory is not psutil.Process:
            return False
        return steadystart.vouch(host, start_ticks, start_us)

    def host_pid(self, pid: int, start_us: int) -> int:
        """The pid to signal, dump or inspect for the rank recorded as (pid, start_us):
        the same number unless the rank lives in another pid namespace."""
        return self._host.get((pid, start_us), pid)

    def _pin(self, key: Key, host: int) -> None:
        if not self._use_pidfd or key in self._fds:
            return
        try:
            fd = os.pidfd_open(host)
        except ProcessLookupError:
            raise psutil.NoSuchProcess(host) from None
        except OSError:  # ENOSYS, EPERM in a sandbox...: fall back to reading the status
            self._use_pidfd = False
            return
        self._fds[key], self._fd_keys[fd] = fd, key
        self._poller.register(fd, select.POLLIN)
        if self._deathwatch is not None:
            self._deathwatch.watch(key, fd, probe=functools.partial(deathcause.zombie_status, host, start_us=key[1]))

    def _unpin(self, key: Key) -> None:
        fd = self._fds.pop(key, None)
        if fd is not None:
            del self._fd_keys[fd]
            self._poller.unregister(fd)
            os.close(fd)
        self._exited.discard(key)

    def exit_status(self, pid: int, start_us: int) -> int | None:
        """The raw wait status of the rank recorded as (pid, start_us), if it could
        be read while the process was a zombie: by the deathwatch at its exit, or
        now if its parent has not reaped it yet. None otherwise (then only the
        parent knows)."""
        key = (pid, start_us)
        status = self._deathwatch.info(key) if self._deathwatch is not None else None
        if status is None and self._factory is psutil.Process:
            status = deathcause.zombie_status(self._host.get(key, pid), start_us=start_us)
        return status

    def _bury(self, key: Key, now_ns: int, prev: ProcSample | None, status: str) -> ProcSample:
        # Keep the last CPU/RSS figures: a post-mortem wants the RSS at death.
        exited = self._deathwatch.exit_ns(key) if self._deathwatch is not None else None
        gone_ns = min(exited, now_ns) if exited else now_ns
        sample = ProcSample(
            False,
            status,
            *(prev.cpu_seconds, prev.rss_bytes, prev.sampled_ns) if prev else (0.0, 0, 0),
            gone_ns=gone_ns,
        )
        self._dead[key] = sample
        self._procs.pop(key, None)
        self._last.pop(key, None)
        self._unpin(key)
        if self._pids is not None:
            self._pids.forget(*key)
        return sample

    def forget(self, pid: int, start_us: int) -> None:
        """The slot file is gone: drop what we hold for it."""
        key = (pid, start_us)
        self._unpin(key)
        for table in (self._procs, self._last, self._dead, self._host):
            table.pop(key, None)
        if self._pids is not None:
            self._pids.forget(pid, start_us)
        if self._deathwatch is not None:
            self._deathwatch.forget(key)

    def close(self) -> None:
        for key in list(self._fds):
            self._unpin(key)
        if self._deathwatch is not None:
            self._deathwatch.close()
