"""Chrome trace event JSON (opens in ui.perfetto.dev and chrome://tracing, like a
torch profiler trace): one process per host, one thread (track) per rank, plus a
"coordinator" process whose instants are the findings, actions and events.

Only complete ("X") events with integer-microsecond ts/dur and instants ("i")
are written, so nothing has to be paired; a step's data/compute/collective
children are clamped inside their step so every track nests cleanly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .model import Lane, Section, Span, StepSpan, Timeline

COORDINATOR = "coordinator (journal)"


def render(tl: Timeline) -> dict[str, Any]:
    hosts = sorted({lane.host or "unknown host" for s in tl.sections for lane in s.lanes.values()})
    pids = {h: i + 1 for i, h in enumerate(hosts)}
    coord = len(hosts) + 1
    origin = _origin(tl)
    us = lambda t: round((t - origin) * 1e6)  # noqa: E731 - one conversion, used everywhere below
    ev: list[dict] = []
    for host, pid in list(pids.items()) + [(COORDINATOR, coord)]:
        ev.append(_meta("process_name", pid, 0, {"name": host}))
        ev.append(_meta("process_sort_index", pid, 0, {"sort_index": pid}))
    named: set[tuple[int, int]] = set()
    for sec in tl.sections:
        culprits = set(sec.culprits())
        for lane in sec.lanes.values():
            pid, tid = pids[lane.host or "unknown host"], lane.rank
            if (pid, tid) not in named:
                named.add((pid, tid))
                ev.append(_meta("thread_name", pid, tid, {"name": f"rank {lane.rank}"}))
                ev.append(_meta("thread_sort_index", pid, tid, {"sort_index": lane.rank}))
            ev += _lane(sec, lane, pid, us, lane.rank in culprits)
        ev += _section_events(sec, coord, us)
    ev.append(_meta("thread_name", coord, 0, {"name": "findings, actions, events"}))
    return {
        "traceEvents": ev,
        "displayTimeUnit": "ms",
        "otherData": {
            "source": "watchdog timeline",
            "journal": tl.path,
            "t0_wall": origin,
            "note": "ts are microseconds since t0_wall; each host's lanes on its own wall clock",
        },
    }


def _origin(tl: Timeline) -> float:
    ts = [st.start for s in tl.sections for lane in s.lanes.values() for st in lane.steps[:1]]
    ts += [s.start for s in tl.sections if s.start > 0]
    return min(ts, default=0.0)


def _meta(name: str, pid: int, tid: int, args: dict) -> dict:
    return {"ph": "M", "name": name, "ts": 0, "pid": pid, "tid": tid, "args": args}


def _x(name: str, cat: str, t0: int, t1: int, pid: int, tid: int, args: dict | None = None) -> dict:
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "ts": t0,
        "dur": max(0, t1 - t0),
        "pid": pid,
        "tid": tid,
        "args": args or {},
    }


def _i(name: str, cat: str, ts: int, pid: int, tid: int, scope: str = "t", args: dict | None = None) -> dict:
    return {"ph": "i", "name": name, "cat": cat, "ts": ts, "s": scope, "pid": pid, "tid": tid, "args": args or {}}


def _lane(sec: Section, lane: Lane, pid: int, us: Callable[[float], int], culprit: bool) -> list[dict]:
    out: list[dict] = []
    last_end = None
    for st in lane.steps:
        t0, t1 = us(st.start), us(st.end)
        if last_end is not None and t0 < last_end:
            t0 = last_end  # rounding: consecutive steps must not overlap on one track
        out += _step(st, t0, max(t0, t1), pid, lane.rank, sec.index)
        last_end = max(t0, t1)
    step = next((sp for sp in lane.spans if sp.kind == "step"), None)
    if step is not None:
        p0 = max(us(step.start), last_end or us(step.start))
        p1 = max(p0, us(step.end))
        out.append(_x(step.label, "step", p0, p1, pid, lane.rank, {"open": True, "section": sec.index + 1}))
        cursor = p0
        for sp in sorted((s for s in lane.spans if s.kind in ("data", "code", "collective")), key=lambda s: s.start):
            c0 = min(max(us(sp.start), cursor), p1)
            c1 = min(max(c0, us(sp.end)), p1)
            out.append(_x(sp.label, _cat(sp), c0, c1, pid, lane.rank, {"open": sp.open, "seq": sp.seq or None}))
            cursor = c1
        last_end = p1
    for sp in lane.spans:
        if sp.kind == "gone":
            g0 = max(us(sp.start), last_end or us(sp.start))
            out.append(
                _x(
                    "process gone",
                    "gone",
                    g0,
                    max(g0, us(sp.end)),
                    pid,
                    lane.rank,
                    {"note": "died between the last sign of life and when its agent saw it gone"},
                )
            )
        elif sp.kind not in ("step", "data", "code", "collective", "silent"):
            out.append(_i(f"phase {sp.label}", "phase", us(sp.start), pid, lane.rank))
    for m in lane.marks:
        out.append(_i(m.label, m.kind, us(m.t), pid, lane.rank))
    if lane.now is not None:
        args = {"where": lane.now.where, "source": lane.now.source, "culprit": culprit}
        out.append(
            _i(
                f"rank {lane.rank} state" + (" (culprit)" if culprit else ""),
                "state",
                us(lane.now.t) if lane.now.t else us(sec.end),
                pid,
                lane.rank,
                args=args,
            )
        )
    return out


def _cat(sp: Span) -> str:
    return {"data": "data", "code": "compute", "collective": "collective"}[sp.kind]


def _step(st: StepSpan, t0: int, t1: int, pid: int, tid: int, section: int) -> list[dict]:
    seqs = list(st.seqs)
    args = {
        "step": st.step,
        "phase": st.phase,
        "data_ms": round(st.data_s * 1e3, 3),
        "coll_ms": round(st.coll_s * 1e3, 3),
        "compute_ms": round(st.compute_s * 1e3, 3),
        "collectives": st.n_coll,
        "seq_first": seqs[0] if seqs else None,
        "seq_last": seqs[-1] if seqs else None,
        "section": section + 1,
        "order": "durations exact; order inside the step assumed data, compute, collective",
    }
    out = [_x(f"step {st.step}", "step", t0, t1, pid, tid, args)]
    cursor = t0
    for name, cat, dur in (
        ("data wait", "data", st.data_s),
        ("compute", "compute", st.compute_s),
        (
            f"collective #{seqs[0]}" + (f"-#{seqs[-1]}" if len(seqs) > 1 else "") if seqs else "collective",
            "collective",
            st.coll_s,
        ),
    ):
        if dur <= 0:
            continue
        c1 = min(t1, cursor + round(dur * 1e6))
        out.append(_x(name, cat, cursor, c1, pid, tid))
        cursor = c1
    return out


def _section_events(sec: Section, coord: int, us: Callable[[float], int]) -> list[dict]:
    out = [
        _i(
            f"section {sec.index + 1}: {sec.opened_by}",
            "section",
            us(sec.start),
            coord,
            0,
            "g",
            {"job": sec.job, "world_size": sec.world_size},
        )
    ]
    root = sec.root
    for e in sec.events:
        scope = "g" if e.kind in ("finding", "action", "command", "rank_restarted", "host_lost") else "p"
        args: dict[str, Any] = {"ranks": list(e.ranks)}
        if e.kind == "finding":
            args.update(
                reason=e.detail.get("reason", ""), root_cause=e.detail is root, onset_wall=e.detail.get("onset_wall")
            )
            onset = e.detail.get("onset_wall")
            if isinstance(onset, (int, float)) and onset > 0:
                out.append(_i(f"onset: {e.label}", "onset", us(onset), coord, 0, "p", {"ranks": list(e.ranks)}))
        out.append(_i(e.label, e.kind, us(e.t), coord, 0, scope, args))
    return out
