"""frozen_rank: the process exists but its heartbeat stopped.

SIGSTOP, a debugger, swap death, or a C extension holding the GIL: the hook's
heartbeat thread cannot run. Judged on the heartbeat age the agent read (a late
report is a host problem, dead_rank's business), and only once the heartbeat
was seen to beat in this incarnation (so a hook without a running heartbeat is
never "frozen"). Ranks frozen while waiting in a collective that an earlier
failed or stuck rank never entered are victims and get no finding. The agent's
OS process state tells "stopped" (SIGSTOP: then a third of the threshold is
enough) and CPU use tells "blocked" (~0%) from "spinning in native code" (~100%).
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import eq

from ..config import DetectorConfig
from ..describe import where, who
from ..finding import Finding, ranks_phrase, seconds
from ..health import FROZEN, OK, analyze, classify_all, victims
from ..view import ClusterView


class FrozenRank:
    name = "frozen_rank"

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        health = classify_all(view, now, self.cfg)
        if FROZEN not in health.values():
            return []
        blame = analyze(view, now, self.cfg, health)
        spared = victims(view, now, self.cfg, health, blame)
        # The waiters still running, once (at 16,384 ranks, a pass per frozen rank was not cheap).
        live_waiters = [w for w in blame.waiters if health[w] == OK] if blame else []
        out = []
        for r in sorted(compress(health.keys(), map(eq, repeat(FROZEN), health.values()))):
            if r in spared:
                continue
            rv = view.ranks[r]
            s = rv.state
            cpu = s.cpu_percent
            if s.status == "failed":  # the hook saw an uncaught exception: shutting down, not hung
                why = s.death.get("summary") or "hook status failed"
                kind = f"exiting after an uncaught exception ({why})"
            elif s.proc_status == "stopped":
                kind = "stopped by a signal (SIGSTOP/SIGTSTP, or a debugger)"
            elif cpu < 5:
                kind = f"not running (CPU ~0%, OS state {s.proc_status or 'unknown'})"
            else:
                kind = f"busy in native code holding the GIL (CPU {cpu:.0f}%)"
            waiting = ""
            if blame and r in blame.culprits and live_waiters:
                waiting = f"; {ranks_phrase(live_waiters)} waiting in {blame.op} #{blame.seq} for {seconds(now - blame.waiting_since)}"
            out.append(
                Finding(
                    kind=self.name,
                    ranks=(r,),
                    hosts=(rv.host,),
                    onset_mono=rv.last_heartbeat(),
                    detected_mono=now,
                    reason=f"{who(rv)} is frozen: process alive but heartbeat stale for {seconds(rv.heartbeat_age(now))}, "
                    f"{kind}; last seen {where(rv, now)}{waiting}",
                    evidence={
                        "heartbeat_age_s": round(rv.heartbeat_age(now), 3),
                        "cpu_percent": cpu,
                        "proc_status": s.proc_status,
                        "step": s.step,
                        "phase": s.phase,
                        "pid": s.pid,
                        "victims": sorted(v for v in spared if v != r),
                    },
                    wants_stacks=(r,),
                )
            )
        return out
