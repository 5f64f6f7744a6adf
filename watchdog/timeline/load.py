"""Journal -> Timeline: one section per coordinator start and per worker restart.

The journal is read with ``journal.read``, which skips a line torn by a kill
mid-write. Sections: a ``start`` event opens one (the coordinator (re)started);
so does a ``rank_restarted`` unless it belongs to a restart already under way
(the other ranks of the same group restart within seconds). Evidence is given
to the section whose process it describes (by pid), because a snapshot taken at
a restart can be journaled after the new processes were seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from watchdog.coordinator import journal
from watchdog.coordinator import journal_events as je
from watchdog.coordinator.finding import ranks_phrase
from watchdog.evidence import SlotEvidence, StackDump

from . import actions, known, lanes, stacksets
from .model import ClockNote, Event, Lane, Section, Stack, Timeline

RESTART_WINDOW_S = 60.0  # rank_restarted events this close to the first belong to one group restart
CLOCK_SLACK_S = 0.25  # below this, clocks "agree" (report timing noise)
REPORT_DELAY_S = 2.0  # evidence reaches the coordinator up to about a report interval after it was read


@dataclass
class _Raw:
    section: Section
    records: list[dict] = field(default_factory=list)
    restarted: set[int] = field(default_factory=set)
    pids: dict[int, set[int]] = field(default_factory=dict)
    # (rank, pid) pairs an earlier section owns: a late record about an old
    # process (its death noticed after the restart began) must not make a lane here.
    older: set[tuple[int, int]] = field(default_factory=set)


def load(path: str) -> Timeline:
    with open(path, "rb") as fh:
        nonblank = sum(1 for line in fh if line.strip())
    records = journal.read(path)
    raws = _split(records)
    _follow_actions(raws)
    slots: list[list[tuple[dict, SlotEvidence]]] = [[] for _ in raws]
    stacks: list[list[Stack]] = [[] for _ in raws]
    triggered: list[list[tuple[dict, Stack]]] = [[] for _ in raws]  # (evidence record, stack), for stack sets
    for i, raw in enumerate(raws):
        for rec in raw.records:
            if rec["event"] == je.EVIDENCE:
                raw.section.evidence_events += 1
                for d in rec.get("slots") or ():
                    s = _parse(SlotEvidence, d)
                    if s is not None:
                        slots[_owner(raws, i, s.rank, s.pid)].append((rec, s))
                for d in rec.get("stacks") or ():
                    st = _parse(StackDump, d)
                    if st is not None:
                        stack = Stack(
                            rank=st.rank,
                            host=st.host,
                            pid=st.pid,
                            ok=st.ok,
                            text=st.text,
                            error=st.error,
                            method=st.method,
                            taken_wall=st.taken_wall or float(rec.get("t_wall", 0.0)),
                        )
                        owner = _owner(raws, i, st.rank, st.pid)
                        stacks[owner].append(stack)
                        triggered[owner].append((rec, stack))
    sections = [_build(raw, slots[i], stacks[i]) for i, raw in enumerate(raws)]
    for i, sec in enumerate(sections):
        sec.stack_sets, notes = stacksets.build(
            triggered[i], [r for r in raws[i].records if r["event"] in stacksets.EVENTS]
        )
        sec.notes += notes
    return Timeline(path=path, sections=sections, skipped_lines=max(0, nonblank - len(records)))


def _parse(cls, d: Any):
    try:
        return cls.from_dict(d)
    except (TypeError, KeyError, AttributeError):
        return None  # a malformed entry must not hide the rest of the evidence


def _split(records: list[dict]) -> list[_Raw]:
    raws: list[_Raw] = []
    cur: _Raw | None = None
    first_restart_t = 0.0
    for rec in records:
        ev, t = rec["event"], _t(rec)
        if ev == je.START or cur is None:
            cur = _new(raws, t, "start" if ev == je.START else "journal", rec)
        elif ev == je.RANK_RESTARTED:
            raw_rank = rec.get("rank")
            rank = raw_rank if isinstance(raw_rank, int) else -1  # a journal is read, never trusted
            same = (
                cur.section.opened_by == "restart"
                and rank not in cur.restarted
                and t - first_restart_t <= RESTART_WINDOW_S
            )
            if not same:
                cur = _new(raws, t, "restart", rec, prev=cur.section)
                first_restart_t = t
            cur.restarted.add(rank)
        cur.records.append(rec)
        for rank, pid in _pids(rec):
            if (rank, pid) not in cur.older:
                cur.pids.setdefault(rank, set()).add(pid)
    for i, raw in enumerate(raws):
        raw.section.end = (
            raws[i + 1].section.start
            if i + 1 < len(raws)
            else max((_t(r) for r in raw.records), default=raw.section.start)
        )
    return raws


def _follow_actions(raws: list[_Raw]) -> None:
    """A restart's later records (its outcome, the resumed step) are journaled after
    the new processes appeared, in the next section: tell them with the action."""
    origin: dict[str, int] = {}
    for i, raw in enumerate(raws):
        keep = []
        for rec in raw.records:
            aid = actions.action_id(rec) if actions.is_action(rec) else None
            if rec["event"] == je.ACTION and aid:
                origin.setdefault(aid, i)
            if aid in origin and origin[aid] < i:
                raws[origin[aid]].records.append(rec)
            else:
                keep.append(rec)
        raw.records = keep


def _new(raws: list[_Raw], t: float, opened_by: str, rec: dict, prev: Section | None = None) -> _Raw:
    sec = Section(
        index=len(raws),
        start=t,
        end=t,
        opened_by=opened_by,
        job=rec.get("job") or (prev.job if prev else ""),
        world_size=int(rec.get("world_size") or (prev.world_size if prev else 0)),
    )
    raw = _Raw(sec)
    if opened_by == "restart":  # a new incarnation: the processes before it are history
        raw.older = {(rank, pid) for r in raws for rank, pids in r.pids.items() for pid in pids}
    raws.append(raw)
    return raw


def _t(rec: dict) -> float:
    v = rec.get("t_wall")
    return float(v) if isinstance(v, (int, float)) else 0.0


def _pids(rec: dict):
    """(rank, pid) pairs a record names, so evidence can find its section."""
    if rec["event"] in (je.RANK_JOINED, je.RANK_RESTARTED, je.STATE) and isinstance(rec.get("pid"), int):
        yield rec.get("rank"), rec["pid"]
    ev = rec.get("evidence") if rec["event"] == je.FINDING else None
    if isinstance(ev, dict):
        for r, pid in (ev.get("pids") or {}).items():
            yield int(r), pid
        for r, c in (ev.get("culprits") or {}).items():
            if isinstance(c, dict):
                yield int(r), c.get("pid")


def _owner(raws: list[_Raw], i: int, rank: int, pid: int) -> int:
    """The section whose processes include (rank, pid): this one or an earlier one."""
    for j in range(i, -1, -1):
        if pid in raws[j].pids.get(rank, ()):
            return j
    return i


def _build(raw: _Raw, slots: list[tuple[dict, SlotEvidence]], stacks: list[Stack]) -> Section:
    sec = raw.section
    view = known.KnownView()
    for rec in raw.records:
        if not any(pair in raw.older for pair in _pids(rec)):
            view.add(rec)
        ev = rec["event"]
        if ev == je.START:
            sec.job = rec.get("job") or sec.job
            sec.world_size = int(rec.get("world_size") or sec.world_size)
        elif ev == je.VERDICT:
            sec.verdicts.append(rec)
            sec.events.append(Event(_t(rec), "verdict", f"bottleneck: {rec.get('verdict')}", (), rec))
        elif ev == je.GOODPUT:
            sec.goodput = rec
        elif ev == je.FINDING:
            sec.findings.append(rec)
            sec.events.append(
                Event(_detected(rec), "finding", f"{rec.get('kind')} {_who(rec)}", tuple(rec.get("ranks") or ()), rec)
            )
        elif ev == je.RESOLVED:
            sec.events.append(
                Event(
                    _t(rec), "resolved", f"resolved {rec.get('kind')} {_who(rec)}", tuple(rec.get("ranks") or ()), rec
                )
            )
        elif actions.is_action(rec):
            sec.actions.append(rec)
            kind = "action" if ev in actions.DRAWN else "action_step"
            sec.events.append(Event(_t(rec), kind, actions.label(rec), tuple(rec.get("ranks") or ()), rec))
        elif ev in actions.COMMAND_EVENTS:  # evidence collection's own bookkeeping: listed, not drawn
            sec.events.append(
                Event(_t(rec), "evidence_request", actions.label(rec), tuple(rec.get("ranks") or ()), rec)
            )
            if ev in (je.COMMAND_REFUSED, je.COMMAND_EXPIRED):
                sec.notes.append(
                    f"evidence request {rec.get('type')} to host {rec.get('host', '?')} "
                    f"{ev.split('_')[1]}: {rec.get('reason') or rec.get('error') or 'no answer in time'}"
                )
        elif ev == je.EVIDENCE:
            n_slots, n_stacks = len(rec.get("slots") or ()), len(rec.get("stacks") or ())
            n_fr = len(rec.get("flight_recorder") or ())
            what = (
                " + ".join(
                    x
                    for x in (
                        f"{n_slots} slot snapshots" if n_slots else "",
                        f"{n_stacks} stacks" if n_stacks else "",
                        f"{n_fr} Flight Recorder dumps" if n_fr else "",
                    )
                    if x
                )
                or "nothing"
            )
            sec.events.append(Event(_t(rec), "evidence", f"evidence from {rec.get('host', '?')}: {what}"))
            if rec.get("ok") is False or rec.get("error"):
                sec.notes.append(
                    f"evidence from host {rec.get('host', '?')} incomplete: "
                    f"{rec.get('error') or 'the agent reported failure'}"
                )
        elif ev in (je.HOST_LOST, je.HOST_BACK):
            sec.events.append(Event(_t(rec), ev, f"{ev.replace('_', ' ')}: {rec.get('host')}"))
        elif ev == je.RANK_RESTARTED:
            sec.events.append(
                Event(_t(rec), ev, f"rank {rec.get('rank')} restarted (pid {rec.get('pid')})", _ranks(rec.get("rank")))
            )
        elif ev == je.STATE and "job_state" in rec:  # the policy's job state machine, not a rank's
            sec.events.append(
                Event(
                    _t(rec), "job_state", f"job {rec.get('from', '?')} -> {rec['job_state']} (on {rec.get('on', '?')})"
                )
            )
        elif ev == je.RECOVERED:  # a coordinator restarted on this journal: what it carried on with
            flight = rec.get("in_flight") if isinstance(rec.get("in_flight"), dict) else None
            carried = f", {flight.get('action')} {flight.get('action_id')} carried on" if flight else ""
            line = (
                f"coordinator recovered its decisions from the journal: {rec.get('restarts_used', '?')} restarts "
                f"used{carried}, {len(rec.get('open_findings') or ())} findings open"
            )
            sec.events.append(Event(_t(rec), "job_state", line))
            sec.notes.append(line)
        elif ev == je.STOP:
            sec.stop = rec
            sec.events.append(Event(_t(rec), "stop", f"coordinator stopped ({rec.get('reason', '?')})"))
    by_rank: dict[int, list[SlotEvidence]] = {}
    for _, s in slots:
        by_rank.setdefault(s.rank, []).append(s)
    for rank, snaps in by_rank.items():
        sec.lanes[rank] = lanes.build(snaps, alive=view.alive(rank), gone_seen=view.gone_seen(rank))
    for rank in view.ranks():
        if rank not in sec.lanes:
            sec.lanes[rank] = view.lane(rank)
    for rank in range(min(sec.world_size, 4096)):
        if rank not in sec.lanes:  # expected but never registered: never_joined's culprits
            sec.lanes[rank] = Lane(rank=rank, now=known.never_registered())
    for st in stacks:
        lane = sec.lanes.setdefault(st.rank, Lane(rank=st.rank, host=st.host, pid=st.pid))
        lane.stacks.append(st)
    sec.lanes = dict(sorted(sec.lanes.items()))
    sec.clocks = _clocks(slots)
    _notes(sec, slots)
    return sec


def _detected(rec: dict) -> float:
    v = rec.get("detected_wall")
    return float(v) if isinstance(v, (int, float)) and v > 0 else _t(rec)


def _who(rec: dict) -> str:
    ranks = rec.get("ranks") or ()
    return ranks_phrase(ranks) if ranks else "(no culprit named)"


def _clocks(slots: list[tuple[dict, SlotEvidence]]) -> list[ClockNote]:
    """Per host: the agent's wall clock against the coordinator's (the journal's
    t_wall), and the slot mapping against the agent's wall clock at read time."""
    per: dict[str, list[float]] = {}
    drift: dict[str, float] = {}
    for rec, s in slots:
        if s.taken_wall > 0 and _t(rec) > 0:
            per.setdefault(s.host, []).append(s.taken_wall - _t(rec))
        if s.taken_wall > 0 and s.taken_mono_ns > 0:
            d = abs(s.to_wall(s.taken_mono_ns) - s.taken_wall)
            drift[s.host] = max(drift.get(s.host, 0.0), d)
    out = []
    for host in sorted(per):
        # agent - coordinator = offset - delay, delay >= 0: the largest sample is the tightest bound.
        off = max(per[host])
        agree = -REPORT_DELAY_S - CLOCK_SLACK_S <= off <= CLOCK_SLACK_S and drift.get(host, 0.0) <= CLOCK_SLACK_S
        out.append(
            ClockNote(host=host, offset_s=round(off, 3), slot_drift_s=round(drift.get(host, 0.0), 3), agree=agree)
        )
    return out


def _notes(sec: Section, slots: list) -> None:
    if not slots and not sec.findings:
        sec.notes.append(
            "no finding in this section, so no evidence was collected: the lanes show the "
            "coordinator's last known view of each rank"
        )
    elif not slots:
        why = (
            "no evidence event in this section (a journal from before evidence collection, or collection failed)"
            if not sec.evidence_events
            else "evidence events carry no slot snapshot"
        )
        sec.notes.append(f"slot evidence missing: {why}; showing the coordinator's last known view of each rank")
    else:
        without = sorted(r for r, lane in sec.lanes.items() if lane.now is None or lane.now.source != "slot")
        if without:
            sec.notes.append(
                f"no slot snapshot of {ranks_phrase(without)}: their lanes show the coordinator's last known view only"
            )
    torn = sorted(r for r, lane in sec.lanes.items() if lane.torn)
    if torn:
        sec.notes.append(
            f"{ranks_phrase(torn)}: slot header read mid-update (the process stopped inside a write); "
            "its state may mix two moments"
        )
    for c in sec.clocks:
        if not c.agree:
            sec.notes.append(
                f"clock: host {c.host} disagrees: agent wall clock {c.offset_s:+.3f} s vs the "
                f"coordinator's (after up to {REPORT_DELAY_S:.0f} s report delay), slot mapping drift "
                f"{c.slot_drift_s:.3f} s; its lanes are drawn on its own clock, not corrected"
            )
    hosts = {c.host: c.offset_s for c in sec.clocks}
    if len(hosts) > 1 and max(hosts.values()) - min(hosts.values()) > REPORT_DELAY_S:
        sec.notes.append(
            "clock: hosts disagree by more than the report delay: "
            + ", ".join(f"{h} {o:+.3f} s" for h, o in sorted(hosts.items()))
        )


def _ranks(rank: Any) -> tuple[int, ...]:
    """The rank a record names, if it names one (a journal is read, never trusted)."""
    return (rank,) if isinstance(rank, int) else ()
