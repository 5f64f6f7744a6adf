"""Can the agent see the ranks' processes? Only when it shares their pid
namespace or sits above it (the host's: ``hostPID: true``)."""

from __future__ import annotations

from watchdog.agent.processes.nspid import parse_nspid

from .check import AGENT, FIX, OK, WARN, Host, Result


class PidNamespace:
    name = "pid_namespace"
    roles = frozenset({AGENT})

    def check(self, host: Host) -> Result:
        try:
            with open(f"{host.proc_root}/self/status", encoding="ascii", errors="replace") as fh:
                ours = parse_nspid(fh.read())
        except OSError as exc:
            return Result(self.name, FIX, f"cannot read {host.proc_root}/self/status: {exc.strerror}", "mount /proc")
        if ours is None:
            return Result(self.name, WARN, "kernel without NSpid (< 4.1): ranks in other namespaces are not matched")
        if len(ours) == 1:
            return Result(self.name, OK, "agent in the host's pid namespace: every rank's process is visible")
        return Result(
            self.name,
            WARN,
            f"agent in a nested pid namespace (depth {len(ours) - 1}): it sees only ranks that share it",
            "run the agent with hostPID: true (DaemonSet), or shareProcessNamespace: true beside the training container",
        )
