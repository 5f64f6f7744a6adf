"""Inline SVG for the HTML report: per-rank swim lanes and the collective matrix.

Every time-placed element carries its times (``data-t`` or ``data-t0``/``data-t1``)
so the page's script can zoom and pan by recomputing x alone; the positions
written here are the initial view, so the picture is complete without script.
"""

from __future__ import annotations

import math
import time
from html import escape

from .formatting import clock, seconds
from .model import Event, Lane, Section, Span, StepSpan, brief

W = 1200  # viewBox width; the SVG scales to the page width
LABEL_W = 160
PLOT_X0 = LABEL_W
PLOT_W = W - LABEL_W - 16
LANE_H = 40
EV_ROW_H = 14
EV_ROWS = 4
EV_H = EV_ROW_H * EV_ROWS + 6
CHAR_W = 6.4  # width of a character at the label font size, for fitting labels

# Listed under the lanes; as lines they would crowd out the ones that matter.
NOT_DRAWN = ("evidence_request", "action_step", "job_state", "verdict")
EVENT_CLASS = {
    "finding": "ev-finding",
    "resolved": "ev-resolved",
    "action": "ev-action",
    "command": "ev-action",
    "evidence": "ev-evidence",
    "stop": "ev-stop",
    "rank_restarted": "ev-restart",
    "host_lost": "ev-finding",
    "host_back": "ev-resolved",
    "onset": "ev-onset",
}


def window(sec: Section, lanes: list[Lane], steps: int) -> tuple[float, float]:
    """The time range shown first: each rank's last ``steps`` steps up to the
    last thing known, stretched to include the root cause's onset."""
    starts = [_first_start(lane.steps[-steps:]) for lane in lanes if lane.steps]
    ends = [lane.now.t for lane in lanes if lane.now and lane.now.t]
    ends += [sp.end for lane in lanes for sp in lane.spans]
    # The coordinator stopping (seconds later, often by the demo or an operator) is not
    # worth squeezing the steps for; it stays reachable by zooming out.
    # An action's outcome told here may come from the next section: not worth squeezing for either.
    ends += [e.t for e in sec.events if e.t > 0 and e.kind != "stop" and e.t <= sec.end]
    root = sec.root or {}
    onset = root.get("onset_wall") if isinstance(root.get("onset_wall"), (int, float)) else None
    t0 = min(starts + ([onset] if onset else []), default=None)
    if t0 is None:
        t0 = min([e.t for e in sec.events if e.t > 0] or [sec.start]) - 1.0
    t1 = max(ends + [t0 + 1.0])
    pad = (t1 - t0) * 0.02
    return t0 - pad, t1 + pad


def _first_start(steps: list[StepSpan]) -> float:
    """Start of the window's first step, skipping warm-up steps (the first step
    includes model setup and can be 50x longer) that would squeeze the rest."""
    durations = sorted(st.end - st.start for st in steps)
    median = durations[len(durations) // 2]
    i = 0
    while i < len(steps) - 1 and steps[i].end - steps[i].start > 10 * median:
        i += 1
    return steps[i].start if i == 0 else steps[i - 1].end - 2 * median


class Scale:
    def __init__(self, t0: float, t1: float) -> None:
        self.t0, self.t1 = t0, max(t1, t0 + 1e-6)

    def x(self, t: float) -> float:
        return round(PLOT_X0 + (t - self.t0) / (self.t1 - self.t0) * PLOT_W, 2)


def nice_step(span: float, target: int = 8) -> float:
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def title(text: str) -> str:
    return f"<title>{escape(text)}</title>"


def _rect(cls: str, t0: float, t1: float, y: float, h: float, sc: Scale, tip: str, extra: str = "") -> str:
    x0, x1 = sc.x(t0), sc.x(t1)
    return (
        f'<rect class="{cls}" data-t0="{t0:.6f}" data-t1="{t1:.6f}" x="{x0}" y="{y}" '
        f'width="{max(0.5, round(x1 - x0, 2))}" height="{h}"{extra}>{title(tip)}</rect>'
    )


def _in_rect_label(text: str, t0: float, t1: float, y: float, sc: Scale, cls: str = "rl") -> str:
    hidden = "" if (sc.x(t1) - sc.x(t0)) > len(text) * CHAR_W + 6 else ' display="none"'
    return (
        f'<text class="{cls}" data-t0="{t0:.6f}" data-t1="{t1:.6f}" x="{sc.x(t0) + 3}" y="{y}"'
        f"{hidden}>{escape(text)}</text>"
    )


def _step(st: StepSpan, y: float, sc: Scale, rank: int) -> list[str]:
    """Stacked in the typical loop's order: data wait, compute, collective wait.
    Only the durations are recorded; the legend says so."""
    out = []
    t = st.start
    seqs = f"#{st.seqs.start}" + (f"-#{st.seqs.stop - 1}" if len(st.seqs) > 1 else "") if st.n_coll else "none"
    tip = (
        f"rank {rank} step {st.step} ({st.phase}): {seconds(st.end - st.start)} = data {seconds(st.data_s)} + "
        f"compute {seconds(st.compute_s)} + collective {seconds(st.coll_s)} (collectives {seqs}); "
        f"ended {clock(st.end)}"
    )
    for cls, dur in (("data", st.data_s), ("compute", st.compute_s), ("coll", st.coll_s)):
        if dur <= 0:
            continue
        extra = f' data-seq="{st.last_seq}"' if cls == "coll" and st.n_coll else ""
        out.append(_rect(f"seg {cls}", t, min(st.end, t + dur), y, 16, sc, tip, extra))
        t += dur
    out.append(
        f'<line class="stepb" data-t="{st.end:.6f}" x1="{sc.x(st.end)}" x2="{sc.x(st.end)}" '
        f'y1="{y - 2}" y2="{y + 18}"/>'
    )
    return out


_SPAN_CLASS = {"data": "seg data open", "collective": "seg coll open", "code": "seg compute open"}


def _span(sp: Span, y: float, sc: Scale, rank: int) -> list[str]:
    if sp.kind == "step":
        return [_rect("inflight", sp.start, sp.end, y - 2, 20, sc, f"rank {rank}: {sp.label}, since {clock(sp.start)}")]
    if sp.kind in _SPAN_CLASS:
        cls = _SPAN_CLASS[sp.kind] if sp.open else _SPAN_CLASS[sp.kind].replace(" open", "")
        state = f"still in it when read ({seconds(sp.end - sp.start)})" if sp.open else seconds(sp.end - sp.start)
        tip = f"rank {rank}: {sp.label} from {clock(sp.start)}: {state}"
        extra = f' data-seq="{sp.seq}"' if sp.seq else ""
        out = [_rect(cls, sp.start, sp.end, y, 16, sc, tip, extra)]
        if sp.open:
            out.append(_in_rect_label(f"{sp.label} {seconds(sp.end - sp.start)}", sp.start, sp.end, y + 12, sc))
        return out
    if sp.kind == "gone":
        return [
            _rect(
                "gone",
                sp.start,
                sp.end,
                y,
                16,
                sc,
                f"rank {rank}: {sp.label}: last sign of life {clock(sp.start)}, seen gone {clock(sp.end)}",
            ),
            _in_rect_label("✝ gone", sp.start, sp.end, y + 12, sc, "rl gonel"),
        ]
    if sp.kind == "silent":
        return [
            _rect(
                "silent",
                sp.start,
                sp.end,
                y - 7,
                2,
                sc,
                f"rank {rank}: no heartbeat from {clock(sp.start)} "
                f"to {clock(sp.end)} ({seconds(sp.end - sp.start)}): frozen or holding the GIL",
            )
        ]
    # a phase (checkpoint, eval, init...): a band under the lane
    return [
        _rect(
            f"phase ph-{escape(sp.kind)}",
            sp.start,
            sp.end,
            y + 20,
            6,
            sc,
            f"rank {rank} phase {sp.label} {clock(sp.start)}-{clock(sp.end)}",
        ),
        _in_rect_label(sp.label, sp.start, sp.end, y + 33, sc, "rl phl"),
    ]


def _missing(sec: Section, lane: Lane, y: float, sc: Scale) -> list[str]:
    """Draw what the culprit did NOT do: the collective every waiter is inside."""
    waits = [
        (other.now.coll_seq, sp.start, other.rank)
        for other in sec.lanes.values()
        if other.rank != lane.rank and other.now and other.now.coll_outstanding and other.now.coll_seq
        for sp in other.spans
        if sp.kind == "collective" and sp.open
    ]
    if not waits or lane.now is None or lane.now.coll_seq is None:
        return []
    seq = max(w[0] for w in waits)
    if lane.now.coll_seq >= seq:
        return []
    since = min(w[1] for w in waits if w[0] == seq)
    end = max(
        (sp.end for other in sec.lanes.values() for sp in other.spans if sp.kind == "collective" and sp.open),
        default=since,
    )
    op = next((o.now.coll_op for o in sec.lanes.values() if o.now and o.now.coll_seq == seq and o.now.coll_op), "")
    text = f"never entered {op} #{seq}"
    return [
        _rect(
            "missing",
            since,
            end,
            y - 4,
            24,
            sc,
            f"rank {lane.rank} {text}: the others have waited in it since {clock(since)}",
            f' data-seq="{seq}"',
        ),
        _in_rect_label(text, since, end, y - 6, sc, "rl missl"),
    ]


def _mark(t: float, kind: str, label: str, y: float, sc: Scale) -> str:
    shape = {
        "heartbeat": '<circle r="2.6" class="hb"/>',
        "pg": '<path d="M0,-4 L4,0 L0,4 L-4,0 Z" class="pg"/>',
        "control": '<path d="M-4,3 L0,-4 L4,3 Z" class="ctl"/>',
        "error": '<path d="M-3,-3 L3,3 M3,-3 L-3,3" class="err"/>',
    }.get(kind, '<circle r="2" class="hb"/>')
    return (
        f'<g class="pt" data-t="{t:.6f}" data-y="{y}" transform="translate({sc.x(t)},{y})">{shape}'
        f"{title(f'{label} at {clock(t)}')}</g>"
    )


def _flip(x: float, label: str) -> bool:
    """A label that would run past the plot's right edge is drawn left of its line."""
    return x + len(label) * CHAR_W + 6 > PLOT_X0 + PLOT_W


PRIORITY = {
    "finding": 0,
    "onset": 0,
    "action": 1,
    "host_lost": 1,
    "resolved": 2,
    "rank_restarted": 2,
    "host_back": 2,
    "evidence": 3,
    "stop": 4,
}  # who gets a label row first


def _event_rows(events: list[Event], sc: Scale) -> list[int]:
    """Label rows so labels never overlap, the important kinds first; a label with
    no free row is hidden (its line and tooltip stay). The script redoes it on zoom."""
    taken: list[list[tuple[float, float]]] = [[] for _ in range(EV_ROWS)]
    rows = [-1] * len(events)
    order = sorted(range(len(events)), key=lambda i: (PRIORITY.get(events[i].kind, 3), events[i].t))
    for i in order:
        e = events[i]
        x, w = sc.x(e.t), len(e.label) * CHAR_W + 8
        lo, hi = (x - w, x) if _flip(x, e.label) else (x, x + w)
        row = next((r for r in range(EV_ROWS) if all(hi <= a or lo >= b for a, b in taken[r])), -1)
        if row >= 0:
            taken[row].append((lo, hi))
        rows[i] = row
    return rows


def lanes_svg(sec: Section, lanes: list[Lane], view: tuple[float, float], culprits: set[int]) -> str:
    sc = Scale(*view)
    y0 = EV_H + 6
    height = y0 + len(lanes) * LANE_H + 30
    uid = f"s{sec.index}"
    out = [
        f'<svg class="lanes" id="lanes-{uid}" viewBox="0 0 {W} {height}" data-t0="{sc.t0:.6f}" '
        f'data-t1="{sc.t1:.6f}" data-x0="{PLOT_X0}" data-w="{PLOT_W}" '
        # the generator's UTC offset, so the script shows the same wall clock as the text
        f'data-tz="{time.localtime(sc.t0).tm_gmtoff}" xmlns="http://www.w3.org/2000/svg">',
        f'<defs><clipPath id="clip-{uid}"><rect x="{PLOT_X0}" y="0" width="{PLOT_W}" height="{height}"/></clipPath>'
        "</defs>",
    ]
    for i, lane in enumerate(lanes):
        y = y0 + i * LANE_H
        cls = "lane culprit" if lane.rank in culprits else "lane"
        out.append(f'<rect class="{cls}-bg" x="0" y="{y}" width="{W}" height="{LANE_H}"/>')
        mark = " ✗" if lane.rank in culprits else ""
        out.append(
            f'<text class="{cls}-label" x="6" y="{y + 15}" data-rank="{lane.rank}">rank {lane.rank}{mark}</text>'
        )
        sub = f"{lane.host or '?'} · pid {lane.pid or '?'}"
        out.append(f'<text class="lane-sub" x="6" y="{y + 29}">{escape(sub)}</text>')
    out.append(f'<g clip-path="url(#clip-{uid})" class="plot">')
    for i, lane in enumerate(lanes):
        y = y0 + i * LANE_H + 10
        for st in lane.steps:
            if st.end >= sc.t0 - (sc.t1 - sc.t0):  # keep a screen's width of history for panning left
                out += _step(st, y, sc, lane.rank)
        for sp in sorted(lane.spans, key=lambda s: s.kind != "step"):
            out += _span(sp, y, sc, lane.rank)
        if lane.rank in culprits:
            out += _missing(sec, lane, y, sc)
        out += [_mark(m.t, m.kind, f"rank {lane.rank}: {m.label}", y - 5, sc) for m in lane.marks]
    for i, lane in enumerate(lanes):
        if not lane.steps and not lane.spans:  # say why a lane is empty rather than leave it blank
            y = y0 + i * LANE_H + 22
            note = brief(lane.now)
            note = note if "slot" in note else f"no slot snapshot: {note}"
            out.append(f'<text class="lane-empty" x="{PLOT_X0 + 6}" y="{y}">{escape(note)}</text>')
    bottom = y0 + len(lanes) * LANE_H
    events = sorted((e for e in _with_onset(sec) if e.kind not in NOT_DRAWN), key=lambda e: e.t)
    for e, row in zip(events, _event_rows(events, sc)):
        cls = EVENT_CLASS.get(e.kind, "ev-other")
        ly = EV_ROW_H * ((row if row >= 0 else EV_ROWS - 1) + 1)
        x = sc.x(e.t)
        hidden = "" if PLOT_X0 - 1 <= x <= PLOT_X0 + PLOT_W + 1 else ' style="display:none"'
        anchor = ' text-anchor="end" x="-3"' if _flip(x, e.label) else ' x="3"'
        no_row = "" if row >= 0 else ' display="none"'
        out.append(
            f'<g class="ev {cls}" data-t="{e.t:.6f}" data-y="0" data-prio="{PRIORITY.get(e.kind, 3)}" '
            f'transform="translate({x},0)"{hidden}><line x1="0" x2="0" y1="{ly + 2}" y2="{bottom}"/>'
            f'<text class="evl"{anchor} y="{ly}"{no_row}>{escape(e.label)}</text>'
            f"{title(f'{clock(e.t)} {e.label}')}</g>"
        )
    out.append("</g>")
    out.append(_axis(sc, bottom, _origin(sec, sc)))
    out.append("</svg>")
    return "\n".join(out)


def _origin(sec: Section, sc: Scale) -> float:
    root = sec.root or {}
    onset = root.get("onset_wall")
    return float(onset) if isinstance(onset, (int, float)) and onset > 0 else sc.t0


EVIDENCE_MERGE_S = 1.0


def _merge_evidence(events: list[Event]) -> list[Event]:
    """Evidence answers from many hosts within a second are one marker: 2,048
    hosts' answers drawn one by one would be 2,048 lines on one pixel."""
    out: list[Event] = []
    run: list[Event] = []

    def flush() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            out.append(Event(run[0].t, "evidence", f"evidence from {len(run)} answers"))
        run.clear()

    for e in sorted(events, key=lambda e: e.t):
        if e.kind != "evidence":
            out.append(e)
            continue
        if run and e.t - run[0].t > EVIDENCE_MERGE_S:
            flush()
        run.append(e)
    flush()
    return out


def _with_onset(sec: Section) -> list[Event]:
    root = sec.root
    events = _merge_evidence(list(sec.events))
    if root and isinstance(root.get("onset_wall"), (int, float)) and root["onset_wall"] > 0:
        events.append(Event(float(root["onset_wall"]), "onset", f"onset of {root.get('kind')}"))
    return events


def _axis(sc: Scale, y: float, origin: float) -> str:
    step = nice_step(sc.t1 - sc.t0)
    first = math.ceil((sc.t0 - origin) / step)
    out = [
        f'<g class="axis" data-origin="{origin:.6f}"><line x1="{PLOT_X0}" x2="{PLOT_X0 + PLOT_W}" y1="{y + 2}" '
        f'y2="{y + 2}"/>'
    ]
    k = first
    while origin + k * step <= sc.t1:
        t = origin + k * step
        label = "0" if k == 0 else f"{k * step:+.{max(0, -math.floor(math.log10(step)))}f}s"
        out.append(
            f'<g class="tick" transform="translate({sc.x(t)},{y + 2})"><line y2="5"/>'
            f'<text y="16" text-anchor="middle">{label}</text></g>'
        )
        k += 1
    out.append(
        f'<text class="axis-wall" x="{PLOT_X0}" y="{y + 28}">{clock(sc.t0)}</text>'
        f'<text class="axis-wall" x="{PLOT_X0 + PLOT_W}" y="{y + 28}" text-anchor="end">{clock(sc.t1)}</text>'
        f'<text class="axis-wall" x="{PLOT_X0 + PLOT_W / 2}" y="{y + 28}" text-anchor="middle">'
        f"seconds from {'the onset of the root cause' if origin > sc.t0 else 'the window start'} "
        f"({clock(origin)})</text></g>"
    )
    return "".join(out)
