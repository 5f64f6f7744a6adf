"""The scaling table as text, a self-contained HTML page (inline SVG, no
network) and a PNG (matplotlib, the optional ``plot`` extra)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from .runs import Row, explain

COLUMNS = ("RANKS", "RUNS", "STEP_MS", "COMPUTE_MS", "COMM_MS", "DATA_MS", "THROUGHPUT", "EFFICIENCY")


def _cells(r: Row, threshold: float) -> tuple[str, ...]:
    flag = "  <" if r.efficiency < threshold else ""
    return (
        str(r.world_size),
        str(r.runs),
        f"{r.step_s * 1000:.1f}",
        f"{r.compute_s * 1000:.1f}",
        f"{r.coll_s * 1000:.1f}",
        f"{r.data_s * 1000:.1f}",
        f"{r.throughput:.2f}x",
        f"{r.efficiency:.0%}{flag}",
    )


def text(rows: Sequence[Row], threshold: float, strong: bool) -> str:
    body = [COLUMNS, *(_cells(r, threshold) for r in rows)]
    widths = [max(len(row[i]) for row in body) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in body]
    mode = "strong scaling (fixed global batch)" if strong else "weak scaling (fixed per-rank batch)"
    return (
        "\n".join(
            [
                f"{mode}; throughput and efficiency against {rows[0].world_size} rank(s)",
                "",
                *lines,
                "",
                explain(rows, threshold),
            ]
        )
        + "\n"
    )


def markdown(rows: Sequence[Row], threshold: float) -> str:
    head = "| ranks | step | compute | communication | data wait | throughput | efficiency |\n|---|---|---|---|---|---|---|\n"
    return head + "".join(
        f"| {r.world_size} | {r.step_s * 1000:.1f} ms | {r.compute_s * 1000:.1f} ms | {r.coll_s * 1000:.1f} ms | "
        f"{r.data_s * 1000:.1f} ms | {r.throughput:.2f}x | {r.efficiency:.0%} |\n"
        for r in rows
    )


# -- SVG -------------------------------------------------------------------------

W, H, PAD = 420, 260, 48
COLORS = {
    "compute": "#4c78a8",
    "communication": "#f58518",
    "data": "#54a24b",
    "slowest": "#b279a2",
    "ideal": "#999999",
    "measured": "#d62728",
}
LEGEND = {
    "compute": "compute",
    "communication": "communication",
    "data": "data wait",
    "slowest": "waiting on the slowest rank",
}


def _parts(r: Row) -> list[tuple[str, float]]:
    """A step's time in stacked parts that add up to the step: the rest is the
    wait for the slowest rank of each step (jitter, a straggler)."""
    rest = max(0.0, r.step_s - r.compute_s - r.coll_s - r.data_s)
    return [("compute", r.compute_s), ("communication", r.coll_s), ("data", r.data_s), ("slowest", rest)]


def _efficiency_svg(rows: Sequence[Row], threshold: float) -> str:
    xs = [r.world_size for r in rows]

    def x(i: int) -> float:
        return PAD + (W - 2 * PAD) * (i / max(1, len(rows) - 1))

    top = max(1.05, max(r.efficiency for r in rows) * 1.05)

    def y(v: float) -> float:
        return H - PAD - (H - 2 * PAD) * v / top

    parts = [
        f'<line x1="{PAD}" y1="{y(1):.1f}" x2="{W - PAD}" y2="{y(1):.1f}" stroke="{COLORS["ideal"]}" stroke-dasharray="4 3"/>',
        f'<line x1="{PAD}" y1="{y(threshold):.1f}" x2="{W - PAD}" y2="{y(threshold):.1f}" stroke="#cc0000" stroke-dasharray="2 4"/>',
        f'<text x="{W - PAD}" y="{y(threshold) - 4:.1f}" font-size="10" text-anchor="end" fill="#cc0000">threshold {threshold:.0%}</text>',
    ]
    pts = " ".join(f"{x(i):.1f},{y(r.efficiency):.1f}" for i, r in enumerate(rows))
    parts.append(f'<polyline points="{pts}" fill="none" stroke="{COLORS["measured"]}" stroke-width="2"/>')
    for i, r in enumerate(rows):
        parts.append(f'<circle cx="{x(i):.1f}" cy="{y(r.efficiency):.1f}" r="3.5" fill="{COLORS["measured"]}"/>')
        parts.append(
            f'<text x="{x(i):.1f}" y="{y(r.efficiency) - 8:.1f}" font-size="11" text-anchor="middle">{r.efficiency:.0%}</text>'
        )
        parts.append(f'<text x="{x(i):.1f}" y="{H - PAD + 16}" font-size="11" text-anchor="middle">{xs[i]}</text>')
    for v in (0.0, 0.5, 1.0):
        parts.append(f'<text x="{PAD - 6}" y="{y(v) + 4:.1f}" font-size="10" text-anchor="end">{v:.0%}</text>')
    return _frame("scaling efficiency", "ranks", parts)


def _split_svg(rows: Sequence[Row]) -> str:
    top = max(r.step_s for r in rows) * 1.1 or 1.0
    bw = (W - 2 * PAD) / len(rows) * 0.6
    parts = []
    for i, r in enumerate(rows):
        cx = PAD + (W - 2 * PAD) * (i + 0.5) / len(rows)
        base: float = H - PAD
        for name, v in _parts(r):
            h = (H - 2 * PAD) * v / top
            parts.append(
                f'<rect x="{cx - bw / 2:.1f}" y="{base - h:.1f}" width="{bw:.1f}" height="{h:.1f}" '
                f'fill="{COLORS[name]}"><title>{name} {v * 1000:.1f} ms</title></rect>'
            )
            base -= h
        parts.append(f'<text x="{cx:.1f}" y="{H - PAD + 16}" font-size="11" text-anchor="middle">{r.world_size}</text>')
        parts.append(
            f'<text x="{cx:.1f}" y="{base - 4:.1f}" font-size="10" text-anchor="middle">{r.step_s * 1000:.0f} ms</text>'
        )
    for j, name in enumerate(LEGEND):
        x0, y0 = PAD + (j % 2) * 160, PAD - 26 + (j // 2) * 13
        parts.append(
            f'<rect x="{x0}" y="{y0}" width="10" height="10" fill="{COLORS[name]}"/>'
            f'<text x="{x0 + 14}" y="{y0 + 9}" font-size="11">{LEGEND[name]}</text>'
        )
    return _frame("time per step", "ranks", parts)


def _frame(title: str, xlabel: str, parts: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">'
        f'<text x="{W / 2}" y="16" font-size="13" text-anchor="middle" font-weight="bold">{html.escape(title)}</text>'
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#333"/>'
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#333"/>'
        + "".join(parts)
        + f'<text x="{W / 2}" y="{H - 10}" font-size="11" text-anchor="middle">{xlabel}</text></svg>'
    )


def html_page(rows: Sequence[Row], threshold: float, strong: bool, sources: Sequence[str]) -> str:
    cells = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r, threshold)) + "</tr>" for r in rows
    )
    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    src = "".join(f"<li><code>{html.escape(s)}</code></li>" for s in sources)
    mode = "strong scaling (fixed global batch)" if strong else "weak scaling (fixed per-rank batch)"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>watchdog scaling</title>
<style>body{{font-family:sans-serif;margin:24px}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}</style>
</head><body><h1>Scaling</h1><p>{mode}; throughput and efficiency against {rows[0].world_size} rank(s).</p>
<p><b>{html.escape(explain(rows, threshold))}</b></p>
<div>{_efficiency_svg(rows, threshold)} {_split_svg(rows)}</div>
<table><tr>{head}</tr>{cells}</table><p>Runs:</p><ul>{src}</ul></body></html>
"""


def png(rows: Sequence[Row], threshold: float, path: str) -> None:
    """Raises ImportError without matplotlib (``pip install 'rank-watchdog[plot]'``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r.world_size for r in rows]
    labels = [str(x) for x in xs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(labels, [r.efficiency for r in rows], "o-", color=COLORS["measured"], label="measured")
    a.axhline(1.0, color=COLORS["ideal"], linestyle="--", label="ideal")
    a.axhline(threshold, color="#cc0000", linestyle=":", label=f"threshold {threshold:.0%}")
    for lab, r in zip(labels, rows):
        a.annotate(f"{r.efficiency:.0%}", (lab, r.efficiency), textcoords="offset points", xytext=(0, 7), ha="center")
    a.set_ylim(0, max(1.1, max(r.efficiency for r in rows) * 1.1))
    a.set_xlabel("ranks")
    a.set_ylabel("scaling efficiency")
    a.set_title("scaling efficiency")
    a.legend(loc="lower left")
    bottom = [0.0] * len(rows)
    for j, name in enumerate(LEGEND):
        vals = [_parts(r)[j][1] * 1000 for r in rows]
        b.bar(labels, vals, bottom=bottom, label=LEGEND[name], color=COLORS[name])
        bottom = [x + v for x, v in zip(bottom, vals)]
    b.set_ylim(0, max(r.step_s for r in rows) * 1000 * 1.45)  # room for the legend above the bars
    b.set_xlabel("ranks")
    b.set_ylabel("ms per step")
    b.set_title("time per step")
    b.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
