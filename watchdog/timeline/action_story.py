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

from watchdog import commands
from watchdog.contracts.journal import names as je
from watchdog.coordinator.finding import rank_ranges, ranks_phrase, seconds

# An action's steps and the policy holding back. Not checkpoint_restart's
# je.CHECKPOINT_STEPS: the timeline does not tell them (the demo prints them).
ACTION_EVENTS = (*je.ACTION_STEPS, *je.POLICY_HELD)
COMMAND_EVENTS = je.COMMAND_EVENTS
DRAWN = (
    je.ACTION,
    je.RESTART,
    je.LAUNCHER_RESTART,
    je.RESUMED,
    je.ACTION_OUTCOME,
)  # lines on the lanes; the rest is listed


def is_action(rec: dict) -> bool:
    ev = rec["event"]
    return ev in ACTION_EVENTS or (ev in COMMAND_EVENTS and rec.get("type") not in commands.EVIDENCE)


def action_id(rec: dict) -> str | None:
    trig = rec.get("trigger")
    aid = rec.get("action_id") or (trig.get("action") if isinstance(trig, dict) else None)
    return str(aid) if aid else None


def label(rec: dict) -> str:
    """One line for a record of any shape: the policy's actions are younger than this reader."""
    ev = rec["event"]
    ranks = rec.get("ranks") or rec.get("workers") or []
    if ev == je.ACTION:
        dry = " (dry run)" if rec.get("dry_run") else ""
        cause = f" for {rec['kind']}" if rec.get("kind") else ""
        escalated = f" (escalated from {rec['escalated_from']})" if rec.get("escalated_from") else ""
        return f"{rec.get('action')}{dry}{cause} {ranks_phrase(ranks) if ranks else ''}".rstrip() + escalated
    if ev == je.RESTART:
        return f"restart {rec.get('restart', '?')}: workers {_ranks(rec.get('stopped'))} stopped" + _took(rec)
    if ev == je.LAUNCHER_RESTART and "gone" not in rec:  # no action of the monitor's in flight
        return f"restart {rec.get('restart', '?')} by the launcher on its own: ranks back as new processes"
    if ev == je.LAUNCHER_RESTART:
        return f"restart {rec.get('restart', '?')} by the launcher: workers {_ranks(rec.get('gone'))} already gone"
    if ev == je.RESUMED:
        lost = f", {rec['steps_lost']} steps lost" if isinstance(rec.get("steps_lost"), int) else ""
        if rec.get("by") == "launcher" and "action_id" not in rec:  # after the launcher's restart on its own
            s = rec.get("seconds")
            took = f", {seconds(float(s))} after its restart" if isinstance(s, (int, float)) else ""
            return f"resumed from step {rec.get('step', '?')} with {rec.get('world_size', '?')} ranks{lost}{took}"
        return f"resumed from step {rec.get('step', '?')} with {rec.get('world_size', '?')} ranks{lost}" + _took(rec)
    if ev == je.ACTION_OUTCOME:
        return f"outcome {'ok' if rec.get('ok') else 'FAILED'}: {rec.get('result') or rec.get('error') or ''}".rstrip()
    if ev == je.REPEAT_FAILURE:
        return (
            f"repeat ({rec.get('rule', '?')}, occurrence {rec.get('occurrences', '?')}): escalated to "
            f"{rec.get('action', '?')}: {rec.get('reason', '')}"
        )
    if ev == je.ACTION_PROGRESS and rec.get("phase") == "launcher":
        return (
            f"waiting up to {rec.get('waiting_s', '?')} s for the launcher to stop workers {_ranks(rec.get('workers'))}"
        )
    if ev == je.ACTION_PROGRESS:
        return f"{rec.get('phase', '?')}: {rec.get('signal', '?')} to workers {_ranks(rec.get('workers'))}" + (
            f", launchers {rec['launchers']}" if rec.get("launchers") else ""
        )
    name = next((str(rec[k]) for k in ("action", "command", "name", "kind", "type") if rec.get(k)), "")
    parts = [ev.replace("_", " ")] + ([name] if name else [])
    if ranks:
        parts.append(ranks_phrase(ranks))
    if rec.get("hosts"):
        parts.append("host " + ",".join(map(str, rec["hosts"])))
    for key in ("outcome", "result", "status", "state", "ok", "error", "reason", "waited_s"):
        if key in rec and rec[key] not in (None, ""):
            parts.append(f"{key}={rec[key]}")
    return " ".join(parts)


def _ranks(ranks: Any) -> str:
    return rank_ranges(ranks) if isinstance(ranks, list) and ranks else "?"


def _took(rec: dict) -> str:
    s = rec.get("seconds")
    return f", {seconds(float(s))} after the action" if isinstance(s, (int, float)) else ""


def lines(actions: list[dict]) -> list[tuple[float, int, str]]:
    """(t_wall, indent, text): each action, then its steps; signals sent to many
    processes collapse into one line; the policy holding back collapses too."""
    out: list[tuple[float, int, str]] = []
    sent: dict[str, dict] = {}  # command id -> its command record
    groups: dict[tuple, dict] = {}  # (action id, type, signal) -> tally
    held: list[dict] = []
    for rec in actions:
        ev, t = rec["event"], float(rec.get("t_wall") or 0.0)
        aid = action_id(rec)
        if ev == je.ACTION_HELD:
            held.append(rec)
        elif ev in COMMAND_EVENTS:
            cmd = rec if ev == je.COMMAND else sent.get(str(rec.get("command_id")), rec)
            if ev == je.COMMAND:
                sent[str(rec.get("id"))] = rec
            sig = (cmd.get("args") or {}).get("signal", "") if isinstance(cmd.get("args"), dict) else ""
            g = groups.setdefault((aid, rec.get("type"), sig), {"t": t, "ranks": [], "tally": {}, "aid": aid})
            if ev == je.COMMAND:
                g["ranks"] += list(rec.get("ranks") or [])
            else:
                outcome = ev[8:] + (" ok" if rec.get("ok") else " failed") if ev == je.COMMAND_DONE else ev[8:]
                g["tally"][outcome] = g["tally"].get(outcome, 0) + 1
        else:
            out.append((t, 0 if ev == je.ACTION or aid is None else 1, label(rec)))
    for (aid, typ, sig), g in groups.items():
        tally = ", ".join(f"{n} {k}" for k, n in sorted(g["tally"].items(), key=lambda kv: ("ok" not in kv[0], kv[0])))
        target = ranks_phrase(g["ranks"]) if g["ranks"] else "?"
        text = f"{typ} {sig}".strip() + f" sent to {target}: {tally or 'no answer journaled'}"
        out.append((g["t"], 0 if aid is None else 1, text))
    if held:
        first = float(held[0].get("t_wall") or 0.0)
        out.append((first, 0, f"held {len(held)} time(s) from here: {held[-1].get('reason', '')}"))
    return sorted(out, key=lambda x: x[0])
