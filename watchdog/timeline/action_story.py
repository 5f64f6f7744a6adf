"""What was done about it: the policy's actions, told as one story per action.

The coordinator journals an action as ``action`` (decided), ``action_progress``
(signals sent), ``command``/``command_done`` per signalled process, ``restart``
(old workers gone), ``resumed`` (new group stepping), ``action_outcome``; and
``action_held`` while the policy waits. A restart's later records land after the
new processes appear, in the next section: they are told with the action that
started them (``action_id``). Unknown shapes are still listed, by their fields.
"""

from __future__ import annotations

from typing import Any

from watchdog.contracts import commands
from watchdog.contracts.finding import rank_ranges, ranks_phrase, seconds
from watchdog.contracts.journal import Record
from watchdog.contracts.journal import names as je
from watchdog.contracts.journal.actions import (
    ActionOutcomeRecord,
    ActionProgressRecord,
    ActionRecord,
    LauncherRestartRecord,
    RepeatFailureRecord,
    RestartRecord,
    ResumedRecord,
)
from watchdog.contracts.journal.commands import (
    CommandDoneRecord,
    CommandExpiredRecord,
    CommandRecord,
    CommandRefusedRecord,
    CommandUnknownAckRecord,
)

# An action's steps and the policy holding back. Not checkpoint_restart's
# je.CHECKPOINT_STEPS: the timeline does not tell them (the demo prints them).
ACTION_EVENTS = (*je.ACTION_STEPS, *je.POLICY_HELD)
COMMAND_EVENTS = je.COMMAND_EVENTS
COMMANDS = (CommandRecord, CommandDoneRecord, CommandRefusedRecord, CommandExpiredRecord, CommandUnknownAckRecord)
DRAWN = (
    je.ACTION,
    je.RESTART,
    je.LAUNCHER_RESTART,
    je.RESUMED,
    je.ACTION_OUTCOME,
)  # lines on the lanes; the rest is listed


def is_action(rec: Record) -> bool:
    return rec.event in ACTION_EVENTS or (isinstance(rec, COMMANDS) and rec.type not in commands.EVIDENCE)


def action_id(rec: Record) -> str | None:
    """The action a record belongs to: its own id, or the one its command's trigger names."""
    trig = getattr(rec, "trigger", None)  # the command records'
    aid = getattr(rec, "action_id", None) or (trig.get("action") if isinstance(trig, dict) else None)
    return str(aid) if aid else None


def _or(value: Any, unknown: str = "?") -> Any:
    return unknown if value is None else value


def label(rec: Record) -> str:
    """One line for a record of any shape: the policy's actions are younger than this reader."""
    ranks = getattr(rec, "ranks", None) or getattr(rec, "workers", None) or []
    if isinstance(rec, ActionRecord):
        dry = " (dry run)" if rec.dry_run else ""
        cause = f" for {rec.kind}" if rec.kind else ""
        escalated = f" (escalated from {rec.escalated_from})" if rec.escalated_from else ""
        return f"{rec.action}{dry}{cause} {ranks_phrase(ranks) if ranks else ''}".rstrip() + escalated
    if isinstance(rec, RestartRecord):
        return f"restart {_or(rec.restart)}: workers {_ranks(rec.stopped)} stopped" + _took(rec.seconds)
    if isinstance(rec, LauncherRestartRecord) and not rec.has("gone"):  # no action of the monitor's in flight
        return f"restart {_or(rec.restart)} by the launcher on its own: ranks back as new processes"
    if isinstance(rec, LauncherRestartRecord):
        return f"restart {_or(rec.restart)} by the launcher: workers {_ranks(rec.gone)} already gone"
    if isinstance(rec, ResumedRecord):
        lost = f", {rec.steps_lost} steps lost" if rec.steps_lost is not None else ""
        back = f"resumed from step {_or(rec.step)} with {_or(rec.world_size)} ranks{lost}"
        if rec.by == "launcher" and not rec.has("action_id"):  # after the launcher's restart on its own
            return back + (f", {seconds(float(rec.seconds))} after its restart" if rec.seconds is not None else "")
        return back + _took(rec.seconds)
    if isinstance(rec, ActionOutcomeRecord):
        return f"outcome {'ok' if rec.ok else 'FAILED'}: {rec.result or rec.extra.get('error') or ''}".rstrip()
    if isinstance(rec, RepeatFailureRecord):
        return (
            f"repeat ({_or(rec.rule)}, occurrence {_or(rec.occurrences)}): escalated to "
            f"{_or(rec.action)}: {_or(rec.reason, '')}"
        )
    if isinstance(rec, ActionProgressRecord) and rec.phase == "launcher":
        return f"waiting up to {_or(rec.waiting_s)} s for the launcher to stop workers {_ranks(rec.workers)}"
    if isinstance(rec, ActionProgressRecord):
        return f"{_or(rec.phase)}: {_or(rec.signal)} to workers {_ranks(rec.workers)}" + (
            f", launchers {rec.launchers}" if rec.launchers else ""
        )
    return _fields(rec, ranks)


def _fields(rec: Record, ranks: Any) -> str:
    """A record this reader has no sentence for, by the fields its line holds."""
    d = rec.to_dict()
    name = next((str(d[k]) for k in ("action", "command", "name", "kind", "type") if d.get(k)), "")
    parts = [rec.event.replace("_", " ")] + ([name] if name else [])
    if ranks:
        parts.append(ranks_phrase(ranks))
    if d.get("hosts"):
        parts.append("host " + ",".join(map(str, d["hosts"])))
    for key in ("outcome", "result", "status", "state", "ok", "error", "reason", "waited_s"):
        if key in d and d[key] not in (None, ""):
            parts.append(f"{key}={d[key]}")
    return " ".join(parts)


def _ranks(ranks: Any) -> str:
    return rank_ranges(ranks) if isinstance(ranks, list) and ranks else "?"


def _took(s: float | None) -> str:
    return f", {seconds(float(s))} after the action" if s is not None else ""


def lines(actions: list[Record]) -> list[tuple[float, int, str]]:
    """(t_wall, indent, text): each action, then its steps; signals sent to many
    processes collapse into one line; the policy holding back collapses too."""
    out: list[tuple[float, int, str]] = []
    sent: dict[str, CommandRecord] = {}  # command id -> its command record
    groups: dict[tuple, dict] = {}  # (action id, type, signal) -> tally
    held: list[Record] = []
    for rec in actions:
        ev, t = rec.event, float(rec.t_wall or 0.0)
        aid = action_id(rec)
        if ev == je.ACTION_HELD:
            held.append(rec)
        elif isinstance(rec, COMMANDS):
            answered = getattr(rec, "command_id", None)
            cmd = rec if isinstance(rec, CommandRecord) else sent.get(str(answered), rec)
            if isinstance(rec, CommandRecord):
                sent[str(rec.id)] = rec
            args = cmd.args if isinstance(cmd, CommandRecord) else None
            sig = (args or {}).get("signal", "")
            g = groups.setdefault((aid, rec.type, sig), {"t": t, "ranks": [], "tally": {}, "aid": aid})
            if isinstance(rec, CommandRecord):
                g["ranks"] += list(rec.ranks or [])
            else:
                outcome = ev[8:] + (" ok" if rec.ok else " failed") if isinstance(rec, CommandDoneRecord) else ev[8:]
                g["tally"][outcome] = g["tally"].get(outcome, 0) + 1
        else:
            out.append((t, 0 if ev == je.ACTION or aid is None else 1, label(rec)))
    for (aid, typ, sig), g in groups.items():
        tally = ", ".join(f"{n} {k}" for k, n in sorted(g["tally"].items(), key=lambda kv: ("ok" not in kv[0], kv[0])))
        target = ranks_phrase(g["ranks"]) if g["ranks"] else "?"
        text = f"{typ} {sig}".strip() + f" sent to {target}: {tally or 'no answer journaled'}"
        out.append((g["t"], 0 if aid is None else 1, text))
    if held:
        first = float(held[0].t_wall or 0.0)
        out.append((first, 0, f"held {len(held)} time(s) from here: {_or(getattr(held[-1], 'reason', None), '')}"))
    return sorted(out, key=lambda x: x[0])
