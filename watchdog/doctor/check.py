"""What every check is given (``Host``: the world, injected) and returns (``Result``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

OK, WARN, FIX = "ok", "warn", "fix"  # FIX: something to fix (exit 1); WARN: works, with less
AGENT, TRAINING, COORDINATOR = "agent", "training", "coordinator"
ROLES = (AGENT, TRAINING, COORDINATOR)


@dataclass(frozen=True)
class Host:
    """The host as the daemons would see it. Real defaults; tests point the
    paths at fixture trees and the addresses at their own daemons."""

    roles: frozenset[str] = frozenset({AGENT, TRAINING})
    run_dir: str = ""  # "" = the hook's default rule (rundir.default_run_dir)
    trusted_uids: frozenset[int] = frozenset()
    agent_listen: tuple[str, int] = ("0.0.0.0", 19400)
    coordinator_listen: tuple[str, int] = ("127.0.0.1", 19401)
    coordinator_url: str = ""
    token: str = ""
    token_file: str = ""
    ca_file: str = ""
    py_spy: str = ""
    proc_root: str = "/proc"
    dev_root: str = "/dev"
    journal: str = "watchdog-journal.jsonl"  # the coordinator's --journal
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    euid: int = field(default_factory=os.geteuid)
    timeout_s: float = 5.0


@dataclass(frozen=True)
class Result:
    name: str
    status: str  # OK, WARN or FIX
    detail: str  # what was found, one line
    fix: str = ""  # the one line that fixes it ("" when OK)

    def to_dict(self) -> dict[str, str]:
        return {"check": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


class Check(Protocol):
    name: str
    roles: frozenset[str]  # which hosts it concerns

    def check(self, host: Host) -> Result: ...
