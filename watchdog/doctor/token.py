"""The job token file: readable here, not by everyone, long enough."""

from __future__ import annotations

import os
import stat

from watchdog import jobtoken

from .check import AGENT, COORDINATOR, FIX, OK, WARN, Host, Result


class TokenFile:
    name = "token_file"
    roles = frozenset({AGENT, COORDINATOR})

    def check(self, host: Host) -> Result:
        if not host.token_file:
            if host.token:
                return Result(
                    self.name,
                    WARN,
                    "token given inline, not from a file",
                    f"put it in a 0600 file and pass --{jobtoken.FILE}",
                )
            return Result(
                self.name,
                WARN,
                "no job token: reports are not authenticated and agents refuse every signal (no restart, no abort)",
                f"create one (`umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \\n' > FILE`) and pass "
                f"--{jobtoken.FILE} to the agents and the coordinator",
            )
        path = host.token_file
        try:
            mode = os.stat(path).st_mode
            with open(path, encoding="utf-8") as fh:
                token = fh.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            return Result(self.name, FIX, f"{path}: {why}", f"make {path} readable by this daemon's user")
        if mode & (stat.S_IROTH | stat.S_IWOTH):
            return Result(
                self.name,
                FIX,
                f"{path} is readable or writable by every user (mode {stat.filemode(mode)})",
                f"chmod 0600 {path} (0640 for a group)",
            )
        if len(token.encode()) < jobtoken.MIN_BYTES:
            return Result(
                self.name,
                FIX,
                f"{path} holds {len(token.encode())} bytes; at least {jobtoken.MIN_BYTES} are needed",
                f"`umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \\n' > {path}`",
            )
        return Result(self.name, OK, f"{path} ({stat.filemode(mode)}), {len(token.encode())} bytes")
