"""What each journal record adds to its timeline section: a reducer per event type,
over the record parsed once (``SECTION_REDUCERS``); a record not listed adds
nothing here (it may still feed the lanes, through the known view, or the stack
sets)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from watchdog.contracts.finding import ranks_phrase
from watchdog.contracts.journal import Record
from watchdog.contracts.journal import names as je
from watchdog.contracts.journal.commands import (
    CommandDoneRecord,
    CommandExpiredRecord,
    CommandRecord,
    CommandRefusedRecord,
    CommandUnknownAckRecord,
    EvidenceRecord,
)
from watchdog.contracts.journal.findings import FindingRecord, ResolvedRecord
from watchdog.contracts.journal.lifecycle import RecoveredRecord, StartRecord, StopRecord
from watchdog.contracts.journal.performance import VerdictRecord
from watchdog.contracts.journal.ranks import HostBackRecord, HostLostRecord, RankRestartedRecord, StateRecord

from . import action_story
from .model import Event, Section

Command = CommandRecord | CommandDoneRecord | CommandRefusedRecord | CommandExpiredRecord | CommandUnknownAckRecord

# Each reducer: (section, typed record, the object its line held).


def _start(sec: Section, rec: StartRecord, d: dict) -> None:
    sec.job = rec.job or sec.job
    sec.world_size = int(rec.world_size or sec.world_size)


def _verdict(sec: Section, rec: VerdictRecord, d: dict) -> None:
    sec.verdicts.append(d)
    sec.events.append(Event(wall_of(rec), "verdict", f"bottleneck: {rec.verdict}", (), d))


def _goodput(sec: Section, rec: Record, d: dict) -> None:
    sec.goodput = d


def _finding(sec: Section, rec: FindingRecord, d: dict) -> None:
    sec.findings.append(d)
    detected = rec.detected_wall if rec.detected_wall > 0 else wall_of(rec)
    sec.events.append(Event(detected, "finding", f"{rec.kind} {_who(rec.ranks)}", tuple(rec.ranks), d))


def _resolved(sec: Section, rec: ResolvedRecord, d: dict) -> None:
    sec.events.append(Event(wall_of(rec), "resolved", f"resolved {rec.kind} {_who(rec.ranks)}", tuple(rec.ranks), d))


def _action(sec: Section, rec: Record, d: dict) -> None:
    sec.actions.append(rec)
    kind = "action" if rec.event in action_story.DRAWN else "action_step"
    sec.events.append(Event(wall_of(rec), kind, action_story.label(rec), tuple(getattr(rec, "ranks", None) or ()), d))


def _command(sec: Section, rec: Command, d: dict) -> None:
    if action_story.is_action(rec):  # a signal the policy's action sent
        _action(sec, rec, d)
        return
    # evidence collection's own bookkeeping: listed, not drawn
    sec.events.append(
        Event(wall_of(rec), "evidence_request", action_story.label(rec), tuple(getattr(rec, "ranks", None) or ()), d)
    )
    if rec.event in (je.COMMAND_REFUSED, je.COMMAND_EXPIRED):
        why = (rec.reason or rec.error) if isinstance(rec, CommandRefusedRecord) else None
        sec.notes.append(
            f"evidence request {rec.type} to host {rec.host if rec.has('host') else '?'} "
            f"{rec.event.split('_')[1]}: {why or 'no answer in time'}"
        )


def _evidence(sec: Section, rec: EvidenceRecord, d: dict) -> None:
    n_slots, n_stacks, n_fr = len(rec.slots or ()), len(rec.stacks or ()), len(rec.flight_recorder or ())
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
    host = rec.host if rec.has("host") else "?"
    sec.events.append(Event(wall_of(rec), "evidence", f"evidence from {host}: {what}"))
    if rec.ok is False or rec.error:
        sec.notes.append(f"evidence from host {host} incomplete: {rec.error or 'the agent reported failure'}")


def _host(sec: Section, rec: HostLostRecord | HostBackRecord, d: dict) -> None:
    sec.events.append(Event(wall_of(rec), rec.event, f"{rec.event.replace('_', ' ')}: {rec.host}"))


def _rank_restarted(sec: Section, rec: RankRestartedRecord, d: dict) -> None:
    line = f"rank {rec.rank} restarted (pid {rec.pid})"
    sec.events.append(Event(wall_of(rec), rec.event, line, _ranks(rec.rank)))


def _state(sec: Section, rec: StateRecord, d: dict) -> None:
    if rec.job_state is not None:  # the policy's job state machine, not a rank's
        was = rec.from_state if rec.has("from") else "?"
        on = rec.on if rec.has("on") else "?"
        sec.events.append(Event(wall_of(rec), "job_state", f"job {was} -> {rec.job_state} (on {on})"))


def _recovered(sec: Section, rec: RecoveredRecord, d: dict) -> None:
    """A coordinator restarted on this journal: what it carried on with."""
    flight = rec.in_flight
    carried = f", {flight.get('action')} {flight.get('action_id')} carried on" if flight else ""
    used = rec.restarts_used if rec.has("restarts_used") else "?"
    line = (
        f"coordinator recovered its decisions from the journal: {used} restarts "
        f"used{carried}, {len(rec.open_findings)} findings open"
    )
    sec.events.append(Event(wall_of(rec), "job_state", line))
    sec.notes.append(line)


def _stop(sec: Section, rec: StopRecord, d: dict) -> None:
    sec.stop = d
    sec.events.append(Event(wall_of(rec), "stop", f"coordinator stopped ({rec.reason if rec.has('reason') else '?'})"))


SECTION_REDUCERS: dict[str, Callable[[Section, Any, dict], None]] = {
    je.START: _start,
    je.VERDICT: _verdict,
    je.GOODPUT: _goodput,
    je.FINDING: _finding,
    je.RESOLVED: _resolved,
    **dict.fromkeys(action_story.ACTION_EVENTS, _action),
    **dict.fromkeys(action_story.COMMAND_EVENTS, _command),
    je.EVIDENCE: _evidence,
    je.HOST_LOST: _host,
    je.HOST_BACK: _host,
    je.RANK_RESTARTED: _rank_restarted,
    je.STATE: _state,
    je.RECOVERED: _recovered,
    je.STOP: _stop,
}


def _who(ranks: list) -> str:
    return ranks_phrase(ranks) if ranks else "(no culprit named)"


def wall_of(rec: dict | Record) -> float:
    """A record's ``t_wall``; 0.0 where its line has none it can use."""
    v = rec.t_wall if isinstance(rec, Record) else rec.get("t_wall")
    return float(v) if isinstance(v, (int, float)) else 0.0


def _ranks(rank: Any) -> tuple[int, ...]:
    """The rank a record names, if it names one (a journal is read, never trusted)."""
    return (rank,) if isinstance(rank, int) else ()
