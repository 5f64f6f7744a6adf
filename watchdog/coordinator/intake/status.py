"""The status document (``GET /api/v1/status``): pure, built from the view and
the active findings. ``watchdog status`` renders it as a table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from watchdog.report import GpuStep

from ..analysis import health
from ..config import Config
from ..detectors.tracker import Active, Key
from ..view.cluster import ClusterView


def _gpu_split(g: GpuStep) -> dict[str, Any]:
    """The last step the accelerator finished, split on its clock."""
    return {
        "clock": "gpu",
        "step": g.step,
        "step_s": g.step_s,
        "data_s": g.data_s,
        "coll_s": g.coll_s,
        "compute_s": g.compute_s,
        "lag_s": g.lag_s,
    }


def build(view: ClusterView, active: Mapping[Key, Active], now: float, wall: float, cfg: Config) -> dict[str, Any]:
    det = cfg.detectors
    hl = health.classify_all(view, now, det)
    by_rank: dict[int, list[str]] = {}
    findings = []
    for (kind, ranks), a in sorted(active.items()):
        for r in ranks:
            by_rank.setdefault(r, []).append(kind)
        f = a.latest
        findings.append(
            {
                "kind": kind,
                "ranks": list(ranks),
                "hosts": list(f.hosts),
                "reason": f.reason,
                "since_s": round(now - a.first.onset_mono, 3),
                "onset_wall": a.first.onset_wall,
                "detected_wall": a.first.detected_wall,
                "evidence": f.evidence,
            }
        )
    unseen = health.unobserved_hosts(view, now, det)  # their ranks: alive as far as anyone can tell
    rows: list[dict[str, Any]] = []  # one per rank, missing ones included
    for r in range(max([view.world_size, *(x + 1 for x in view.ranks)])):
        rv = view.ranks.get(r)
        if rv is None:
            rows.append({"rank": r, "health": "missing", "findings": by_rank.get(r, [])})
            continue
        s = rv.state
        rows.append(
            {
                "rank": r,
                "host": rv.host,
                "local_rank": s.local_rank,
                "pid": s.pid,
                "health": "unobserved" if rv.host in unseen and hl[r] == health.OK else hl[r],
                "alive": s.alive,
                "status": s.status,
                "pg_state": s.pg_state,
                "step": s.step,
                "phase": s.phase,
                "in_data_wait": s.in_data_wait,
                "step_s": s.last_step_s,
                "data_s": s.last_data_s,
                "coll_s": s.last_coll_s,
                "compute_s": s.last_compute_s,
                "clock": "cpu",  # the four above: the hook's own marks
                **({"gpu": _gpu_split(rv.gpu_last)} if rv.gpu_last is not None else {}),
                "heartbeat_age_s": round(rv.heartbeat_age(now), 3),
                "report_age_s": round(now - rv.received_at, 3),
                "coll": {
                    "group": s.coll.group,
                    "seq": s.coll.seq,
                    "done_seq": s.coll.done_seq,
                    "op": s.coll.op,
                    "outstanding": s.coll.outstanding,
                },
                "cpu_percent": s.cpu_percent,
                "rss_bytes": s.rss_bytes,
                "findings": by_rank.get(r, []),
            }
        )
    lost = health.lost_hosts(view, now, det)
    hosts = [
        {
            "host": h,
            "agent_id": hv.agent_id,
            "seq": hv.seq,
            "report_age_s": round(now - hv.received_at, 3),
            "lost": h in lost,
            "unobserved": h in unseen,
            "ranks": list(hv.ranks),
        }
        for h, hv in sorted(view.hosts.items())
    ]
    return {
        "job": view.job,
        "world_size": health.expected_world(view, now, det),
        "registered": len(view.ranks) - list(hl.values()).count(health.RETIRED),
        "t_wall": wall,
        "hosts": hosts,
        "ranks": rows,
        "findings": findings,
    }
