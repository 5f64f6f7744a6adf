"""host_unobserved: a host's agent went silent while nothing says its ranks are gone.

A finding about the monitor, not the job (analysis/silence.py): it names the hosts and no
rank, the policy can only alert on it (an advisory kind), and it resolves when
the agent reports again. Its reason says since when the agent is silent and
what the peers show: ranks provably alive (peers completed collectives that
need them), no evidence either way, or nobody to vouch for them (a one-host job).
One finding for every unobserved host at once: findings are keyed by ranks, and
this one has none.
"""

from __future__ import annotations

from ...contracts.finding import Finding, seconds
from ..analysis.health import unobserved_hosts
from ..config import DetectorConfig
from ..view.cluster import ClusterView


class HostUnobserved:
    name = "host_unobserved"

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        found = unobserved_hosts(view, now, self.cfg)
        if not found:
            return []
        parts = []
        for host, s in sorted(found.items()):
            hv = view.hosts[host]
            parts.append(
                f"host {host}: no report from its agent {hv.agent_id} for {seconds(now - s.since)} "
                f"(expected every {seconds(hv.interval_s)}); {s.why}"
            )
        return [
            Finding(
                kind=self.name,
                ranks=(),
                hosts=tuple(sorted(found)),
                reason="; ".join(parts) + "; the monitor cannot see these hosts, the job is not failing for it",
                onset_mono=min(s.since for s in found.values()),
                detected_mono=now,
                evidence={
                    "hosts": {
                        h: {"agent_id": view.hosts[h].agent_id, "ranks": list(s.ranks), **s.evidence}
                        for h, s in sorted(found.items())
                    }
                },
            )
        ]
