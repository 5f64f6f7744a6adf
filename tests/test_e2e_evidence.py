"""Evidence end to end: real torchrun (4 gloo ranks on CPU) with the example,
a real agent and coordinator through ``watchdog demo --json`` (the conftest's
shared run of each fault). When a finding opens, the journal gets signed
commands and then ``evidence`` events: py-spy
stacks that show where the culprit is stuck and what a waiter is blocked in, and
slot snapshots of every rank with their STEP_END records."""

from __future__ import annotations

import pytest

from watchdog.agent.command_channel.stacks import find_py_spy
from watchdog.contracts import slot as wire
from watchdog.contracts.evidence import SlotEvidence, StackDump
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.dev import localjob

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(find_py_spy() is None, reason="py-spy not installed (pip install py-spy)"),
]


def line_of(after: str, text: str) -> int:
    """1-based line of the first ``text`` after the line containing ``after`` in the example."""
    lines = localjob.EXAMPLE_SCRIPT.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if after in ln)
    return next(i for i in range(start, len(lines)) if text in lines[i]) + 1


def evidence(res, kind):
    recs = journal.read(res.summary["journal"])
    finding = next(i for i, r in enumerate(recs) if r["event"] == je.FINDING and r["kind"] == kind)
    after = [r for r in recs[finding:] if r["event"] == je.EVIDENCE and r["trigger"]["kind"] == kind]
    assert after, f"no evidence for {kind}: {[r['event'] for r in recs]}"
    stacks = {s["rank"]: StackDump.from_dict(s) for r in after for s in r["stacks"]}
    slots = {s["rank"]: SlotEvidence.from_dict(s) for r in after for s in r["slots"]}
    return recs, stacks, slots


def step_ends(ev: SlotEvidence) -> list[list[int]]:
    return [r for r in ev.records if r[1] == int(wire.RecordKind.STEP_END)]


def test_hang_evidence_shows_the_culprit_stuck_and_the_waiters_in_backward(fault_run):
    res = fault_run("hang:2@30")  # the run tests/test_e2e_faults.py and test_timeline_real.py read too
    recs, stacks, slots = evidence(res, "collective_hang")
    assert any(r["event"] == je.COMMAND and r["signed"] for r in recs)  # the demo runs with a job token
    culprit = stacks[2]
    assert culprit.ok, culprit.error
    hang_line = line_of('announce("hang"', "time.sleep(3600)")
    assert f"main (train_ddp.py:{hang_line})" in culprit.text, culprit.text
    waiters = [s for r, s in stacks.items() if r != 2]
    assert len(waiters) == 3 and all(w.ok and "backward" in w.text for w in waiters), waiters  # every rank at a hang
    print(f"\nculprit rank 2 ({culprit.method}, {culprit.duration_s:.3f} s):\n{culprit.text}")
    assert sorted(slots) == [0, 1, 2, 3]
    for rank, ev in slots.items():
        ends = step_ends(ev)
        assert ends and ev.header["step"] >= 30 and ev.pid > 0, (rank, ev.header)
        assert ends[-1][3] >= 29  # the last completed step is in the ring


def test_stopped_rank_gets_a_nonblocking_dump(fault_run):
    res = fault_run("stop:3@25")
    _, stacks, slots = evidence(res, "frozen_rank")
    stopped = stacks[3]
    assert stopped.ok, stopped.error
    assert stopped.method == "py-spy dump --nonblocking"
    stop_line = line_of('announce("stop"', "SIGSTOP")
    assert f"main (train_ddp.py:{stop_line})" in stopped.text, stopped.text
    assert step_ends(slots[3])
