"""The coordinator answers at the agent's --coordinator.url and accepts its token."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request

from watchdog import jobtoken

from .check import AGENT, FIX, OK, WARN, Host, Result

STATUS_PATH = "/api/v1/status"  # authenticated when the coordinator has a token


class Coordinator:
    name = "coordinator"
    roles = frozenset({AGENT})

    def check(self, host: Host) -> Result:
        url = host.coordinator_url
        if not url:
            return Result(
                self.name,
                WARN,
                "no --coordinator.url: the agent exports metrics but reports to no coordinator",
                "set --coordinator.url (or WATCHDOG_COORDINATOR_URL) to the job's coordinator",
            )
        req = urllib.request.Request(url + STATUS_PATH)
        if host.token:
            req.add_header("Authorization", f"Bearer {host.token}")
        ctx = ssl.create_default_context(cafile=host.ca_file or None) if url.startswith("https:") else None
        try:
            with urllib.request.urlopen(req, timeout=host.timeout_s, context=ctx) as resp:
                resp.read(1)
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                return Result(
                    self.name,
                    FIX,
                    f"{url} refuses this host's token (401)",
                    f"give the agent the coordinator's --{jobtoken.FILE} (the same token on both)",
                )
            return Result(self.name, FIX, f"{url} answered {exc.code}", "check --coordinator.url names a coordinator")
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            return Result(
                self.name,
                FIX,
                f"{url} unreachable: {reason}",
                "start the coordinator, or fix --coordinator.url / the firewall between this host and it",
            )
        return Result(self.name, OK, f"{url} reachable and accepts this host's token")
