"""The coordinator's own stalls: after it was not running (SIGSTOP, a paused VM, a
swap storm), hold detection until the agents have been heard from again.

Every age the detectors compare (a host's silence, a rank's progress) is measured
on the coordinator's clock from when a report arrived. While the coordinator
itself is stopped, reports cannot arrive, so on resume every host looks silent for
as long as the stall lasted: its first tick would declare every host lost and
every rank presumed dead. The silence was ours, not theirs.

A stall shows as a gap between ticks much longer than the tick interval. After
one, detectors do not run until every host known before it has sent a report
*after* the resume, or until one host-silence deadline has passed since the
resume: a host that really went away is still named, one deadline later. Reports
queued in the listen backlog during the stall (an agent retries after each
timeout, so there can be several) arrive first and were sent before it ended: a
report counts only if its ``sent_wall``, moved onto the coordinator's clock by
the host's offset measured on its last report before the stall (skew and
latency), is after the resume. Only the daemon's loop, which reads the clock,
decides that a gap was a stall (``is_stall``); the guard itself is pure, given
times and the view.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .config import DetectorConfig
from .view.cluster import ClusterView

FRESH_SLACK_S = 0.25  # a report sent this close before the resume is as good as fresh
MIN_STALL_S = 2.0  # ticks this late are a stall (a loaded machine delays a tick by well under a second)
STALL_TICKS = 4.0  # ... or this many tick intervals, on a coordinator ticking slowly


@dataclass
class Stall:
    at: float  # the first tick after it (monotonic)
    gap_s: float  # time since the tick before it
    seqs: dict[str, tuple[str, int]]  # host -> (agent id, seq) at the resume
    limit_s: float  # hold at most this long: one host-silence deadline
    wall: float = 0.0  # the resume on the coordinator's wall clock
    offsets: dict[str, float] = field(default_factory=dict)  # host -> coordinator wall minus the agent's sent_wall


def is_stall(gap_s: float, tick_s: float) -> bool:
    """A gap between two ticks of the daemon's loop this long means the coordinator was not running."""
    return gap_s > max(MIN_STALL_S, STALL_TICKS * tick_s)


@dataclass
class StallGuard:
    cfg: DetectorConfig
    stall: Stall | None = None
    stalls: list[Stall] = field(default_factory=list)  # every stall seen, newest last

    def begin(self, now: float, gap_s: float, view: ClusterView, wall: float) -> Stall:
        """The daemon's loop saw a gap of ``gap_s`` ending at ``now`` (``wall``): hold detection from here."""
        limit = self.cfg.host_silence_intervals * max((hv.interval_s for hv in view.hosts.values()), default=1.0)
        # Where each host's sent_wall lands on our clock: its last report's arrival minus its sending.
        offsets = {h: (wall - (now - hv.received_at)) - hv.sent_wall for h, hv in view.hosts.items()}
        self.stall = Stall(
            at=now,
            gap_s=gap_s,
            limit_s=limit,
            wall=wall,
            offsets=offsets,
            seqs={h: (hv.agent_id, hv.seq) for h, hv in view.hosts.items()},
        )
        self.stalls.append(self.stall)
        return self.stall

    def holding(self, now: float, view: ClusterView) -> bool:
        """True while detection must wait for the hosts to be heard from again."""
        if self.stall is None:
            return False
        if now - self.stall.at >= self.stall.limit_s or all(self._heard(h, view) for h in self.stall.seqs):
            self.stall = None
            return False
        return True

    def _heard(self, host: str, view: ClusterView) -> bool:
        """``host`` sent a report after the resume (a new agent's first report counts: nothing of it is stale)."""
        assert self.stall is not None
        hv = view.hosts.get(host)
        if hv is None:
            return False
        agent, seq = self.stall.seqs[host]
        if hv.agent_id != agent:
            return True
        return hv.seq > seq and hv.sent_wall + self.stall.offsets[host] >= self.stall.wall - FRESH_SLACK_S
