"""Every check, in the order a reader fixes things; each run isolated: a check
that raises is a result saying so, never the end of the doctor."""

from __future__ import annotations

from collections.abc import Sequence

from .check import FIX, Check, Host, Result
from .coordinator import Coordinator
from .flight_recorder import FlightRecorder
from .journal import Journal
from .nvml import Nvml
from .pidns import PidNamespace
from .ports import Ports
from .ptrace import Ptrace
from .pyspy import PySpy
from .run_dir import RunDir
from .token import TokenFile

CHECKS: tuple[Check, ...] = (
    RunDir(),
    TokenFile(),
    Ports(),
    Journal(),
    Ptrace(),
    PySpy(),
    PidNamespace(),
    Nvml(),
    Coordinator(),
    FlightRecorder(),
)


def run(host: Host, checks: Sequence[Check] = CHECKS) -> list[Result]:
    out = []
    for c in checks:
        if not c.roles & host.roles:
            continue
        try:
            out.append(c.check(host))
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
            out.append(Result(c.name, FIX, f"the check itself failed: {type(exc).__name__}: {exc}", "report this bug"))
    return out


def exit_code(results: Sequence[Result]) -> int:
    return 1 if any(r.status == FIX for r in results) else 0
