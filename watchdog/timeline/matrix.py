"""The collective matrix: ranks x collective sequence numbers, for the HTML report.
Aligning by number, not time, is what makes the missing rank stand out: every
waiter sits in #k, the culprit's cell at #k is empty, whatever the clocks say."""

from __future__ import annotations

from .model import Lane, Section
from .svg import LABEL_W, title


def matrix_svg(sec: Section, lanes: list[Lane], culprits: set[int], columns: int = 14) -> str:
    """Collectives by sequence number: who completed, who waits, who never entered."""
    rows = [lane for lane in lanes if lane.now and lane.now.coll_seq is not None]
    if not rows:
        return ""
    top = max(_seq(lane) for lane in rows)
    if top <= 0:
        return ""
    seqs = list(range(max(1, top - columns + 1), top + 1))
    entered = {s for s in seqs for lane in rows if _state(lane, s) in ("done", "waiting")}
    cw, ch, x0, y0 = 44, 20, LABEL_W, 22
    width, height = x0 + cw * len(seqs) + 10, y0 + ch * len(rows) + 8
    out = [
        f'<svg class="matrix" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg">'
    ]
    for j, s in enumerate(seqs):
        out.append(f'<text class="mx-h" x="{x0 + j * cw + cw / 2}" y="{y0 - 6}" text-anchor="middle">#{s}</text>')
    for i, lane in enumerate(rows):
        y = y0 + i * ch
        cls = "lane culprit-label" if lane.rank in culprits else "lane-label"
        out.append(f'<text class="{cls}" x="6" y="{y + 14}">rank {lane.rank}</text>')
        for j, s in enumerate(seqs):
            st = _state(lane, s)
            if st == "none" and s in entered:
                st = "missing"
            label = {"done": "", "waiting": "wait", "missing": "✗", "none": ""}[st]
            tip = {
                "done": "completed",
                "waiting": "inside it, waiting for the others",
                "missing": "never entered it while others did",
                "none": "nobody has reached it",
            }[st]
            out.append(
                f'<g class="mx {st}" data-seq="{s}"><rect x="{x0 + j * cw + 2}" y="{y + 2}" width="{cw - 4}" '
                f'height="{ch - 4}" rx="3"/><text x="{x0 + j * cw + cw / 2}" y="{y + 14}" '
                f'text-anchor="middle">{label}</text>{title(f"rank {lane.rank} collective #{s}: {tip}")}</g>'
            )
    out.append("</svg>")
    return "\n".join(out)


def _seq(lane: Lane) -> int:
    """The lane's last collective number (rows only hold lanes that have one)."""
    return lane.now.coll_seq if lane.now and lane.now.coll_seq is not None else 0


def _state(lane: Lane, seq: int) -> str:
    now = lane.now
    if now is None:
        return "none"
    top = _seq(lane)
    if now.coll_outstanding and top == seq:
        return "waiting"
    done = now.coll_done_seq if now.coll_done_seq is not None else (top - 1 if now.coll_outstanding else top)
    if seq <= (done or 0) or any(seq in st.seqs for st in lane.steps):
        return "done"
    return "none"
