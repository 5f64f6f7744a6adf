"""The text post-mortem: root cause first, then every rank, then what was done.

Read at a terminal the morning after: the first lines must name the rank that
stopped first and where; the per-rank table shows what the others were doing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from watchdog.contracts.finding import ranks_phrase
from watchdog.stackgroups import short_phrase

from . import action_story, stacksets
from .formatting import clock, date, finding_times, latest_split, ordered_lanes, seconds, step_summary
from .model import Lane, Section, Stack, StackSet, Timeline, brief

STACK_LINES = 14  # of the main thread: enough for the training loop's frames


def render(tl: Timeline, *, steps: int = 5, max_ranks: int = 32) -> str:
    out: list[str] = [f"watchdog timeline: {tl.path}"]
    if tl.skipped_lines:
        out.append(f"({tl.skipped_lines} unreadable journal line(s) skipped: torn by a kill mid-write)")
    if not tl.sections:
        out.append("the journal holds no events")
        return "\n".join(out) + "\n"
    for sec in tl.sections:
        out.append("")
        out += _section(sec, len(tl.sections), steps, max_ranks)
    return "\n".join(out) + "\n"


def _section(sec: Section, n_sections: int, steps: int, max_ranks: int) -> list[str]:
    opened = {"start": "coordinator started", "restart": "ranks restarted", "journal": "journal begins"}[sec.opened_by]
    hosts = sorted({lane.host for lane in sec.lanes.values() if lane.host})
    out = [
        f"== section {sec.index + 1} of {n_sections}: {opened} {date(sec.start)}, {seconds(sec.end - sec.start)}; "
        f"job {sec.job or '?'}, {sec.world_size or len(sec.lanes)} ranks on {len(hosts)} host(s) =="
    ]
    root = sec.root
    if root is None:
        out.append("no finding in this section")
    else:
        out += _root(sec, root)
    out.append("")
    out += _ranks(sec, steps, max_ranks)
    out.append("")
    out += _performance(sec)
    out += _actions(sec)
    others = [f for f in sec.findings if f is not root]
    if others:
        out.append("other findings:")
        out += [
            f"  {clock(finding_times(f)[1])} {f.get('kind')} {ranks_phrase(f.get('ranks') or []) if f.get('ranks') else ''}: "
            f"{f.get('reason', '')}"
            for f in others
        ]
    resolved = [e for e in sec.events if e.kind == "resolved"]
    if resolved:
        out.append("resolved: " + "; ".join(f"{clock(e.t)} {e.label}" for e in resolved))
    for c in sec.clocks:
        state = "agree" if c.agree else "DISAGREE"
        out.append(
            f"clock: host {c.host} {state}: agent {c.offset_s:+.3f} s vs coordinator (report delay included), "
            f"slot mapping drift {c.slot_drift_s:.3f} s"
        )
    out += [f"note: {n}" for n in sec.notes]
    return out


def _performance(sec: Section) -> list[str]:
    """Where the time went and what limited the steps: never a fault, told after the ranks."""
    out = []
    for v in sec.verdicts:
        out.append(f"bottleneck {clock(float(v.get('t_wall', 0.0)))}: {v.get('reason') or v.get('verdict')}")
    g = sec.goodput
    if g and g.get("summary"):
        out.append(f"time{' (final)' if g.get('final') else ''}: {g['summary']}")
    split = latest_split(sec)
    if split:
        out.append(split)
    return out + [""] if out else out


def _root(sec: Section, root: dict) -> list[str]:
    onset, detected = finding_times(root)
    ranks = root.get("ranks") or []
    head = f"ROOT CAUSE: {root.get('kind')} naming {ranks_phrase(ranks) if ranks else 'no rank'}"
    out = [
        head,
        f"  onset {clock(onset)}, detected {clock(detected)}"
        + (f" (+{seconds(detected - onset)})" if onset and detected else ""),
    ]
    out.append(f"  {root.get('reason', '')}")
    sets = [s for s in sec.stack_sets if stacksets.shown(s)]
    if sets and sets[0].grouping.odd_ones_out():
        out.append(f"  stacks: {sets[0].grouping.summary()}")
    for r in ranks[:8]:
        lane = sec.lanes.get(r)
        if lane is None or lane.now is None:
            continue
        src = f"slot read {clock(lane.now.t)}" if lane.now.source == "slot" else "coordinator's last view"
        out.append(f"  rank {r} ({_ident(lane)}; {src}): {lane.now.where}" + _hb(lane))
    if not sec.has_slots:
        out.append("  slot evidence missing: no slot snapshot in the journal for this section")
    waiter = sec.waiter()
    for r in list(ranks[:2]) + ([waiter] if waiter is not None else []):
        lane = sec.lanes.get(r)
        if lane is None:
            continue
        role = "culprit" if r in ranks else "waiting"
        out += _stack(lane, role)
    for s in sets:
        out += _groups(s)
    return out


GROUP_LINES = 12  # groups listed per stack set; the smallest (the odd ones out) come first
RANGES_CHARS = 160


def _groups(s: StackSet) -> list[str]:
    g = s.grouping
    out = [
        f"  stacks of every rank ({s.label}, taken {clock(s.taken)}): {g.ranks} ranks in "
        f"{len(g.groups) + g.dropped_groups} group(s), smallest first"
    ]
    width = len(str(max((x.count for x in g.groups), default=1)))
    for x in g.groups[:GROUP_LINES]:
        who = short_phrase(x.ranks, RANGES_CHARS)
        out.append(f"    {x.count:>{width}}  {who}{' (culprit)' if x.culprit else ''}: {x.brief()}")
    more = len(g.groups) - GROUP_LINES
    if more > 0 or g.dropped_groups:
        out.append(
            f"    ... {max(0, more) + g.dropped_groups} more group(s) "
            f"({sum(x.count for x in g.groups[GROUP_LINES:]) + g.dropped_ranks} ranks)"
        )
    out += [f"    note: {n}" for n in s.notes]
    return out


def _first_line(text: str) -> str:
    line = next((x.strip() for x in text.splitlines() if x.strip()), "no reason given")
    return line[:200]


def _ident(lane: Lane) -> str:
    return f"host {lane.host or '?'}, pid {lane.pid or '?'}"


def _hb(lane: Lane) -> str:
    age = lane.now.heartbeat_age_s if lane.now else None
    return f"; heartbeat {seconds(age)} old" if isinstance(age, (int, float)) else ""


def _stack(lane: Lane, role: str) -> list[str]:
    if not lane.stacks:
        gone = lane.now is not None and lane.now.activity == "gone"
        return [f"  stack of rank {lane.rank} ({role}): " + ("none (process gone)" if gone else "none in the journal")]
    st: Stack = max(lane.stacks, key=lambda s: (s.ok, s.taken_wall))
    if not st.ok:
        return [f"  stack of rank {lane.rank} ({role}): {st.method} failed: {_first_line(st.error)}"]
    lines = st.main_thread().splitlines()
    more = len(lines) - STACK_LINES
    body = [f"      {x}" for x in lines[:STACK_LINES]] + ([f"      ... {more} more line(s)"] if more > 0 else [])
    return [f"  stack of rank {lane.rank} ({role}, {st.method} at {clock(st.taken_wall)}):", *body]


def _ranks(sec: Section, steps: int, max_ranks: int) -> list[str]:
    lanes = ordered_lanes(sec)
    if not lanes:
        return ["no rank was ever seen"]
    culprits = set(sec.culprits())
    t = max((lane.now.t for lane in lanes if lane.now and lane.now.t), default=None)
    src = "slot snapshots" if sec.has_slots else "the coordinator's last known view (no slot evidence)"
    out = [f"ranks at {clock(t)} from {src}; last {steps} steps: mean step = data + collective + compute"]
    rows = [("rank", "host", "pid", "step", "phase", "coll#", "heartbeat", "where", f"last {steps} steps")]
    shown = lanes[:max_ranks]
    for lane in shown:
        now = lane.now
        mark = "*" if lane.rank in culprits else ""
        hb = now.heartbeat_age_s if now else None
        rows.append(
            (
                f"{lane.rank}{mark}",
                lane.host or "?",
                str(lane.pid or "?"),
                _s(now.step if now else None),
                (now.phase if now else "") or "?",
                _s(now.coll_seq if now else None) + ("…" if now and now.coll_outstanding else ""),
                seconds(hb) if isinstance(hb, (int, float)) else "?",
                brief(now),
                step_summary(lane.steps[-steps:]) if lane.steps else "-",
            )
        )
    out += _table(rows)
    rest = lanes[max_ranks:]
    if rest:
        groups = Counter(brief(lane.now).split(" for ")[0] for lane in rest)
        out.append(f"  ... {len(rest)} more ranks: " + "; ".join(f"{n} {w}" for w, n in groups.most_common(4)))
    out.append(
        "  (* culprit of the root cause; coll# is the last collective entered, … while still inside it; "
        "heartbeat: its age when read)"
    )
    return out


def _s(v: float | None) -> str:
    return "?" if v is None else str(v)


def _table(rows: Iterable[tuple[str, ...]]) -> list[str]:
    rows = list(rows)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]


def _actions(sec: Section) -> list[str]:
    if not sec.actions and sec.opened_by == "restart":
        return ["actions: none in this section (it began with the restart told in the section before)"]
    if not sec.actions:
        return ["actions: none journaled (detection only: the policy alerts and takes no action)"]
    return ["actions:"] + [
        f"  {clock(t)} {'    ' * indent}{text}" for t, indent, text in action_story.lines(sec.actions)
    ]
