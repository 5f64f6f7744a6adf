"""A psutil.Process look-alike with scripted failures, and a factory over a set of them."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import SimpleNamespace

import psutil


@dataclass
class FakeProcess:
    """psutil.Process look-alike. ``fail_at``: raise ``exc`` from the n-th method
    call (1-based, counted over every method), e.g. a process that vanishes mid-read."""

    pid: int
    create_time_s: float
    status_: str = psutil.STATUS_SLEEPING
    cpu: tuple[float, float] = (1.0, 0.5)
    rss: int = 50 << 20
    running: bool = True
    fail_at: int | None = None
    exc: Exception | None = None
    calls: int = field(default=0, init=False)

    def _tick(self) -> None:
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise self.exc or psutil.NoSuchProcess(self.pid)

    def create_time(self) -> float:
        self._tick()
        return self.create_time_s

    def is_running(self) -> bool:
        self._tick()
        return self.running

    @contextlib.contextmanager
    def oneshot(self):
        yield

    def status(self) -> str:
        self._tick()
        return self.status_

    def cpu_times(self):
        self._tick()
        return SimpleNamespace(user=self.cpu[0], system=self.cpu[1])

    def memory_info(self):
        self._tick()
        return SimpleNamespace(rss=self.rss)


class FakeProcesses:
    """A ``factory(pid)`` for ProcessTable over a dict of FakeProcess; unknown pid = gone."""

    def __init__(self, *procs: FakeProcess) -> None:
        self.procs = {p.pid: p for p in procs}

    def __call__(self, pid: int) -> FakeProcess:
        if pid not in self.procs:
            raise psutil.NoSuchProcess(pid)
        return self.procs[pid]
