"""Every rank's stack per trigger, grouped, for the timeline's renderers.

Built from the ``evidence`` records' stacks (regrouped here with the same pure
function the coordinator uses, so an old journal without ``stack_groups``
records still gets groups), falling back to the coordinator's ``stack_groups``
record when the stacks themselves are not in the journal. The coordinator's
record and ``stacks_capped`` also say what is missing: hosts that never
answered, ranks past a host's deadline, ranks left out by the per-host cap.
A malformed record is skipped with a note, never a crash.
"""

from __future__ import annotations

from typing import Any

from watchdog import stackgroups
from watchdog.contracts.journal import Record
from watchdog.contracts.journal.commands import EvidenceRecord, StackGroupsRecord, StacksCappedRecord
from watchdog.contracts.journal.names import STACK_GROUPS, STACKS_CAPPED
from watchdog.coordinator.evidence import triggers

from .model import Stack, StackSet

EVENTS = (STACK_GROUPS, STACKS_CAPPED)  # the journal records build() reads besides the evidence
MIN_RANKS = 3  # a set of one or two stacks (culprit + a waiter) is shown as the stacks themselves


def build(stacks: list[tuple[EvidenceRecord, Stack]], records: list[Record]) -> tuple[list[StackSet], list[str]]:
    """(stack sets in time order, notes about malformed records)."""
    # The evidence lines of a finding naming many ranks carry a brief trigger
    # (coordinator.triggers); its stack_groups record the full one, for culprits and label.
    full = {_key(_trigger(r)): _trigger(r) for r in records if isinstance(r, StackGroupsRecord)}
    by_key: dict[str, tuple[dict, list[Stack]]] = {}
    for answer, st in stacks:
        key = _key(_trigger(answer))
        by_key.setdefault(key, (full.get(key) or _trigger(answer), []))[1].append(st)
    made: dict[str, StackSet] = {}
    for key, (trigger, sts) in by_key.items():
        culprits = _culprits(trigger)
        newest_ok = sorted(sts, key=lambda s: (not s.ok, -s.taken_wall))  # group() keeps the first dump with frames
        g = stackgroups.group(((s.rank, s.ok, s.text, s.error) for s in newest_ok), culprits)
        made[key] = StackSet(
            trigger=trigger, label=label(trigger), taken=min(s.taken_wall for s in sts), grouping=g, culprits=culprits
        )
    notes: list[str] = []
    for rec in records:
        trigger = _trigger(rec)
        key = _key(trigger)
        if isinstance(rec, StacksCappedRecord):
            if key in made:
                made[key].notes.append(
                    f"{_or(rec.ranks_left_out)} rank(s) on {_or(rec.hosts_capped)} "
                    f"host(s) not asked: at most {_or(rec.max_per_host)} per host"
                )
            continue
        if not isinstance(rec, StackGroupsRecord):
            continue
        if key not in made:  # no stacks in the journal: the coordinator's groups are all there is
            try:
                g = stackgroups.Grouping.from_dict(rec.to_dict())
            except (ValueError, TypeError, AttributeError) as exc:
                notes.append(f"stack_groups record at {rec.t_wall} unreadable: {exc}")
                continue
            made[key] = StackSet(
                trigger=trigger,
                label=label(trigger),
                taken=rec.t_wall or 0.0,
                grouping=g,
                culprits=_culprits(trigger),
                source="record",
            )
        s = made[key]
        missing = rec.hosts_missing or []
        if missing:
            s.notes.append(
                f"no stacks from host(s) {', '.join(str(h) for h in missing[:8])}"
                + (" and more" if len(missing) > 8 else "")
                + " (refused or no answer in time)"
            )
        late = rec.late_ranks
        if late is not None and late > 0:
            s.notes.append(f"{late} rank(s) not dumped within their host's deadline")
    return sorted(made.values(), key=lambda s: s.taken), notes


def label(trigger: dict[str, Any]) -> str:
    what = f"{trigger.get('kind', '?')} {triggers.named(trigger) or '(no culprit named)'}"
    return f"abort {trigger['action']} ({what})" if trigger.get("action") else what


def shown(s: StackSet) -> bool:
    return s.grouping.ranks >= MIN_RANKS


def _culprits(trigger: dict[str, Any]) -> tuple[int, ...]:
    ranks = trigger.get("ranks")
    return tuple(r for r in ranks if isinstance(r, int)) if isinstance(ranks, list) else ()


def _trigger(rec: Record) -> dict[str, Any]:
    t = getattr(rec, "trigger", None)  # the evidence's, stack groups' and cap's records hold one
    return t if isinstance(t, dict) else {}


def _key(trigger: dict[str, Any]) -> str:
    return triggers.key(trigger)


def _or(value: Any) -> Any:
    return "?" if value is None else value


def folded_files(sections: list[Any]) -> list[tuple[str, str]]:
    """(file name, collapsed-stack text) per stack set: one file per hang (or
    abort), named by section, order and trigger, for flame-graph tools."""
    out = []
    for sec in sections:
        for i, s in enumerate(sec.stack_sets, 1):
            kind = str(s.trigger.get("kind") or "stacks")
            safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in kind)[:40]
            who = "-".join(str(r) for r in s.culprits[:4])
            out.append(
                (
                    f"section{sec.index + 1}-{i}-{safe}{('-rank' + who) if who else ''}.folded",
                    stackgroups.folded(s.grouping),
                )
            )
    return out
