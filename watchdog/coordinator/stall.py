"""The coordinator's own stalls: after it was not running (SIGSTOP, a paused VM, a
swap storm), hold detection until the agents have been heard from again.

Every age the detectors compare (a host's silence, a rank's progress) is measured
on the coordinator's clock from when a report arrived. While the coordinator
itself is stopped, reports cannot arrive, so on resume every host looks silent for
as long as the stall lasted: its first tick would declare every host lost and
every rank presumed dead. The silence was ours, not theirs.

A stall shows as a gap between ticks much longer than the tick interval. After
one, detectors do not run until every host known before it has sent two reports
since (the first may be one queued in the listen backlog during the stall, sent
before it ended; the second was sent after), or until one host-silence deadline
has passed since the resume: a host that really went away is still named, one
deadline later. Pure: ``tick`` is given the tick's monotonic time and the view.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .config import DetectorConfig
from .view import ClusterView

FRESH_REPORTS = 2  # reports a host must send after a stall before its silence means anything again
MIN_STALL_S = 2.0  # ticks this late are a stall (a loaded machine delays a tick by well under a second)
STALL_TICKS = 4.0  # ... or this many tick intervals, on a coordinator ticking slowly


@dataclass
class Stall:
    at: float  # the first tick after it (monotonic)
    gap_s: float  # time since the tick before it
    seqs: dict[str, tuple[str, int]]  # host -> (agent id, seq) at the resume
    limit_s: float  # hold at most this long: one host-silence deadline


def is_stall(gap_s: float, tick_s: float) -> bool:
    """A gap between two ticks of the daemon's loop this long means the coordinator was not running."""
    return gap_s > max(MIN_STALL_S, STALL_TICKS * tick_s)


@dataclass
class StallGuard:
    cfg: DetectorConfig
    stall: Stall | None = None
    stalls: list[Stall] = field(default_factory=list)  # every stall seen, newest last

    def begin(self, now: float, gap_s: float, view: ClusterView) -> Stall:
        """The daemon's loop saw a gap of ``gap_s`` ending at ``now``: hold detection from here."""
        limit = self.cfg.host_silence_intervals * max((hv.interval_s for hv in view.hosts.values()), default=1.0)
        self.stall = Stall(
            at=now, gap_s=gap_s, limit_s=limit, seqs={h: (hv.agent_id, hv.seq) for h, hv in view.hosts.items()}
        )
        self.stalls.append(self.stall)
        return self.stall

    def holding(self, now: float, view: ClusterView) -> bool:
        """True while detection must wait for the hosts to be heard from again."""
        if self.stall is None:
            return False
        if now - self.stall.at >= self.stall.limit_s or all(
            h in view.hosts and (view.hosts[h].agent_id != agent or view.hosts[h].seq >= seq + FRESH_REPORTS)
            for h, (agent, seq) in self.stall.seqs.items()
        ):
            self.stall = None
            return False
        return True
