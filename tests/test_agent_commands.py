"""The agent's command channel without real processes: refusals counted, acked and
logged; accepted commands run off the sender thread with a running ack first;
the outbox's delivery rules; target and identity checks; slot snapshots of real
files, a dead rank's included; metrics."""

from __future__ import annotations

import json
import threading

import pytest

from watchdog.agent import testing
from watchdog.agent.command_channel import handlers as act
from watchdog.agent.command_channel.inbox import CommandHandler
from watchdog.agent.command_channel.outbox import Outbox
from watchdog.agent.command_channel.stacks import StackDumper
from watchdog.agent.processes.table import ProcSample
from watchdog.agent.slotfiles import slot_states
from watchdog.agent.slotfiles.local_rank import LocalRank
from watchdog.contracts import commands as c
from watchdog.contracts import control_block
from watchdog.contracts import slot as wire
from watchdog.contracts.evidence import SlotEvidence, StackDump

TOKEN = "tok"
NOW = 1_800_000_000.0


class Log:
    def __init__(self):
        self.events = []

    def __getattr__(self, level):
        return lambda event, **kw: self.events.append((level, event, kw))

    def named(self, event):
        return [kw for _, e, kw in self.events if e == event]


def command(type=c.DUMP_STACKS, token=TOKEN, **over):
    args = {"ranks": [c.target(1, 4242, 7_000_000)]} if type != c.SIGNAL else {"signal": "SIGTERM"}
    d = c.make(
        job="job",
        type=type,
        host="node-a",
        args=args,
        issued_wall=NOW,
        ttl_s=30,
        target=c.target(1, 4242, 7_000_000) if type == c.SIGNAL else None,
    )
    d.update(over)
    return c.sign(d, token)


class FakeActions(act.Actions):  # the handler's actions, recorded instead of run
    def __init__(self, refusals=()):
        self.ran, self.threads, self.refusals = [], [], list(refusals)

    def run(self, cmd):
        self.ran.append(cmd["id"])
        self.threads.append(threading.current_thread().name)
        return act.ack(cmd, True, stacks=[{"rank": 1}]), self.refusals


def handler(actions=None, token=TOKEN, loopback=False, started=NOW - 1, **kw):
    """A handler (an agent) started at ``started``; it handles commands at NOW + 1."""
    log = Log()
    clock = [started]
    h = CommandHandler(
        host="node-a",
        token=token,
        loopback=loopback,
        actions=actions or FakeActions(),
        outbox=Outbox(),
        wall=lambda: clock[0],
        log=log,
        **kw,
    )
    clock[0] = NOW + 1
    return h, log


def test_a_command_issued_before_the_agent_started_is_a_replay_after_a_restart():
    """The ids seen live in memory: a restarted agent has forgotten them. Every
    command it may run answers one of its own reports, issued after it started."""
    fa = FakeActions()
    cmd = command(type=c.SIGNAL)
    first, _ = handler(fa)
    first("job", [cmd])
    assert first.wait_idle(5.0) and fa.ran == [cmd["id"]]
    restarted, log = handler(fa, started=NOW + 0.5)  # inside the command's 30 s expiry
    restarted("job", [cmd])
    assert restarted.wait_idle(5.0) and fa.ran == [cmd["id"]]  # not run again
    assert restarted.refused[c.REPLAYED] == 1 and log.named("command refused")[0]["reason"] == c.REPLAYED
    later = command(type=c.SIGNAL, issued_wall=NOW + 0.75, expires_wall=NOW + 30)
    restarted("job", [later])
    assert restarted.wait_idle(5.0) and fa.ran == [cmd["id"], later["id"]]


# -- handler -----------------------------------------------------------------------


def test_accepted_command_runs_on_the_worker_and_acks_running_then_result():
    fa = FakeActions()
    h, log = handler(fa)
    cmd = command()
    h("job", [cmd])
    assert h.wait_idle(5.0)
    assert fa.ran == [cmd["id"]] and fa.threads == ["watchdog-agent-commands"]
    acks = h.outbox.take("job")
    assert [(a["id"], a["ok"], "running" in a) for a in acks] == [(cmd["id"], True, False)]  # result replaced running
    assert h.executed[(c.DUMP_STACKS, "ok")] == 1
    assert [e for _, e, _ in log.events] == ["command received", "command done"]
    h.stop()


@pytest.mark.parametrize(
    "make_cmd,job,reason",
    [
        (lambda: {**command(), "sig": "ab" * 32}, "job", c.BAD_SIGNATURE),
        (lambda: {**command(), "sig": ""}, "job", c.UNSIGNED),
        (lambda: command(expires_wall=NOW - 1, issued_wall=NOW - 31), "job", c.EXPIRED),
        (lambda: command(), "other-job", c.FOREIGN_JOB),
        (lambda: command(host="node-b"), "job", c.WRONG_HOST),
        (lambda: "not a command", "job", c.MALFORMED),
    ],
)
def test_refused_commands_are_counted_logged_acked_and_never_run(make_cmd, job, reason):
    fa = FakeActions()
    h, log = handler(fa)
    h(job, [make_cmd()])
    assert fa.ran == [] and h._thread is None  # nothing started
    assert h.refused[reason] == 1 and sum(h.refused.values()) == 1
    assert [kw["reason"] for kw in log.named("command refused")] == [reason]
    acks = h.outbox.take(job)
    if reason == c.MALFORMED:
        assert acks == []  # no id to answer to
    else:
        assert [(a["ok"], a["refused"]) for a in acks] == [(False, reason)]


def test_replay_is_refused_and_not_run_twice():
    fa = FakeActions()
    h, _ = handler(fa)
    cmd = command()
    h("job", [cmd])
    h("job", [cmd])
    assert h.wait_idle(5.0)
    assert fa.ran == [cmd["id"]] and h.refused[c.REPLAYED] == 1
    assert len(h.outbox.take("job")) == 1  # the replay is not acked again
    h.stop()


def test_no_token_runs_evidence_only_from_loopback_and_never_signals():
    fa = FakeActions()
    h, _ = handler(fa, token="", loopback=True)
    h("job", [command(token=""), command(c.SIGNAL, token="")])
    assert h.wait_idle(5.0)
    assert len(fa.ran) == 1 and h.refused[c.NO_TOKEN] == 1
    h.stop()
    h2, _ = handler(FakeActions(), token="", loopback=False)
    h2("job", [command(token="")])
    assert h2.refused[c.NO_TOKEN] == 1


def test_execution_time_refusals_are_counted():
    h, _log = handler(FakeActions(refusals=[c.WRONG_IDENTITY]))
    h("job", [command()])
    assert h.wait_idle(5.0)
    assert h.refused[c.WRONG_IDENTITY] == 1
    h.stop()


def test_a_crashing_action_is_an_ack_not_a_dead_worker():
    class Boom:
        calls = 0

        def run(self, cmd):
            Boom.calls += 1
            raise RuntimeError("bug")

    h, _log = handler(Boom())
    h("job", [command(), command()])
    assert h.wait_idle(5.0)
    assert Boom.calls == 2
    assert [a["error"] for a in h.outbox.take("job")] == ["agent error: RuntimeError: bug"] * 2
    assert h.executed[(c.DUMP_STACKS, "failed")] == 2
    h.stop()


def test_full_queue_fails_the_command_instead_of_blocking_the_sender():
    gate = threading.Event()

    class Slow(FakeActions):
        def run(self, cmd):
            gate.wait(5)
            return super().run(cmd)

    h, _ = handler(Slow(), queue_max=1)
    cmds = [command() for _ in range(4)]
    h("job", cmds)  # returns at once: one running, one queued, two refused as busy
    busy = [a for a in h.outbox.take("job") if a.get("error", "").startswith("agent busy")]
    assert len(busy) >= 1
    gate.set()
    assert h.wait_idle(5.0)
    h.stop()


# -- outbox ------------------------------------------------------------------------


def test_outbox_keeps_acks_until_delivered_and_a_replaced_ack_survives_a_delivery():
    ob = Outbox()
    running = {"id": "a", "type": "dump_stacks", "running": True}
    ob.put("job", running)
    taken = ob.take("job")
    ob.put("job", {"id": "a", "type": "dump_stacks", "ok": True})  # the result lands during the send
    ob.delivered("job", taken)
    assert [a.get("ok") for a in ob.take("job")] == [True]
    ob.delivered("job", ob.take("job"))
    assert ob.take("job") == [] and ob.pending() == 0


def test_outbox_respects_the_byte_budget_but_always_carries_one():
    ob = Outbox(budget_bytes=1000)
    for i in range(3):
        ob.put("job", {"id": str(i), "blob": "x" * 600})
    assert [a["id"] for a in ob.take("job")] == ["0"]
    ob.delivered("job", ob.take("job"))
    assert [a["id"] for a in ob.take("job")] == ["1"]
    assert ob.take("other") == []


def test_outbox_is_bounded():
    log = Log()
    ob = Outbox(max_per_job=2, log=log)
    for i in range(3):
        ob.put("job", {"id": str(i)})
    assert [a["id"] for a in ob.take("job")] == ["1", "2"] and ob.dropped == 1
    assert log.named("command ack dropped")


# -- actions -----------------------------------------------------------------------


def view_of(path, ident, alive=True, launcher=(0, 0)):
    snap = wire.read_slot(path) if path else testing.snapshot(ident)
    return LocalRank(
        path,
        snap.header,
        0,
        False,
        ProcSample(alive, "running" if alive else "gone"),
        slot_states.ALIVE if alive else slot_states.DEAD,
        0.0,
        (),
        launcher,
        0,
        snap.uid,
        snap.inode,
    )


class Dumper(StackDumper):  # dumps recorded, py-spy never run
    def __init__(self):
        self.pids = []

    def dump(self, host, rank, pid, timeout_s=None):
        self.pids.append(pid)
        return StackDump(host=host, rank=rank, pid=pid, ok=True, text="Thread 1\n    main (train.py:10)\n")


def actions_for(views, start_us, dumper=None, **kw):
    kw.setdefault("pin", testing.NoPin)  # fake pids: nothing to pin
    return act.Actions(
        "node-a",
        lambda job: tuple(v for v in views if v.identity.job == job),
        dumper or Dumper(),
        start_us=start_us,
        wall=lambda: NOW,
        mono_ns=lambda: 5_000_000_000,
        **kw,
    )


def test_dump_refuses_a_reused_pid_and_skips_a_gone_one(tmp_path):
    idents = [testing.identity("job", r, 3, pid=100 + r, proc_start_us=7_000_000) for r in range(3)]
    views = [view_of("", i) for i in idents]
    starts = {100: 7_000_000, 101: 99_000_000, 102: None}  # 101 reused, 102 gone
    d = Dumper()
    a = actions_for(views, starts.get, d)
    cmd = command(args={"ranks": [c.target(r, 100 + r, 7_000_000) for r in range(3)] + [c.target(5, 999, 1)]})
    out, refusals = a.run(cmd)
    assert d.pids == [100]  # only the process that still is the rank
    by_rank = {s["rank"]: s for s in out["stacks"]}
    assert by_rank[0]["ok"] and "main" in by_rank[0]["text"]
    assert "wrong_identity" in by_rank[1]["error"] and "another process" in by_rank[1]["error"]
    assert "gone" in by_rank[2]["error"]
    assert "unknown_target" in by_rank[5]["error"]
    assert sorted(refusals) == [c.UNKNOWN_TARGET, c.WRONG_IDENTITY]
    assert out["ok"] is True and "rank 1:" in out["error"]
    assert out["bound"]["late"] == [] and out["bound"]["parallel"] == 8  # the host's bound travels with the ack
    [StackDump.from_dict(s) for s in out["stacks"]]  # the evidence format reads them back


def test_snapshot_reads_a_dead_ranks_file_and_the_current_slot(tmp_path):
    live = testing.RankSlot(str(tmp_path), testing.identity("job", 0, 2, pid=300, proc_start_us=1))
    dead = testing.RankSlot(str(tmp_path), testing.identity("job", 1, 2, pid=301, proc_start_us=2))
    for wr, n in ((live, 5), (dead, 3)):
        for s in range(n):
            wr.step(100_000_000, 10_000_000, 20_000_000, now_ns=(s + 1) * 1_000_000_000)
    views = [
        view_of(live.path, live_id := wire.read_slot(live.path).header.identity),
        view_of(dead.path, wire.read_slot(dead.path).header.identity, alive=False),
    ]
    a = actions_for(views, lambda pid: None)
    out = a.snapshot_slots(command(c.SNAPSHOT_SLOTS, args={"ranks": [c.target(0, 0, 0), c.target(1, 301, 2)]}))
    assert out["ok"] and out["error"] == ""
    slots = [SlotEvidence.from_dict(s) for s in out["slots"]]
    assert [(s.rank, s.pid) for s in slots] == [(0, live_id.pid), (1, 301)]
    steps = [[r for r in s.records if r[1] == int(wire.RecordKind.STEP_END)] for s in slots]
    assert [len(x) for x in steps] == [5, 3]
    assert slots[0].header["step"] == 5 and slots[0].taken_wall == NOW
    missing = a.snapshot_slots(command(c.SNAPSHOT_SLOTS, args={"ranks": [c.target(1, 999, 2)]}))
    assert not missing["ok"] and "no slot" in missing["error"]
    live.close()
    dead.close()


def test_snapshot_is_trimmed_to_fit_a_report(tmp_path):
    wr = testing.RankSlot(str(tmp_path), testing.identity("job", 0, 1, pid=300, proc_start_us=1), ring_capacity=512)
    for s in range(600):
        wr.step(1, now_ns=s + 1)
    views = [view_of(wr.path, wire.read_slot(wr.path).header.identity)]
    out = actions_for(views, lambda pid: None, max_records=400).snapshot_slots(
        command(c.SNAPSHOT_SLOTS, args={"ranks": [c.target(0, 0, 0)]})
    )
    ev = SlotEvidence.from_dict(out["slots"][0])
    assert len(ev.records) == 400 and ev.records_dropped == 112 and ev.records[-1][0] == 599  # newest kept
    tight = actions_for(views, lambda pid: None, max_ack_bytes=8_000).snapshot_slots(
        command(c.SNAPSHOT_SLOTS, args={"ranks": [c.target(0, 0, 0)]})
    )
    ev = SlotEvidence.from_dict(tight["slots"][0])
    assert 0 < len(ev.records) < 256 and ev.records[-1][0] == 599
    assert len(json.dumps(tight["slots"], separators=(",", ":"))) <= 8_000
    wr.close()


def test_signal_only_reaches_a_rank_or_its_parent_with_a_matching_identity():
    ident = testing.identity("job", 1, 2, pid=4242, proc_start_us=7_000_000)
    views = [view_of("", ident, launcher=(4000, 5))]  # the launcher recorded when the rank registered
    sent = []

    def send(pid, signum, check):
        ok, why = check()
        if ok:
            sent.append((pid, signum))
        return ok, why

    a = actions_for(views, {4242: 7_000_000, 4000: 5}.get, send_signal=send)
    out, refusals = a.run(command(c.SIGNAL))
    assert out["ok"] and sent == [(4242, 15)] and refusals == []
    out, refusals = a.run(command(c.SIGNAL, target=c.target(-1, 4000, 5)))  # the launcher
    assert out["ok"] and sent[-1] == (4000, 15)
    out, refusals = a.run(command(c.SIGNAL, target=c.target(-1, 1, 0)))  # init: not ours
    assert not out["ok"] and out["refused"] == c.UNKNOWN_TARGET and refusals == [c.UNKNOWN_TARGET]
    reused = actions_for(views, {4242: 9_999_999_999}.get, send_signal=send)
    out, refusals = reused.run(command(c.SIGNAL))
    assert not out["ok"] and out["refused"] == c.WRONG_IDENTITY and refusals == [c.WRONG_IDENTITY]
    assert len(sent) == 2


def test_metrics_export_refusals_and_executions(tmp_path):
    from prometheus_client import CollectorRegistry

    from watchdog.agent.export.agentmetrics import AgentCollector, LoopStats
    from watchdog.agent.export.exporter import Exporter
    from watchdog.agent.slotfiles.tracker import SlotTracker

    h, _ = handler(FakeActions())
    h("job", [command(host="elsewhere"), command()])
    assert h.wait_idle(5.0)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(Exporter((AgentCollector(SlotTracker(str(tmp_path)), LoopStats(), commands=h),)))
    get = reg.get_sample_value
    assert get("watchdog_agent_commands_refused_total", {"reason": "wrong_host"}) == 1
    assert get("watchdog_agent_commands_refused_total", {"reason": "bad_signature"}) == 0
    assert get("watchdog_agent_commands_executed_total", {"type": "dump_stacks", "result": "ok"}) == 1
    h.stop()


def test_checkpoint_writes_the_request_into_each_ranks_slot_after_an_identity_check(tmp_path):
    wrs = [testing.RankSlot(str(tmp_path), testing.identity("job", r, 2, pid=500 + r, proc_start_us=9)) for r in (0, 1)]
    views = [view_of(w.path, wire.read_slot(w.path).header.identity) for w in wrs]
    a = actions_for(views, {500: 9, 501: 99_999_999}.get)  # rank 1's pid was reused
    cmd = command(c.CHECKPOINT, args={"step": 140, "ranks": [c.target(0, 500, 9), c.target(1, 501, 9)]})
    assert c.verify(cmd, TOKEN, "job", "node-a", NOW, set())[0]
    out, refusals = a.run(cmd)
    assert out["ranks"] == [0] and not out["ok"] and "rank 1:" in out["error"] and refusals == []
    req = control_block.read_request(wire.read_slot(wrs[0].path).header.words, 0)
    assert req is not None
    assert (req.command, req.arg) == (int(wire.Command.CHECKPOINT_AT_STEP), 140)
    assert wire.read_slot(wrs[1].path).header.words[wire.H_CTRL_SEQ] == 0  # untouched
    for w in wrs:
        w.close()


def test_checkpoint_is_never_run_unsigned_and_malformed_steps_are_refused():
    ok = command(c.CHECKPOINT, args={"step": 5, "ranks": [c.target(1, 4242, 7_000_000)]})
    assert c.verify(c.sign(ok, ""), "", "job", "node-a", NOW, set(), loopback=True) == (False, c.NO_TOKEN)
    for bad in ({"step": -1}, {"step": 1.5}, {"step": True}, {"step": 5, "ranks": []}):
        cmd = command(c.CHECKPOINT, args={"ranks": [c.target(1, 4242, 7_000_000)], **bad})
        assert c.verify(cmd, TOKEN, "job", "node-a", NOW, set()) == (False, c.MALFORMED), bad
