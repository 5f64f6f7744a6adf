"""Detectors: one per module, each a pure ``check(now, view) -> list[Finding]``.

A detector's ``name`` is the finding kind it emits. ``DETECTORS`` is the one
explicit list; the daemon builds it with the config and runs each call isolated
(see ``watchdog.coordinator.runner``).
"""

from __future__ import annotations

from typing import Protocol

from ..config import DetectorConfig
from ..finding import Finding
from ..view import ClusterView
from .collective_hang import CollectiveHang
from .dead_rank import DeadRank
from .frozen_rank import FrozenRank
from .loader_starvation import LoaderStarvation
from .never_joined import NeverJoined
from .straggler import Straggler


class Detector(Protocol):
    name: str

    def check(self, now: float, view: ClusterView) -> list[Finding]: ...


DETECTORS = (DeadRank, FrozenRank, CollectiveHang, Straggler, NeverJoined, LoaderStarvation)


def build(cfg: DetectorConfig) -> tuple[Detector, ...]:
    return tuple(cls(cfg) for cls in DETECTORS)
