"""The daemons' listen addresses are free to bind."""

from __future__ import annotations

import errno
import socket

from .check import AGENT, COORDINATOR, FIX, OK, Host, Result


def bind_error(addr: tuple[str, int]) -> str:
    """Why ``addr`` cannot be bound now, or ""."""
    host, port = addr
    if port == 0:
        return ""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the daemons bind: TIME_WAIT is no conflict
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "in use by another process (a daemon already running?)"
            return exc.strerror or str(exc)
    return ""


class Ports:
    name = "ports"
    roles = frozenset({AGENT, COORDINATOR})

    def check(self, host: Host) -> Result:
        wanted = []
        if AGENT in host.roles:
            wanted.append(("agent", host.agent_listen))
        if COORDINATOR in host.roles:
            wanted.append(("coordinator", host.coordinator_listen))
        bad = [(who, a, why) for who, a in wanted for why in [bind_error(a)] if why]
        shown = ", ".join(f"{who} {h}:{p}" for who, (h, p) in wanted)
        if not bad:
            return Result(self.name, OK, f"free: {shown}")
        return Result(
            self.name,
            FIX,
            "; ".join(f"{who} {h}:{p} {why}" for who, (h, p), why in bad),
            "stop the process holding it (`ss -ltnp`), or choose another --web.listen-address",
        )
