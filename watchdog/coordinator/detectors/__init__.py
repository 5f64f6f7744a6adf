"""Detectors: one per module, each a pure ``check(now, view) -> list[Finding]``.

A detector's ``name`` is the finding kind it emits. ``DETECTORS`` is the one
explicit list; the daemon builds it with the config and runs each call isolated
(see ``watchdog.coordinator.detectors.runner``). A detector whose state is worth a gauge
(the hang age, straggler scores) also has a pure ``gauges(now, view)``; the
runner calls it right after ``check``, under the same isolation, and the service
exports what it returns: nothing outside a detector computes its internals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ...contracts.finding import Finding
from ..analysis.intermittent_stalls import Stalls
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


def build(
    cfg: DetectorConfig,
    stalls: Stalls | None = None,
    hold: Callable[[int], bool] | None = None,
    dead_rank: DeadRank | None = None,
) -> tuple[Detector, ...]:
    """``DETECTORS``, made with what some read beside the view: ``stalls``, the goodput
    ledger's split steps (the ranks that stall now and then); ``hold``, whether a tick of
    a job of so many ranks is another heavy part's (the straggler's rescoring waits);
    ``dead_rank``, one made already (the coordinator asks it what it waits for).
    extra_work reads the straggler's scores. Alone, a detector names no stalls."""
    straggler = Straggler(cfg, stalls=stalls, hold=hold)
    made: dict[type, Detector] = {
        DeadRank: dead_rank if dead_rank is not None else DeadRank(cfg),
        CollectiveHang: CollectiveHang(cfg, stalls=stalls),
        FrozenRank: FrozenRank(cfg, stalls=stalls),
        Straggler: straggler,
        LoaderStarvation: LoaderStarvation(cfg, stalls=stalls),
        PeriodicStall: PeriodicStall(cfg, stalls=stalls),
        ExtraWork: ExtraWork(cfg, straggler=straggler),
    }
    return tuple(made[cls] if cls in made else cls(cfg) for cls in DETECTORS)
