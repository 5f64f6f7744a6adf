"""Run each detector isolated: time it, catch what it raises, report both.

A raising detector yields nothing this tick (its active findings are kept, not
resolved: "could not look" is not "the fault is gone"), is counted, and is
logged once per distinct error, then at most every 10 minutes. Its ``gauges``
(when it has them) run inside the same isolation: if they raise, the outcome
fails as a whole, and the gauges keep their last values.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ... import logs
from ...contracts.finding import Finding
from ..metrics import DETECTOR_GAUGES, GaugeValues
from ..view.cluster import ClusterView
from . import Detector


@dataclass(frozen=True)
class DetectorRun:
    name: str
    ok: bool
    duration_s: float
    findings: tuple[Finding, ...]
    error: str = ""
    gauges: GaugeValues = field(default_factory=dict)  # what its ``gauges(now, view)`` handed out


class Runner:
    def __init__(self, detectors: Sequence[Detector], timer: Callable[[], float] = time.perf_counter) -> None:
        self.detectors = tuple(detectors)
        self._timer = timer
        self._log = logs.get("watchdog.coordinator")
        self._limit = logs.RateLimited(every_s=600.0)

    def run(self, now: float, view: ClusterView) -> list[DetectorRun]:
        out = []
        for det in self.detectors:
            t0 = self._timer()
            try:
                found = tuple(det.check(now, view))
                bad = [f for f in found if f.kind != det.name]
                if bad:
                    raise ValueError(f"detector {det.name} emitted kind {bad[0].kind!r}")
                gauges = getattr(det, "gauges", None)
                values = dict(gauges(now, view)) if gauges is not None else {}
                for name, value in values.items():  # checked here, so exporting them cannot raise outside isolation
                    if name not in DETECTOR_GAUGES:
                        raise ValueError(f"detector {det.name} handed out unknown gauge {name!r}")
                    if isinstance(value, Mapping) != DETECTOR_GAUGES[name]:
                        raise ValueError(
                            f"detector {det.name}: gauge {name!r} needs "
                            + ("{label: value}" if DETECTOR_GAUGES[name] else "a number")
                        )
                out.append(DetectorRun(det.name, True, self._timer() - t0, found, gauges=values))
            except Exception as exc:  # noqa: BLE001 - isolation is the point
                err = f"{type(exc).__name__}: {exc}"
                out.append(DetectorRun(det.name, False, self._timer() - t0, (), err))
                first, suppressed = self._limit.should_log(f"{det.name}:{err}", now)
                if first:
                    self._log.error(
                        "detector_failed", detector=det.name, error=err, suppressed=suppressed, exc_info=True
                    )
        return out
