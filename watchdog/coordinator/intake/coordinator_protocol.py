"""What the intake needs of the coordinator it serves, as a Protocol that
``service.Coordinator`` satisfies: the intake depends on this seam, the
service on the intake, never the other way round."""

from __future__ import annotations

from typing import Any, Protocol

from ...report import HostReport
from ..config import Config
from ..metrics import CoordinatorMetrics
from .backpressure import Backpressure


class WrongJob(Exception):
    """A report for another job (409)."""


class ServedCoordinator(Protocol):
    """The coordinator behind the HTTP intake."""

    @property
    def cfg(self) -> Config: ...

    @property
    def metrics(self) -> CoordinatorMetrics: ...

    @property
    def backpressure(self) -> Backpressure: ...

    def accept(self, report: HostReport, now: float) -> dict[str, Any]:
        """Fold a host's report in; the reply (commands for the agent). Raises ``WrongJob``."""
        ...

    def launcher_exited(self, job: str, host: str, pid: int, status: int, now: float) -> None:
        """A host's launcher exited (launcherexit.py). Raises ``WrongJob``."""
        ...

    def status(self, now: float, wall: float) -> dict[str, Any]:
        """The status document (/api/v1/status)."""
        ...
