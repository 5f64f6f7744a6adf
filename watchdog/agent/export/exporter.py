"""The one prometheus_client collector registered with the agent's registry. It runs
each of the agent's collectors isolated: a collector that raises loses its own
families for that scrape, nothing else, and every collector's success and duration
is exported (node_exporter's ``collector.go`` pattern)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from prometheus_client.core import Metric

from watchdog import logs
from watchdog.agent.export import metrics as m


class Collector(Protocol):
    name: str

    def collect(self) -> Iterable[Metric]: ...


class Exporter:
    def __init__(
        self, collectors: Sequence[Collector], *, log: Any = None, timer: Callable[[], float] = time.perf_counter
    ) -> None:
        names = [c.name for c in collectors]
        if len(set(names)) != len(names):
            raise ValueError(f"collector names must be unique: {names}")
        self._collectors = tuple(collectors)
        self._log = log or logs.get("watchdog.agent.exporter")
        self._timer = timer
        self._failing: set[str] = set()  # log on the change, not on every failing scrape
        self._lock = threading.Lock()

    def collect(self) -> list[Metric]:
        success, duration = m.COLLECTOR_SUCCESS.family(), m.COLLECTOR_DURATION.family()
        out: list[Metric] = []
        for c in self._collectors:
            t0 = self._timer()
            try:
                fams = list(c.collect())
                ok = True
            except Exception as exc:
                fams, ok = [], False
                self._note(c.name, exc)
            else:
                self._note(c.name, None)
            success.add_metric([c.name], float(ok))
            duration.add_metric([c.name], max(0.0, self._timer() - t0))
            out.extend(fams)
        return out + [success, duration]

    def _note(self, name: str, exc: BaseException | None) -> None:
        with self._lock:
            if exc is not None and name not in self._failing:
                self._failing.add(name)
                self._log.error("collector failed", collector=name, error=f"{type(exc).__name__}: {exc}", exc_info=exc)
            elif exc is None and name in self._failing:
                self._failing.discard(name)
                self._log.info("collector recovered", collector=name)
