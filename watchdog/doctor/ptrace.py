"""May the agent read the ranks' stacks? py-spy attaches with ptrace: Yama's
``ptrace_scope`` and ``CAP_SYS_PTRACE`` decide."""

from __future__ import annotations

from .check import AGENT, FIX, OK, WARN, Host, Result

CAP_SYS_PTRACE = 19
UNIT_FIX = "AmbientCapabilities=CAP_SYS_PTRACE in the agent's unit (Kubernetes: capabilities.add [SYS_PTRACE])"


def cap_eff(proc_root: str) -> int | None:
    """This process's effective capabilities from <proc>/self/status, None if unreadable."""
    try:
        with open(f"{proc_root}/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return None
    return None


def yama_scope(proc_root: str) -> int | None:
    """kernel.yama.ptrace_scope, None without Yama (classic rules: same user or the capability)."""
    try:
        with open(f"{proc_root}/sys/kernel/yama/ptrace_scope", encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


class Ptrace:
    name = "ptrace"
    roles = frozenset({AGENT})

    def check(self, host: Host) -> Result:
        caps = cap_eff(host.proc_root)
        has_cap = caps is not None and bool(caps >> CAP_SYS_PTRACE & 1)
        scope = yama_scope(host.proc_root)
        where = "no Yama" if scope is None else f"kernel.yama.ptrace_scope={scope}"
        if scope == 3:
            return Result(
                self.name,
                FIX,
                f"{where}: ptrace is disabled for everyone until reboot; stacks cannot be taken",
                "set kernel.yama.ptrace_scope=1 at boot (sysctl.d) and reboot",
            )
        if has_cap:
            return Result(self.name, OK, f"{where}, CAP_SYS_PTRACE held: stacks of any rank can be taken")
        if scope == 2:
            return Result(self.name, FIX, f"{where} and no CAP_SYS_PTRACE: stacks cannot be taken", UNIT_FIX)
        if scope == 1:
            return Result(
                self.name,
                FIX,
                f"{where} (descendants only) and no CAP_SYS_PTRACE: the agent is not the ranks' parent, "
                "stacks cannot be taken",
                UNIT_FIX + ", or sysctl kernel.yama.ptrace_scope=0",
            )
        return Result(
            self.name,
            WARN,
            f"{where}, no CAP_SYS_PTRACE: stacks only of ranks run by this same user",
            UNIT_FIX,
        )
