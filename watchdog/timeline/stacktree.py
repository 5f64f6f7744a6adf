"""The HTML stack tree: every rank's main-thread stack merged into one
collapsible tree (outermost frame at the top), each node with how many ranks
pass through it, each leaf with its ranks. The trunk every rank shares and the
branches of the culprit and the odd ones out are open; the crowd is folded.

Bounded: at most ``MAX_NODES`` nodes (groups are already capped), so 16,384
ranks in any number of places stay a page a browser draws in well under 2 s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

from watchdog.stackgroups import Group, short_phrase

from .formatting import clock
from .model import StackSet

MAX_NODES = 2000
RANGES_CHARS = 240

CSS = """
.stree { font: 12px/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; margin: 4px 0 10px; }
.stree details { margin-left: 14px; } .stree > details { margin-left: 0; }
.stree summary { cursor: pointer; white-space: nowrap; }
.stree .n { display: inline-block; min-width: 5ch; text-align: right; margin-right: 6px; color: #fff;
            background: #6b6b70; border-radius: 3px; padding: 0 4px; }
.stree .odd > summary .n { background: var(--bad); } .stree .crowd > summary .n { background: #4e79a7; }
.stree .f { color: var(--mute); } .stree .who { color: var(--ink); margin-left: 8px; white-space: normal; }
.stree .leaf { margin-left: 28px; color: var(--ink); }
.sgroups td { padding: 1px 8px 1px 0; vertical-align: top; } .sgroups td.c { text-align: right; font-weight: 600; }
.sgroups tr.odd td { color: var(--bad); }
"""


@dataclass
class _Node:
    name: str
    count: int = 0
    odd: bool = False  # on the path of the culprit's group or an odd one out
    children: dict[str, _Node] = field(default_factory=dict)
    leaves: list[Group] = field(default_factory=list)  # groups whose stack ends here


def build(s: StackSet) -> tuple[_Node, int]:
    """(root, nodes made); stops adding nodes past MAX_NODES (counts stay exact)."""
    root, made = _Node("all ranks"), 0
    special = {id(g) for g in s.grouping.odd_ones_out()} | {id(g) for g in s.grouping.groups if g.culprit}
    for g in s.grouping.groups:
        names = [f"{f} ({file}:{line})" for f, file, line in reversed(g.frames)] or [f"no stack: {g.error}"]
        node = root
        node.count += g.count
        node.odd |= id(g) in special
        for name in names:
            child = node.children.get(name)
            if child is None:
                if made >= MAX_NODES:
                    break
                child = node.children[name] = _Node(name)
                made += 1
            child.count += g.count
            child.odd |= id(g) in special
            node = child
        node.leaves.append(g)
    return root, made


def render(s: StackSet) -> str:
    g = s.grouping
    root, made = build(s)
    head = (
        f"<h3>Stacks of every rank · {escape(s.label)} · taken {clock(s.taken)} · {g.ranks} ranks in "
        f"{len(g.groups) + g.dropped_groups} group(s)</h3>"
    )
    parts = [head, _table(s)]
    parts.append('<div class="stree">' + "".join(_node(c, root.count) for c in root.children.values()) + "</div>")
    notes = list(s.notes)
    if made >= MAX_NODES:
        notes.append(f"tree cut at {MAX_NODES} frames; the counts above are exact")
    if g.dropped_groups:
        notes.append(f"{g.dropped_groups} more group(s) ({g.dropped_ranks} ranks) not drawn")
    if notes:
        parts.append('<div class="notes">' + "<br>".join(escape(n) for n in notes) + "</div>")
    return f"<style>{CSS}</style>" + "\n".join(parts)


def _table(s: StackSet) -> str:
    """Groups as rows, smallest first: the answer before the tree."""
    odd = {id(x) for x in s.grouping.odd_ones_out()}
    rows = []
    for x in s.grouping.groups[:24]:
        cls = ' class="odd"' if id(x) in odd or x.culprit else ""
        rows.append(
            f'<tr{cls}><td class="c">{x.count}</td><td>{escape(_who(x.ranks))}'
            f"{' (culprit)' if x.culprit else ''}</td><td><code>{escape(x.brief())}</code></td></tr>"
        )
    more = len(s.grouping.groups) - 24
    if more > 0:
        rows.append(f'<tr><td></td><td colspan="2" class="mute">… {more} more group(s) in the tree</td></tr>')
    return '<table class="sgroups">' + "".join(rows) + "</table>"


def _node(n: _Node, total: int) -> str:
    is_open = n.odd or n.count == total
    cls = "odd" if n.odd and n.count < total else ("crowd" if n.count < total else "")
    func, _, where = n.name.partition(" (")
    label = f'<span class="n">{n.count}</span>{escape(func)}' + (
        f' <span class="f">({escape(where)}</span>' if where else ""
    )
    leaves = "".join(
        f'<div class="leaf">{escape(_who(g.ranks))}{" (culprit)" if g.culprit else ""}</div>' for g in n.leaves
    )
    kids = "".join(_node(c, total) for c in n.children.values())
    return (
        f"<details{' open' if is_open else ''}{f' class={cls!r}' if cls else ''}><summary>{label}</summary>"
        f"{leaves}{kids}</details>"
    )


def _who(ranks: tuple[int, ...]) -> str:
    return short_phrase(ranks, RANGES_CHARS)
