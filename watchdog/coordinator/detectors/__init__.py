"""Detectors: one per module, each a pure ``check(now, view) -> list[Finding]``.

A detector's ``name`` is the finding kind it emits. ``DETECTORS`` is the one
explicit list; the daemon builds it with the config and runs each call isolated
(see ``watchdog.coordinator.detectors.runner``). A detector whose state is worth a gauge
(the hang age, straggler scores) also has a pure ``gauges(now, view)``; the
runner calls it right after ``check``, under the same isolation, and the service
exports what it returns: nothing outside a detector computes its internals.
"""

from __future__ import annotations

from typing import Protocol

from ...contracts.finding import Finding
from ..config import DetectorConfig
from ..metrics import GaugeValues
from ..view.cluster import ClusterView
from .batch_changed import BatchChanged
from .collective_hang import CollectiveHang
from .collective_mismatch import CollectiveMismatch
from .dead_rank import DeadRank
from .extra_work import ExtraWork
from .frozen_rank import FrozenRank
from .host_unobserved import HostUnobserved
from .loader_starvation import LoaderStarvation
from .loss_anomaly import LossAnomaly
from .never_joined import NeverJoined
from .periodic_stall import PeriodicStall
from .straggler import Straggler
from .wedged import Wedged


class Detector(Protocol):
    name: str

    def check(self, now: float, view: ClusterView) -> list[Finding]: ...


class WithGauges(Detector, Protocol):
    def gauges(self, now: float, view: ClusterView) -> GaugeValues:
        """Values for gauges named in ``metrics.DETECTOR_GAUGES``."""
        ...


DETECTORS = (
    CollectiveMismatch,
    DeadRank,
    FrozenRank,
    CollectiveHang,
    Wedged,
    Straggler,
    NeverJoined,
    LoaderStarvation,
    LossAnomaly,
    HostUnobserved,
    BatchChanged,
    PeriodicStall,
    ExtraWork,
)


def build(cfg: DetectorConfig) -> tuple[Detector, ...]:
    return tuple(cls(cfg) for cls in DETECTORS)
