"""Which process in *our* /proc is the rank that wrote a slot?

A rank records its own pid, as its pid namespace numbers it, and its start time.
An agent in another pid namespace (a DaemonSet with ``hostPID: true`` watching
training pods that are not) sees that process under a different pid. The kernel
lists every pid a process has, outermost first, on the ``NSpid:`` line of
``/proc/<pid>/status``: the last entry is the pid the process itself sees (what
the hook recorded), the first the one in the namespace of the /proc we read.
The start time (field 22 of ``/proc/<pid>/stat``, clock ticks since boot) does
not depend on the namespace, so (last NSpid entry, start time) names the rank's
process exactly, in any namespace, and a reused pid cannot match.

Lookups: first the recorded pid itself (same namespace: one stat read); on a
miss, one scan of /proc builds an index ``last NSpid entry -> our pids``, reused
for every miss in the same agent poll (``invalidate`` once per poll; a slot
listed at the start of a poll belongs to a process that existed before the
scan, so a per-poll index cannot miss it). Results are cached per identity: a
rank's process is looked up once, not every poll.

A candidate's start time is its first reading (``steadystart``), as the process
table reads it: the hook recorded its start with the boot time of that moment, and
a wall-clock step since the agent started moves the boot time in /proc/stat. With
the boot time read once at the agent's start, every rank started after a step was
"no such process" across namespaces (its recorded pid, in ours, is another or none).

Everything reads through an injected /proc root, so tests run on a fixture tree.
"""

from __future__ import annotations

import os

from watchdog.procstart import clock_ticks, read_text
from watchdog.procstart import start_ticks as start_ticks_of

from . import steadystart

Key = tuple[int, int]  # (pid as recorded by the rank, start time in us since the epoch)


def parse_nspid(status: str) -> tuple[int, ...] | None:
    """The NSpid entries of a /proc/<pid>/status text; None without the line (kernel < 4.1)."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            try:
                return tuple(int(x) for x in line.split()[1:])
            except ValueError:
                return None
    return None


class PidMap:
    def __init__(
        self,
        proc_root: str = "/proc",
        *,
        clk_tck: int | None = None,
        tolerance_us: int = 20_000,
    ) -> None:
        self.root = proc_root
        self._clk_tck = clk_tck or clock_ticks()
        self._tol = tolerance_us
        self._cache: dict[Key, int] = {}
        self._index: dict[int, list[int]] | None = None
        self.scans = 0  # full /proc scans so far (for tests and the curious)

    def start_us(self, pid: int) -> int | None:
        """Start time of our ``pid`` in us since the epoch, as psutil's create_time computes
        it at the first reading of that process (``steadystart``)."""
        return steadystart.start_us(pid, self.root, self._clk_tck)

    def _nspid(self, pid: int) -> tuple[int, ...] | None:
        status = read_text(os.path.join(self.root, str(pid), "status"))
        if status is None:
            return None
        return parse_nspid(status) or (pid,)  # no NSpid line: one namespace, the pid is the pid

    def _matches(self, ours: int, pid: int, start_us: int, start_ticks: int) -> bool:
        nspid = self._nspid(ours)
        if not nspid or nspid[-1] != pid:
            return False
        if start_ticks > 0 and start_ticks_of(ours, self.root) == start_ticks:
            return True  # the same start in ticks: the same process, whatever the clock did
        start = self.start_us(ours)
        return start is not None and abs(start - start_us) <= self._tol

    def host_pid(self, pid: int, start_us: int, start_ticks: int = 0) -> int | None:
        """Our pid of the process the rank recorded as (``pid``, ``start_us``, and
        ``start_ticks`` where the hook wrote it); None when no such process exists (it
        is gone, or lives where we cannot see)."""
        key = (pid, start_us)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if self._matches(pid, pid, start_us, start_ticks):
            self._cache[key] = pid
            return pid
        if self._index is None:
            self._index = self._scan()
        for ours in self._index.get(pid, ()):
            if ours != pid and self._matches(ours, pid, start_us, start_ticks):
                self._cache[key] = ours
                return ours
        return None

    def _scan(self) -> dict[int, list[int]]:
        self.scans += 1
        index: dict[int, list[int]] = {}
        try:
            names = os.listdir(self.root)
        except OSError:
            return index
        for name in names:
            if not name.isdigit():
                continue
            nspid = self._nspid(int(name))
            if nspid and len(nspid) > 1:  # only processes in a nested pid namespace can be numbered differently
                index.setdefault(nspid[-1], []).append(int(name))
        return index

    def invalidate(self) -> None:
        """Once per agent poll: processes may have started since the last scan."""
        self._index = None

    def forget(self, pid: int, start_us: int) -> None:
        self._cache.pop((pid, start_us), None)
