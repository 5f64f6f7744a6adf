"""The demo stops a job only once the first finding's evidence is in: what it
tails from the journal decides when that is (pure, from journal records)."""

from __future__ import annotations

from watchdog.contracts.journal import parse
from watchdog.coordinator.journal import event_names as je
from watchdog.dev.demo import EvidenceWait


def see(w: EvidenceWait, line: dict) -> None:
    """A journal line as the demo's tail hands it over: parsed into its record."""
    w.see(parse(line))


TRIGGER = {"kind": "frozen_rank", "ranks": [3]}


def _cmd(kind: str, host: str = "vm", trigger: dict = TRIGGER) -> dict:
    return {"event": je.COMMAND, "type": kind, "host": host, "trigger": trigger, "id": f"c-{kind}"}


def test_complete_once_every_command_for_the_first_finding_is_answered():
    w = EvidenceWait()
    assert not w.complete  # nothing found yet
    see(w, {"event": je.FINDING, "kind": "frozen_rank", "ranks": [3]})
    assert not w.complete  # found, nothing asked yet: the commands follow on the next tick
    for kind in ("snapshot_slots", "dump_stacks"):
        see(w, _cmd(kind))
    see(w, {"event": je.EVIDENCE, "type": "snapshot_slots", "host": "vm", "trigger": TRIGGER})
    assert not w.complete  # the stacks are still out
    # Evidence for a later finding does not answer the first one's request.
    see(w, {"event": je.FINDING, "kind": "collective_hang", "ranks": [3]})
    see(w, _cmd("dump_stacks", trigger={"kind": "collective_hang", "ranks": [3]}))
    see(
        w,
        {
            "event": je.EVIDENCE,
            "type": "dump_stacks",
            "host": "vm",
            "trigger": {"kind": "collective_hang", "ranks": [3]},
        },
    )
    assert not w.complete
    see(w, {"event": je.COMMAND_EXPIRED, "type": "dump_stacks", "host": "vm", "trigger": TRIGGER, "ids": ["c-1"]})
    assert w.complete  # an expired request is an answer too: the demo does not wait for it


def test_every_host_answers_for_its_own_ranks():
    w = EvidenceWait()
    see(w, {"event": je.FINDING, **TRIGGER})
    see(w, _cmd("dump_stacks", host="a"))
    see(w, _cmd("dump_stacks", host="b"))
    see(w, {"event": je.EVIDENCE, "type": "dump_stacks", "host": "a", "trigger": TRIGGER})
    assert not w.complete
    see(w, {"event": je.COMMAND_REFUSED, "type": "dump_stacks", "host": "b", "trigger": TRIGGER})
    assert w.complete
