"""Evidence collection on the coordinator side, time moved by numbers: which ranks
get stacks and snapshots, when a command is sent, re-sent and given up on, and
what is journaled — against simulated jobs and fake agents that verify the
signatures like the real one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from watchdog.contracts import commands
from watchdog.contracts.evidence import SlotEvidence, StackDump
from watchdog.contracts.journal.commands import (
    CommandExpiredRecord,
    CommandRecord,
    CommandRefusedRecord,
    EvidenceRecord,
)
from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config
from watchdog.coordinator.evidence import collect, triggers
from watchdog.coordinator.evidence.dispatch import GIVE_UP, SEND, WAIT, Dispatch, DispatchConfig, Pending, decide
from watchdog.coordinator.evidence.plan import CommandRequest, plan
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.testing import SimJob

TOKEN = "job-token"


def summary(reqs):
    return [(r.host, r.type, r.ranks) for r in reqs]


# -- plan ------------------------------------------------------------------------------


def test_hang_snapshots_and_dumps_every_rank():
    view = t.view(t.healthy(8), ranks_per_host=4)
    f = t.finding("collective_hang", [5], wants=[5], waiters=[0, 1, 2, 3, 4, 6, 7])
    assert summary(plan(f, view)) == [
        ("host0", "snapshot_slots", [0, 1, 2, 3]),
        ("host1", "snapshot_slots", [4, 5, 6, 7]),
        ("host0", "dump_stacks", [0, 1, 2, 3]),
        ("host1", "dump_stacks", [4, 5, 6, 7]),
        ("host0", "dump_flight_recorder", [0, 1, 2, 3]),  # every rank's: PyTorch's analyzer needs them all
        ("host1", "dump_flight_recorder", [4, 5, 6, 7]),
    ]
    req = plan(f, view)[3]
    assert req.targets[1] == commands.target(5, 1005, 1_700_000_000_000_000)
    assert req.trigger == {"kind": "collective_hang", "ranks": [5]}


def test_hang_with_a_dead_culprit_dumps_only_the_live_ranks():
    view = t.view(t.with_rank(t.healthy(4), 2, alive=False), ranks_per_host=4)
    f = t.finding("collective_hang", [2], wants=[2], waiters=[0, 1, 3])
    assert summary(plan(f, view)) == [
        ("host0", "snapshot_slots", [0, 1, 2, 3]),
        ("host0", "dump_stacks", [0, 1, 3]),
        ("host0", "dump_flight_recorder", [0, 1, 3]),
    ]


def test_dead_rank_gets_a_snapshot_of_its_file_and_no_stack():
    view = t.view(t.with_rank(t.healthy(8), 6, alive=False), ranks_per_host=4)
    # Every lane: the dead rank's file and what the others were doing.
    assert summary(plan(t.finding("dead_rank", [6]), view)) == [
        ("host0", "snapshot_slots", [0, 1, 2, 3]),
        ("host1", "snapshot_slots", [4, 5, 6, 7]),
    ]


def test_frozen_rank_gets_snapshots_and_every_ranks_stack():
    view = t.view(t.healthy(4), ranks_per_host=4)
    assert summary(plan(t.finding("frozen_rank", [3], wants=[3]), view)) == [
        ("host0", "snapshot_slots", [0, 1, 2, 3]),
        ("host0", "dump_stacks", [0, 1, 2, 3]),
        ("host0", "dump_flight_recorder", [0, 1, 2, 3]),
    ]


def test_dumps_are_capped_and_unknown_ranks_skipped():
    view = t.view(t.healthy(16), ranks_per_host=16)
    f = t.finding("straggler", [], wants=range(16), waiters=list(range(16)))
    dumps = [r for r in plan(f, view) if r.type == "dump_stacks"]
    assert [len(r.targets) for r in dumps] == [8]
    hang = [
        r for r in plan(replace(f, kind="collective_hang"), view, max_stacks_per_host=12) if r.type == "dump_stacks"
    ]
    assert [len(r.targets) for r in hang] == [12]  # per host, at a hang
    # An unregistered rank has neither stack nor slot; the registered ones are snapshotted.
    assert summary(plan(t.finding("never_joined", [20]), view)) == [("host0", "snapshot_slots", list(range(16)))]


def test_snapshots_are_capped_culprits_first():
    view = t.view(t.healthy(100), ranks_per_host=100)
    (req,) = plan(t.finding("dead_rank", [99]), view)
    assert len(req.ranks) == 64 and 99 in req.ranks and req.ranks[:63] == list(range(63))


# -- decide ----------------------------------------------------------------------------

CFG = DispatchConfig(give_up_s=60.0, resend_intervals=3.0, resend_min_s=2.0, max_attempts=3)
REQ = CommandRequest(
    host="h", type="dump_stacks", targets=(commands.target(0, 1, 2),), trigger={"kind": "k", "ranks": [0]}
)


@pytest.mark.parametrize(
    "pending,now,want",
    [
        (Pending(REQ, created=0.0), 0.0, SEND),
        (Pending(REQ, created=0.0, ids=["a"], sent_at=0.0), 2.9, WAIT),
        (Pending(REQ, created=0.0, ids=["a"], sent_at=0.0), 3.0, SEND),  # 3 intervals of 1 s, no answer
        (Pending(REQ, created=0.0, ids=["a"], sent_at=0.0, running=True), 30.0, WAIT),  # agent is on it
        (Pending(REQ, created=0.0, ids=["a", "b", "c"], sent_at=10.0), 30.0, WAIT),  # attempts used up
        (Pending(REQ, created=0.0, ids=["a"], sent_at=0.0, running=True), 60.0, GIVE_UP),
    ],
)
def test_decide(pending, now, want):
    assert decide(pending, now, 1.0, CFG) == want


# -- dispatch --------------------------------------------------------------------------


def ids():
    n = iter(range(1000))
    return lambda: f"c-{next(n)}"


def test_dispatch_signs_for_the_agent_clock_resends_under_a_new_id_and_takes_the_first_answer():
    d = Dispatch(TOKEN, CFG, new_id=ids())
    d.request([REQ], now=0.0)
    assert d.outgoing("job", "other-host", 5e8, 1.0, 0.0) == ([], [])
    [cmd], [sent] = d.outgoing("job", "h", agent_wall=5e8, interval_s=1.0, now=0.0)
    assert commands.verify(cmd, TOKEN, "job", "h", 5e8 + 1, set()) == (True, "")
    assert isinstance(sent, CommandRecord)
    assert cmd["expires_wall"] == 5e8 + CFG.ttl_s and sent.event == je.COMMAND and sent.attempt == 1
    assert d.outgoing("job", "h", 5e8, 1.0, 1.0)[0] == []  # too early to re-send
    [again], _ = d.outgoing("job", "h", 5e8, 1.0, 3.5)  # the reply was lost
    assert again["id"] != cmd["id"] and again["args"] == cmd["args"]
    ack = {
        "id": cmd["id"],
        "type": "dump_stacks",
        "ok": True,
        "error": "",
        "stacks": [StackDump(host="h", rank=0, pid=1, ok=True, text="main (x.py:1)").to_dict()],
        "slots": [],
    }
    [ev] = d.acked("h", [ack], 4.0)
    assert isinstance(ev, EvidenceRecord)
    assert ev.event == je.EVIDENCE and ev.command_id == cmd["id"]
    assert ev.stacks is not None and ev.stacks[0]["text"] == "main (x.py:1)"
    assert d.acked("h", [{**ack, "id": again["id"]}], 5.0) == []  # the second attempt's answer: ignored
    assert d.pending() == [] and d.outgoing("job", "h", 5e8, 1.0, 10.0)[0] == []


def test_running_ack_stops_resends_until_the_result_or_give_up():
    d = Dispatch(TOKEN, CFG, new_id=ids())
    d.request([REQ], now=0.0)
    [cmd], _ = d.outgoing("job", "h", 0.0, 1.0, 0.0)
    assert d.acked("h", [{"id": cmd["id"], "type": "dump_stacks", "running": True}], 1.0) == []
    assert d.outgoing("job", "h", 0.0, 1.0, 30.0)[0] == []
    [ex] = d.expire(60.0, lambda host: 1.0)
    assert isinstance(ex, CommandExpiredRecord)
    assert ex.event == je.COMMAND_EXPIRED and ex.ids == [cmd["id"]] and ex.acknowledged is True
    # A result after we gave up is still evidence, marked late.
    [ev] = d.acked(
        "h",
        [{"id": cmd["id"], "type": "dump_stacks", "ok": False, "error": "py-spy timed out", "stacks": [], "slots": []}],
        61.0,
    )
    assert isinstance(ev, EvidenceRecord)
    assert ev.event == je.EVIDENCE and ev.late is True and ev.ok is False
    assert ev.error is not None and "timed out" in ev.error


def test_refusal_unknown_ack_and_malformed_evidence():
    d = Dispatch(TOKEN, CFG, new_id=ids())
    d.request([REQ, replace(REQ, type="snapshot_slots")], now=0.0)
    (a, b), _ = d.outgoing("job", "h", 0.0, 1.0, 0.0)
    events = d.acked(
        "h",
        [
            {"id": a["id"], "type": a["type"], "ok": False, "error": "refused: expired", "refused": "expired"},
            {
                "id": b["id"],
                "type": b["type"],
                "ok": True,
                "error": "",
                "stacks": [],
                "slots": [
                    {"rank": 1},
                    "junk",
                    SlotEvidence(
                        host="h",
                        rank=0,
                        pid=1,
                        proc_start_us=2,
                        taken_wall=3.0,
                        taken_mono_ns=4,
                        created_wall_ns=5,
                        created_mono_ns=6,
                        header={"step": 7},
                    ).to_dict(),
                ],
            },
            {"id": "c-999", "type": "dump_stacks", "ok": True},
            {"id": a["id"], "type": a["type"], "ok": True, "from": "another host"},
        ],
        1.0,
    )
    assert [e.event for e in events] == [je.COMMAND_REFUSED, je.EVIDENCE, je.COMMAND_UNKNOWN_ACK]
    refused, evidence = events[:2]
    assert isinstance(refused, CommandRefusedRecord) and isinstance(evidence, EvidenceRecord)
    assert refused.reason == "expired"
    assert evidence.slots is not None and evidence.error is not None
    assert [s["rank"] for s in evidence.slots] == [0] and "2 malformed" in evidence.error
    assert d.acked("elsewhere", [{"id": b["id"], "ok": True}], 2.0)[0].event == je.COMMAND_UNKNOWN_ACK


# -- the coordinator with fake agents ----------------------------------------------------


class FakeAgents:
    """Stands between SimJob and the coordinator: verifies every command in a reply
    the way the agent does, and answers in that host's next report."""

    def __init__(self, coord, token=TOKEN, lose_first=0, silent=False, refuse="", lines=None):
        self.c, self.token, self.lose, self.silent, self.refuse = coord, token, lose_first, silent, refuse
        self.lines = lines or {}  # rank -> the line it is stuck at (default 212: waiting with the others)
        self.acks: dict[str, list[dict]] = {}
        self.seen: set[str] = set()
        self.commands: list[dict] = []

    @property
    def view(self):
        return self.c.view

    def tick(self, now, wall):
        return self.c.tick(now, wall)

    def accept(self, rep, now):
        rep = replace(rep, acks=tuple(self.acks.pop(rep.host, [])))
        reply = self.c.accept(rep, now)
        for cmd in reply["commands"]:
            self.commands.append(cmd)
            ok, why = commands.verify(
                cmd, self.token, rep.job, rep.host, rep.sent_wall + 0.01, self.seen, loopback=not self.token
            )
            assert ok, why
            self.seen.add(cmd["id"])
            if self.lose > 0:
                self.lose -= 1
                continue
            if self.silent:
                continue
            self.acks.setdefault(rep.host, []).append(self.answer(cmd, rep.host))
        return reply

    def answer(self, cmd, host):
        if self.refuse:
            return {"id": cmd["id"], "type": cmd["type"], "ok": False, "error": "refused", "refused": self.refuse}
        targets = cmd["args"]["ranks"]
        stacks = (
            [
                StackDump(
                    host=host,
                    rank=x["rank"],
                    pid=x["pid"],
                    ok=True,
                    text=f"Thread {x['pid']} (idle)\n    main (train.py:{self.lines.get(x['rank'], 212)})\n",
                ).to_dict()
                for x in targets
            ]
            if cmd["type"] == "dump_stacks"
            else []
        )
        slots = (
            [
                SlotEvidence(
                    host=host,
                    rank=x["rank"],
                    pid=x["pid"],
                    proc_start_us=x["proc_start_us"],
                    taken_wall=1.0,
                    taken_mono_ns=1,
                    created_wall_ns=0,
                    created_mono_ns=0,
                    header={"step": 40},
                    records=[[0, 1, 2, 3]],
                ).to_dict()
                for x in targets
            ]
            if cmd["type"] == "snapshot_slots"
            else []
        )
        return {"id": cmd["id"], "type": cmd["type"], "ok": True, "error": "", "stacks": stacks, "slots": slots}


@pytest.fixture
def make(tmp_path):
    made: list[Coordinator] = []

    def _make(**kw):
        path = str(tmp_path / f"journal{len(made)}.jsonl")
        c = Coordinator(
            Config(journal=path, job="job", world_size=8, tick_s=0.5, token=kw.pop("token", TOKEN), **kw),
            Journal(path, lambda: (1.7e9, 0.0)),
        )
        made.append(c)
        return c

    yield _make
    for c in made:
        c.journal.close()


def events(c, *names):
    return [r for r in journal.read(c.journal.path) if r["event"] in names]


def test_hang_evidence_follows_the_finding_once_from_every_host(make):
    c = make()
    agents = FakeAgents(c)
    sim = SimJob(seed=3)
    sim.hang(3, 40)
    sim.run_until(40.0, coordinator=agents, tick_s=0.5)
    recs = events(c, je.FINDING, je.COMMAND, je.EVIDENCE)
    kinds = [r["event"] for r in recs]
    assert kinds[0] == je.FINDING and recs[0]["kind"] == "collective_hang" and recs[0]["ranks"] == [3]
    assert (
        kinds.count(je.FINDING) == 1 and kinds.count(je.COMMAND) == 6 and kinds.count(je.EVIDENCE) == 6
    )  # never re-asked
    ev = {(r["host"], r["type"]): r for r in recs if r["event"] == je.EVIDENCE}
    assert sorted(ev) == [
        ("host0", "dump_flight_recorder"),
        ("host0", "dump_stacks"),
        ("host0", "snapshot_slots"),
        ("host1", "dump_flight_recorder"),
        ("host1", "dump_stacks"),
        ("host1", "snapshot_slots"),
    ]
    assert [s["rank"] for s in ev[("host0", "dump_stacks")]["stacks"]] == [0, 1, 2, 3]  # every rank at a hang
    assert [s["rank"] for s in ev[("host1", "dump_stacks")]["stacks"]] == [4, 5, 6, 7]
    assert sorted(s["rank"] for k, r in ev.items() if k[1] == "snapshot_slots" for s in r["slots"]) == list(range(8))
    assert all(r["trigger"] == {"kind": "collective_hang", "ranks": [3]} for r in ev.values())
    first_finding_t = recs[0]["t_mono"]
    assert all(r["t_mono"] >= first_finding_t for r in recs)
    assert (
        c.registry.get_sample_value("watchdog_coordinator_commands_total", {"type": "dump_stacks", "outcome": "done"})
        == 2
    )


def test_every_ranks_stack_is_grouped_into_one_small_record_naming_the_odd_ones_out(make):
    c = make(stacks_max_per_host=3)
    sim = SimJob(seed=3)
    sim.hang(3, 40)
    sim.run_until(40.0, coordinator=FakeAgents(c, lines={3: 220, 6: 190}), tick_s=0.5)
    [capped] = events(c, "stacks_capped")
    assert capped["max_per_host"] == 3 and capped["ranks_left_out"] == 2 and capped["hosts_capped"] == 2
    [rec] = events(c, je.STACK_GROUPS)
    assert rec["trigger"] == {"kind": "collective_hang", "ranks": [3]}
    assert rec["asked"] == 6 and rec["hosts_answered"] == 2 and rec["ranks"] == 6
    # The culprit always makes the cut; the cap drops the highest other ranks of each host.
    assert [(g["ranks"], g["brief"]) for g in rec["groups"]] == [
        ([[3, 3]], "main (train.py:220)"),
        ([[6, 6]], "main (train.py:190)"),
        ([[0, 1], [4, 5]], "main (train.py:212)"),
    ]
    assert rec["summary"].startswith("odd ones out: rank 3 in main (train.py:220); rank 6 in main (train.py:190)")
    assert rec["t_mono"] >= events(c, je.FINDING)[0]["t_mono"]
    [st] = c.status(40.0, 1.7e9 + 40)["findings"]  # watchdog status says it too, under the finding
    assert st["stacks"] == rec["summary"]
    from watchdog.coordinator.cli.status import render

    assert f"    stacks: {rec['summary']}" in render(c.status(40.0, 1.7e9 + 40)).splitlines()


def test_a_lost_reply_is_resent_and_a_silent_agent_given_up_on(make):
    c = make()
    agents = FakeAgents(c, lose_first=1)
    sim = SimJob(seed=3)
    sim.stop(3, 40)
    sim.run_until(40.0, coordinator=agents, tick_s=0.5)
    sent = events(c, je.COMMAND)
    assert max(r["attempt"] for r in sent) == 2  # the lost one went out again, under a new id
    assert len({r["id"] for r in sent}) == len(sent)
    assert events(c, je.EVIDENCE) and not events(c, je.COMMAND_EXPIRED)

    c2 = make(commands_give_up_s=10.0)
    sim2 = SimJob(seed=3)
    sim2.stop(3, 40)
    sim2.run_until(45.0, coordinator=FakeAgents(c2, silent=True), tick_s=0.5)
    expired = events(c2, je.COMMAND_EXPIRED)
    assert expired and all(len(r["ids"]) == 3 for r in expired)  # max attempts, then gave up
    assert not events(c2, je.EVIDENCE)


def test_refused_commands_are_journaled_and_counted(make):
    c = make()
    sim = SimJob(seed=3)
    sim.kill(3, 40, victims_die_after=0.15)
    sim.run_until(30.0, coordinator=FakeAgents(c, refuse="bad_signature"), tick_s=0.5)
    refs = events(c, je.COMMAND_REFUSED)
    assert refs and all(
        ref["reason"] == "bad_signature" and ref["type"] == "snapshot_slots" and ref["trigger"]["kind"] == "dead_rank"
        for ref in refs
    )
    assert c.registry.get_sample_value(
        "watchdog_coordinator_commands_total", {"type": "snapshot_slots", "outcome": "refused"}
    ) == len(refs)


def test_no_commands_without_a_token_off_loopback(make):
    c = make(token="", listen=("0.0.0.0", 0))
    agents = FakeAgents(c, token="")
    sim = SimJob(seed=3)
    sim.hang(3, 40)
    sim.run_until(30.0, coordinator=agents, tick_s=0.5)
    assert events(c, je.FINDING) and agents.commands == []

    c2 = make(token="")  # loopback: unsigned evidence commands, accepted by a token-less loopback agent
    agents2 = FakeAgents(c2, token="")
    sim2 = SimJob(seed=3)
    sim2.hang(3, 40)
    sim2.run_until(30.0, coordinator=agents2, tick_s=0.5)
    assert agents2.commands and all(cmd["sig"] == "" for cmd in agents2.commands)  # verified by FakeAgents
    assert events(c2, je.EVIDENCE)


def test_most_of_a_job_stopped_at_once_shares_one_context_and_keeps_lines_small(tmp_path):
    """Slurm suspends 11 of a job's 12 nodes (SIGSTOP to their ranks): one frozen_rank
    finding naming every stopped rank (they stopped together: a finding per rank was 88
    findings here and 16,384 at 16,384 ranks), then a hang naming all of them (the whole
    job stopped is the wedged verdict: test_a_whole_job_stopped_at_once_is_one_wedge). Every rank's stack,
    the others' snapshots and the Flight Recorder buffers are asked for once and
    shared; each finding still gets its own culprits' stacks; and no per-host line
    carries all 96 ranks (at 16,384 ranks: ~1 GB of journal, benchmarks/evidence_fanout.py)."""
    path = str(tmp_path / "journal.jsonl")
    c = Coordinator(
        Config(journal=path, job="job", world_size=96, tick_s=0.5, token=TOKEN), Journal(path, lambda: (1.7e9, 0.0))
    )
    sim = SimJob(seed=3, world_size=96, ranks_per_host=8)
    for r in range(88):  # host 11 (ranks 88-95) runs on, into the next all-reduce
        sim.stop(r, 40)
    sim.run_until(40.0, coordinator=FakeAgents(c), tick_s=0.5)
    frozen = [f for f in events(c, je.FINDING) if f["kind"] == "frozen_rank"]
    assert [f["ranks"] for f in frozen] == [list(range(88))] and "froze together" in frozen[0]["reason"]
    sent = events(c, je.COMMAND)
    asked: dict[int, int] = {}
    for cmd in sent:
        if cmd["type"] == "dump_stacks":
            for r in cmd["ranks"]:
                asked[r] = asked.get(r, 0) + 1
    # Once in the context, and ranks 0-7 once more: the frozen group's earliest and the hang's
    # culprits to confirm (up to 8 each). Each of 97 findings asked every rank before the context.
    assert set(asked) == set(range(96)) and max(asked.values()) <= 2
    # The context (3 types x 12 hosts), the hang's snapshots of its 96 culprits (12 hosts) and the
    # 8 stacks on host0. It was 3,140 when each finding asked for all, 241 with a finding per rank.
    assert len(sent) <= 3 * 12 + 12 + 1
    lines = sent + events(c, je.EVIDENCE)
    assert all(len(rec["trigger"]["ranks"]) <= triggers.MAX_RANKS for rec in lines)
    hang_lines = [rec for rec in lines if rec["trigger"]["kind"] == "collective_hang"]
    assert hang_lines and all(rec["trigger"]["ranks_total"] == 88 for rec in hang_lines)
    records = {(g["trigger"]["kind"], tuple(g["trigger"]["ranks"])): g for g in events(c, je.STACK_GROUPS)}
    for f in frozen:  # each finding's own stack, gathered from its brief-triggered answers
        assert records[("frozen_rank", tuple(f["ranks"]))]["ranks"] >= 1
    hang = records[("collective_hang", tuple(range(88)))]  # the full list, once
    assert hang["hosts_answered"] == hang["hosts_asked"] and hang["ranks"] == 8  # the culprits it wants confirmed
    from watchdog.timeline import load

    sets = [s for sec in load.load(path).sections for s in sec.stack_sets if s.trigger.get("kind") == "collective_hang"]
    assert len(sets) == 1 and sets[0].culprits == tuple(range(88)) and sets[0].label == "collective_hang ranks 0-87"


def test_a_whole_job_stopped_at_once_is_one_wedge_with_every_ranks_stack(tmp_path):
    """Every rank stopped in one instant: one wedged verdict naming no rank (analysis/wedge.py),
    every rank's stack asked for once, no finding against any rank."""
    path = str(tmp_path / "journal.jsonl")
    c = Coordinator(
        Config(journal=path, job="job", world_size=96, tick_s=0.5, token=TOKEN), Journal(path, lambda: (1.7e9, 0.0))
    )
    sim = SimJob(seed=3, world_size=96, ranks_per_host=8)
    for r in range(96):
        sim.stop(r, 40)
    sim.run_until(40.0, coordinator=FakeAgents(c), tick_s=0.5)
    found = events(c, je.FINDING)
    assert [(f["kind"], f["ranks"], len(f["hosts"])) for f in found] == [("wedged", [], 12)]
    assert "froze together" in found[0]["reason"] and "no rank is blamed" in found[0]["reason"]
    asked = [r for cmd in events(c, je.COMMAND) if cmd["type"] == "dump_stacks" for r in cmd["ranks"]]
    assert sorted(set(asked)) == list(range(96)) and len(events(c, je.COMMAND)) <= 3 * 12 + 12 + 1
    (group,) = [g for g in events(c, je.STACK_GROUPS) if g["trigger"]["kind"] == "wedged"]
    assert group["ranks"] == 96 and group["hosts_answered"] == group["hosts_asked"] == 12


def test_each_part_of_the_context_is_shared_only_with_findings_opened_soon_after(make):
    c = make()
    view = t.view(t.healthy(8), ranks_per_host=4)

    def asked(f, now):
        before = {id(p) for p in c.dispatch.pending()}
        c.evidence.collect([f], view, now)
        return sorted((p.req.type, p.req.host) for p in c.dispatch.pending() if id(p) not in before)

    snapshots = [("snapshot_slots", "host0"), ("snapshot_slots", "host1")]
    every = sorted(
        [(kind, h) for kind in ("dump_flight_recorder", "dump_stacks") for h in ("host0", "host1")] + snapshots
    )
    # A straggler asks for the others' snapshots; a frozen rank right after still needs every
    # rank's stack and Flight Recorder, not the snapshots again.
    assert asked(t.finding("straggler", [2]), 100.0) == snapshots
    assert asked(t.finding("frozen_rank", [1], wants=[1]), 101.0) == [
        ("dump_flight_recorder", "host0"),
        ("dump_flight_recorder", "host1"),
        ("dump_stacks", "host0"),
        ("dump_stacks", "host1"),
        ("snapshot_slots", "host0"),
    ]
    assert asked(t.finding("frozen_rank", [5], wants=[5]), 110.0) == [
        ("dump_stacks", "host1"),
        ("snapshot_slots", "host1"),
    ]
    assert asked(t.finding("frozen_rank", [6], wants=[6]), 101.0 + collect.CONTEXT_SHARED_S) == every
