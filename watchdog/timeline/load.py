"""Journal -> Timeline: one section per coordinator start and per worker restart.

The journal is read with ``reader.read``, which skips a line torn by a kill
mid-write, and each record is parsed once into its typed record (an old line,
or one of an event this version does not know, included); what each adds to its
section is ``sections.py``'s. Sections: a ``start`` event opens one (the
coordinator (re)started); so does a ``rank_restarted`` unless it belongs to a restart already under way
(the other ranks of the same group restart within seconds). Evidence is given
to the section whose process it describes (by pid), because a snapshot taken at
a restart can be journaled after the new processes were seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from watchdog.contracts.evidence import SlotEvidence, StackDump
from watchdog.contracts.finding import ranks_phrase
from watchdog.contracts.journal import Record, parse, reader
from watchdog.contracts.journal import names as je
from watchdog.contracts.journal.actions import ResumedRecord
from watchdog.contracts.journal.commands import EvidenceRecord
from watchdog.contracts.journal.findings import FindingRecord
from watchdog.contracts.journal.lifecycle import StartRecord
from watchdog.contracts.journal.ranks import RankJoinedRecord, RankRestartedRecord, StateRecord

from . import action_story, journal_ranks, lanes, stacksets
from .model import ClockNote, Lane, Section, Stack, Timeline
from .sections import SECTION_REDUCERS, wall_of

RESTART_WINDOW_S = 60.0  # rank_restarted events this close to the first belong to one group restart
CLOCK_SLACK_S = 0.25  # below this, clocks "agree" (report timing noise)
REPORT_DELAY_S = 2.0  # evidence reaches the coordinator up to about a report interval after it was read


Read = tuple[Record, dict]  # a record parsed once, and the object its line held (for the modules that show it)


@dataclass
class _Raw:
    section: Section
    records: list[Read] = field(default_factory=list)
    restarted: set[int] = field(default_factory=set)
    pids: dict[int, set[int]] = field(default_factory=dict)
    # (rank, pid) pairs an earlier section owns: a late record about an old
    # process (its death noticed after the restart began) must not make a lane here.
    older: set[tuple[int, int]] = field(default_factory=set)


def load(path: str) -> Timeline:
    with open(path, "rb") as fh:
        nonblank = sum(1 for line in fh if line.strip())
    records = reader.read(path)
    raws = _split([(parse(d), d) for d in records])
    _follow_actions(raws)
    slots: list[list[tuple[dict, SlotEvidence]]] = [[] for _ in raws]
    stacks: list[list[Stack]] = [[] for _ in raws]
    triggered: list[list[tuple[EvidenceRecord, Stack]]] = [[] for _ in raws]  # (evidence record, stack), for stack sets
    for i, raw in enumerate(raws):
        for rec, d in raw.records:
            if isinstance(rec, EvidenceRecord):
                raw.section.evidence_events += 1
                for entry in rec.slots or ():
                    s = _parse(SlotEvidence, entry)
                    if s is not None:
                        slots[_owner(raws, i, s.rank, s.pid)].append((d, s))
                for entry in rec.stacks or ():
                    st = _parse(StackDump, entry)
                    if st is not None:
                        stack = Stack(
                            rank=st.rank,
                            host=st.host,
                            pid=st.pid,
                            ok=st.ok,
                            text=st.text,
                            error=st.error,
                            method=st.method,
                            taken_wall=st.taken_wall or wall_of(rec),
                        )
                        owner = _owner(raws, i, st.rank, st.pid)
                        stacks[owner].append(stack)
                        triggered[owner].append((rec, stack))
    sections = [_build(raw, slots[i], stacks[i]) for i, raw in enumerate(raws)]
    for i, sec in enumerate(sections):
        sec.stack_sets, notes = stacksets.build(
            triggered[i], [rec for rec, _ in raws[i].records if rec.event in stacksets.EVENTS]
        )
        sec.notes += notes
    return Timeline(path=path, sections=sections, skipped_lines=max(0, nonblank - len(records)))


T = TypeVar("T", covariant=True)


class _FromDict(Protocol[T]):
    def from_dict(self, d: Any) -> T: ...


def _parse(cls: _FromDict[T], d: Any) -> T | None:
    try:
        return cls.from_dict(d)
    except (TypeError, KeyError, AttributeError):
        return None  # a malformed entry must not hide the rest of the evidence


def _split(records: list[Read]) -> list[_Raw]:
    raws: list[_Raw] = []
    cur: _Raw | None = None
    first_restart_t = 0.0
    for rec, d in records:
        t = wall_of(rec)
        if isinstance(rec, StartRecord) or cur is None:
            cur = _new(raws, t, "start" if isinstance(rec, StartRecord) else "journal", rec)
        elif isinstance(rec, RankRestartedRecord):
            rank = rec.rank if rec.rank is not None else -1  # a journal is read, never trusted
            same = (
                cur.section.opened_by == "restart"
                and rank not in cur.restarted
                and t - first_restart_t <= RESTART_WINDOW_S
            )
            if not same:
                cur = _new(raws, t, "restart", rec, prev=cur.section)
                first_restart_t = t
            cur.restarted.add(rank)
        cur.records.append((rec, d))
        for rank, pid in _pids(rec):
            if (rank, pid) not in cur.older:
                cur.pids.setdefault(rank, set()).add(pid)
    for i, raw in enumerate(raws):
        raw.section.end = (
            raws[i + 1].section.start
            if i + 1 < len(raws)
            else max((wall_of(rec) for rec, _ in raw.records), default=raw.section.start)
        )
    return raws


def _follow_actions(raws: list[_Raw]) -> None:
    """A restart's later records (its outcome, the resumed step) are journaled after
    the new processes appeared, in the next section: tell them with the action."""
    origin: dict[str, int] = {}
    for i, raw in enumerate(raws):
        keep = []
        for rec, d in raw.records:
            aid = action_story.action_id(rec) if action_story.is_action(rec) else None
            if rec.event == je.ACTION and aid:
                origin.setdefault(aid, i)
            if aid in origin and origin[aid] < i:
                raws[origin[aid]].records.append((rec, d))
            else:
                keep.append((rec, d))
        raw.records = keep


def _new(raws: list[_Raw], t: float, opened_by: str, rec: Record, prev: Section | None = None) -> _Raw:
    job, world_size = _job_and_world(rec)
    sec = Section(
        index=len(raws),
        start=t,
        end=t,
        opened_by=opened_by,
        job=job or (prev.job if prev else ""),
        world_size=world_size or (prev.world_size if prev else 0),
    )
    raw = _Raw(sec)
    if opened_by == "restart":  # a new incarnation: the processes before it are history
        raw.older = {(rank, pid) for r in raws for rank, pids in r.pids.items() for pid in pids}
    raws.append(raw)
    return raw


def _job_and_world(rec: Record) -> tuple[str, int]:
    """The job and world size the record opening a section names, where its type carries them ("" and 0: it does not)."""
    if isinstance(rec, StartRecord):
        return rec.job, rec.world_size
    if isinstance(rec, (RankJoinedRecord, ResumedRecord)):
        return "", rec.world_size or 0
    return "", 0


def _pids(rec: Record) -> Iterator[tuple[Any, Any]]:
    """(rank, pid) pairs a record names, so evidence can find its section."""
    if isinstance(rec, (RankJoinedRecord, RankRestartedRecord, StateRecord)) and rec.pid is not None:
        yield rec.rank, rec.pid
    if type(rec) is FindingRecord:
        ev = rec.evidence
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
    view = journal_ranks.KnownView()
    for rec, d in raw.records:
        if not any(pair in raw.older for pair in _pids(rec)):
            view.add(rec)
        reduce = SECTION_REDUCERS.get(rec.event)
        if reduce is not None:
            reduce(sec, rec, d)
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
            sec.lanes[rank] = Lane(rank=rank, now=journal_ranks.never_registered())
    for st in stacks:
        lane = sec.lanes.setdefault(st.rank, Lane(rank=st.rank, host=st.host, pid=st.pid))
        lane.stacks.append(st)
    sec.lanes = dict(sorted(sec.lanes.items()))
    sec.clocks = _clocks(slots)
    _notes(sec, slots)
    return sec


def _clocks(slots: list[tuple[dict, SlotEvidence]]) -> list[ClockNote]:
    """Per host: the agent's wall clock against the coordinator's (the journal's
    t_wall), and the slot mapping against the agent's wall clock at read time."""
    per: dict[str, list[float]] = {}
    drift: dict[str, float] = {}
    for rec, s in slots:
        if s.taken_wall > 0 and wall_of(rec) > 0:
            per.setdefault(s.host, []).append(s.taken_wall - wall_of(rec))
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
