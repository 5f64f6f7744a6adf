"""Sender: one report per job per interval, failures counted and rate-limited,
step records re-sent after a failure, commands handed to the seam; and one real
POST to a loopback HTTP server."""

import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from watchdog import jobtoken
from watchdog import report as wire_report
from watchdog.agent import testing
from watchdog.agent.export.agentmetrics import AgentCollector, LoopStats
from watchdog.agent.processes.table import ProcSample
from watchdog.agent.reporting.sender import HttpRefused, JsonPoster, Sender
from watchdog.agent.slotfiles import slot_states
from watchdog.agent.slotfiles.local_rank import LocalRank
from watchdog.agent.slotfiles.tracker import SlotTracker
from watchdog.contracts import slot as wire
from watchdog.coordinator.config import DetectorConfig
from watchdog.stepstats.steps import StepStats, add_samples

S = 1_000_000_000


def view(job, rank, records=()):
    ident = testing.identity(job, rank, 2, pid=100 + rank, proc_start_us=1)
    snap = testing.snapshot(ident, path=f"/run/{job}.{rank}.slot")
    return LocalRank(
        snap.path, snap.header, 0, False, ProcSample(True, "running"), slot_states.ALIVE, 0.0, tuple(records)
    )


class Log:
    def __init__(self):
        self.events = []

    def __getattr__(self, level):
        return lambda event, **kw: self.events.append((level, event, kw))


def make(views, post, job="", handled=None, **kw):
    def as_json(url, payload, token, timeout):  # what the coordinator would receive
        return post(url, json.loads(json.dumps(payload)), token, timeout)

    return Sender(
        url="http://coord:1",
        token="tok",
        job=job,
        host="h",
        agent_id="a1",
        interval_s=1.0,
        timeout_s=2.0,
        views=lambda: views,
        post=as_json,
        log=kw.pop("log", Log()),
        handle_commands=((lambda job, c: handled.extend(c)) if handled is not None else lambda job, c: None),
        mono_ns=kw.pop("mono_ns", lambda: 10 * S),
        wall=lambda: 1.8e9,
        **kw,
    )


def scripted(replies, sent):
    """A post that keeps each payload in ``sent`` and answers with the next of
    ``replies``, raising the ones that are exceptions."""

    def post(url, payload, token, timeout):
        sent.append(payload)
        r = replies.pop(0)
        if isinstance(r, Exception):
            raise r
        return r

    return post


def keeps(sent):
    """A post that keeps each payload in ``sent`` and answers ok."""

    def post(url, payload, token, timeout):
        sent.append(payload)
        return {"ok": True}

    return post


def test_one_report_per_job_with_token_and_commands():
    sent: list[tuple] = []
    handled: list[dict] = []

    def post(url, payload, token, timeout):
        sent.append((url, payload, token, timeout))
        return {"ok": True, "commands": [{"kind": "stacks"}] if payload["job"] == "b" else []}

    s = make([view("a", 0), view("a", 1), view("b", 0)], post, handled=handled)
    s.send_once()
    assert [(p["job"], len(p["ranks"]), p["seq"]) for _, p, _, _ in sent] == [("a", 2, 1), ("b", 1, 1)]
    assert {(u, t, to) for u, _, t, to in sent} == {("http://coord:1/api/v1/report", "tok", 2.0)}
    assert handled == [{"kind": "stacks"}] and s.commands_received == 1 and s.last_commands == handled
    assert (s.ok, s.failed) == (2, 0)
    wire_report.HostReport.from_dict(sent[0][1])  # the coordinator's parser accepts it


def test_job_filter_sends_even_with_no_ranks():
    sent: list[dict] = []
    s = make([], keeps(sent), job="j")
    s.send_once()
    assert [(p["job"], p["ranks"]) for p in sent] == [("j", [])]  # the coordinator still hears the host


def test_failures_are_counted_logged_rate_limited_and_steps_kept():
    recs = [testing.step_record(i, i + 1, S // 10) for i in range(3)]
    replies = [ConnectionRefusedError("refused"), {"ok": False, "error": "bad token"}, {"ok": True}, {"ok": True}]
    sent: list[dict] = []
    post = scripted(replies, sent)

    log = Log()
    s = make([view("j", 0, recs)], post, log=log)
    for _ in range(4):
        s.send_once()
    assert (s.ok, s.failed) == (2, 2)
    assert [len(p["ranks"][0]["recent_steps"]) for p in sent] == [3, 3, 3, 0]  # delivered once, then not again
    assert [p["seq"] for p in sent] == [1, 2, 3, 4]
    assert [e for _, e, _ in log.events] == ["report failed", "reports resumed"]  # 2nd failure rate-limited


def test_a_real_post_to_a_loopback_server():
    got: dict[str, Any] = {}  # what the server saw, one entry per part of the request

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like the coordinator

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.setdefault("ports", set()).add(self.client_address[1])
            got.update(path=self.path, auth=self.headers["Authorization"], body=json.loads(body))
            out = json.dumps({"ok": True, "commands": []}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            got["n"] = got.get("n", 0) + 1
            if got["n"] == 2:  # drop the idle connection without saying so, as servers do on a timeout
                self.close_connection = True

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        poster = JsonPoster()
        s = Sender(
            url=url,
            token="tok",
            job="",
            host="h",
            agent_id="a",
            interval_s=1.0,
            timeout_s=2.0,
            views=lambda: [view("j", 0)],
            post=poster,
            log=Log(),
        )
        s.send_once()
        s.send_once()
        assert s.ok == 2 and got["path"] == "/api/v1/report" and got["auth"] == f"Bearer {jobtoken.bearer('tok')}"
        assert got["body"]["ranks"][0]["rank"] == 0
        assert len(got["ports"]) == 1  # one kept-alive connection for both reports
        s.send_once()  # the server dropped the connection: retried once on a new one
        assert s.ok == 3 and s.failed == 0 and len(got["ports"]) == 2
        poster.close()
    finally:
        srv.shutdown()
        srv.server_close()


def test_http_errors_and_dead_coordinators_are_failures_not_crashes():
    log = Log()
    s = Sender(
        url="http://127.0.0.1:9",
        token="",
        job="",
        host="h",
        agent_id="a",
        interval_s=1.0,
        timeout_s=0.5,
        views=lambda: [view("j", 0)],
        log=log,
    )
    s.send_once()
    assert s.failed == 1 and log.events[0][1] == "report failed"


def test_thread_is_named_daemon_and_stops():
    s = make([], lambda *a: {"ok": True}, job="j")
    s.start()
    assert s._thread.name == "watchdog-agent-sender" and s._thread.daemon
    s.stop(timeout_s=3)
    assert not s._thread.is_alive()


def test_plain_is_asdict_for_json():
    from watchdog.agent.reporting.build import build_report
    from watchdog.agent.reporting.sender import plain

    recs = [testing.step_record(i, i + 1, S // 10, S // 100, S // 50) for i in range(5)]
    rep = build_report(
        "j",
        "h",
        "a",
        3,
        [view("j", 0, recs), view("j", 1)],
        10 * S,
        1.8e9,
        1.0,
        accelerators=[{"index": 0, "pids": (1, 2)}],
    )
    assert json.dumps(plain(rep)) == json.dumps(rep.to_dict())


def test_a_rank_with_out_of_range_slot_values_is_dropped_the_rest_sent():
    """One corrupt or forged slot (a negative step, a world size beyond any job)
    must cost its own rank, not the host's whole report (the coordinator would
    refuse it, then call the host lost and its healthy ranks dead)."""
    sent, log = [], Log()
    bad_ident = testing.identity("a", 1, 2, pid=101, proc_start_us=1)
    snap = testing.snapshot(bad_ident, {wire.H_STEP: -7}, path="/run/a.1.slot")
    bad = LocalRank(snap.path, snap.header, 0, False, ProcSample(True, "running"), slot_states.ALIVE, 0.0, ())

    def post(url, payload, token, timeout):
        sent.append(payload)
        return {"ok": True}

    s = make([view("a", 0), bad], post, log=log)
    s.send_once()
    assert [r["rank"] for r in sent[0]["ranks"]] == [0] and s.ranks_dropped == 1
    (ev,) = [e for e in log.events if e[1] == "rank dropped from report"]
    assert ev[2]["rank"] == 1 and ev[2]["path"] == "/run/a.1.slot" and "step" in ev[2]["reason"]


def test_back_pressure_advice_slows_reports_and_is_bounded():
    sent = []
    advice = [None, 2.0, 1e6, "x", None]

    def post(url, payload, token, timeout):
        sent.append(payload["interval_s"])
        val = advice[len(sent) - 1]
        return {"ok": True, "commands": [], **({} if val is None else {"report_interval_s": val})}

    s = make([view("a", 0)], post)
    for _ in advice:
        s.send_once()
    # Each report states the interval in effect when it was sent, so the coordinator's
    # silence limit (in intervals) grows with it: a slowed agent is not a lost host.
    assert sent == [1.0, 1.0, 2.0, 10.0, 1.0]
    assert s.interval_s == 1.0  # advice withdrawn (absent), or malformed: our own interval


def test_a_death_torchrun_replaced_between_two_reports_is_reported_once_before_the_successor():
    # Seen in CI: rank 1 SIGKILLed, torchrun restarted the group 0.5 s later, and the
    # coordinator (told to report every 2 s) only ever saw the new processes: no dead_rank.
    import dataclasses

    old = dataclasses.replace(view("j", 1), proc=ProcSample(False, "gone"), state=slot_states.DEAD, path="/run/j.1.old")
    new = view("j", 1)
    sent, ok = [], [False]

    def post(url, payload, token, timeout):
        sent.append({r["rank"]: (r["pid"], r["alive"]) for r in payload["ranks"]})
        return {"ok": True} if ok[0] else {"ok": False}

    s = make([view("j", 0), new], post, job="j", replaced_deaths=lambda: [old])
    s.send_once()  # the coordinator refuses it: the death is still untold
    ok[0] = True
    s.send_once()
    s.send_once()
    assert sent == [{0: (100, True), 1: (101, False)}] * 2 + [{0: (100, True), 1: (101, True)}]


class _VirtualTime:
    """The sender's clock and its stop event's wait, on one virtual clock: waiting advances it."""

    def __init__(self):
        self.ns = 0

    def mono(self):
        return self.ns

    def wait(self, s):
        self.ns += int(s * S)
        return False

    def is_set(self):
        return False


def test_a_slowed_agent_reports_a_death_at_its_own_pace():
    # Told to report every 10 s by a busy coordinator, an agent whose rank dies
    # reports it within its own interval (1 s), not up to 10 s later.
    import dataclasses

    t = _VirtualTime()
    ranks = [view("j", 0), view("j", 1)]
    s = make(ranks, lambda *a: {"ok": True, "report_interval_s": 10.0}, job="j", mono_ns=t.mono)
    s._stop = t
    s.send_once()
    assert s.interval_s == 10.0
    assert s._sleep_until(10 * S) == 10 * S  # nothing happened: the advised pace holds
    ranks[1] = dataclasses.replace(ranks[1], proc=ProcSample(False, "gone"), state=slot_states.DEAD)
    t.ns = 10 * S
    assert s._sleep_until(20 * S) == 11 * S  # the death goes after one own interval
    s.send_once()
    t.ns = 20 * S
    assert s._sleep_until(30 * S) == 30 * S  # told once: back to the advised pace


def test_an_agent_not_slowed_keeps_its_own_pace():
    t = _VirtualTime()
    s = make([view("j", 0)], lambda *a: {"ok": True}, job="j", mono_ns=t.mono)
    s._stop = t
    s.send_once()
    assert s._sleep_until(3 * S) == 3 * S


def test_report_version_2_only_after_a_reply_that_says_it_is_read():
    """The first report is version 1; a reply listing 2 in report_versions makes
    the next version 2 (the same report to the coordinator's parser); a reply
    without it (an older coordinator), with odd values, or a refusal as unreadable
    (400) goes back to version 1; a send that failed otherwise (refused connection,
    busy, timed out: an overloaded coordinator) keeps version 2."""
    recs = [testing.step_record(i, i + 1, S // 10) for i in range(3)]
    sent = []
    replies = [
        {"ok": True, "report_versions": [1, 2]},
        {"ok": True, "report_versions": [1, 2]},
        {"ok": True},  # an older coordinator now (restarted as one)
        {"ok": True, "report_versions": [1, 2]},
        ConnectionRefusedError("refused"),
        HttpRefused(503, "HTTP 503: busy"),
        HttpRefused(400, "HTTP 400: schema"),  # an older coordinator cannot read version 2
        {"ok": True, "report_versions": [1, 2]},
        {"ok": True, "report_versions": ["2", 2.0, True, None]},  # none of them is version 2
        {"ok": True, "report_versions": 2},
        {"ok": True, "report_versions": [2]},
    ]

    def post(url, payload, token, timeout):
        sent.append(payload)
        reply = replies[len(sent) - 1]
        if isinstance(reply, Exception):
            raise reply
        return reply

    s = make([view("a", 0, recs), view("a", 1)], post, job="a")
    for _ in replies:
        s.send_once()
    assert [p["v"] for p in sent] == [1, 2, 2, 1, 2, 2, 2, 1, 2, 1, 1]
    assert s.report_version == 2
    v1, v2 = sent[0], sent[1]
    assert v2["rank_fields"] == list(wire_report.RANK_FIELDS) and all(type(r) is list for r in v2["ranks"])
    first = wire_report.HostReport.from_dict(v1)
    second = wire_report.HostReport.from_dict(v2)
    assert first.ranks[0].recent_steps  # the steps, sent once (then marked delivered)
    same = [dataclasses.replace(r, recent_steps=()) for r in first.ranks]
    assert second == dataclasses.replace(first, seq=2, ranks=tuple(same))  # the same content, as rows
    assert s.failed == 3 and s.ok == 8


def test_step_summaries_follow_the_reports_the_coordinator_accepted():
    settings = [2, 256, 50, 20, 4]
    cfg = DetectorConfig(**dict(zip(("warmup_steps", "history_steps", "starvation_window_steps"), settings)))
    recs = [testing.step_record(i, i + 1, (i % 3 + 1) * S // 10, data_ns=S // 100) for i in range(30)]
    views = [view("j", 0, recs[:4])]
    replies: list[object] = [
        {"ok": True, "step_summary_config": settings},
        {"ok": True, "step_summary_config": settings},
    ]
    replies += [ConnectionRefusedError("refused"), {"ok": True, "step_summary_config": settings}]
    sent: list[dict] = []
    post = scripted(replies, sent)

    s = make(views, post)
    for upto in (4, 10, 20, 30):
        views[0] = view("j", 0, recs[:upto])
        s.send_once()
    summaries = [p["ranks"][0]["step_summary"] for p in sent]
    assert summaries[0] == []  # no reply has given the settings yet
    assert [p["step_summary_config"] for p in sent] == [[], settings, settings, settings]
    # The samples of the accepted reports (1, 2 and 4: the failed one's came again), summarised.
    samples = [slot_states.step_sample(r) for r in recs]
    want = add_samples(
        add_samples(add_samples(StepStats(), tuple(samples[:4]), cfg), tuple(samples[4:10]), cfg),
        tuple(samples[10:]),
        cfg,
    )
    assert summaries[3][:5] == [
        30.0,
        want.p99_step_s,
        float(want.train_steps),
        want.data_share,
        float(want.windows_scanned),
    ]
    assert summaries[3][5::5] == [
        0.0
    ]  # window 0 (steps 1-19, the 20-step window before step 20's) closed once, in report 4
    assert summaries[2][5:] == [0.0, *summaries[3][6:10]]  # ...though the failed report 3 had carried it too
    wire_report.HostReport.from_dict(sent[3])  # the coordinator's parser accepts it


def test_a_summary_out_of_range_is_left_out_counted_and_exported(tmp_path):
    # Step numbers past 2^53 (a slot's int64 counter allows them, the rank's checks too)
    # are not exact as the summary's doubles: the rank goes without one, and the
    # coordinator computes its statistics from the samples.
    settings = [2, 128, 50, 20, 4]
    big = 1 << 60
    recs = [testing.step_record(i, big + i, S // 10) for i in range(12)]
    views = [view("j", 0, recs[:6]), view("j", 1, plain_steps(6))]
    sent: list[dict] = []
    s = make(views, scripted([{"ok": True, "step_summary_config": settings}] * 2, sent))
    s.send_once()
    views[0], views[1] = view("j", 0, recs), view("j", 1, plain_steps(12))
    s.send_once()
    ranks = {r["rank"]: r for r in sent[1]["ranks"]}
    assert ranks[0]["step_summary"] == [] and ranks[0]["recent_steps"]  # the samples still go
    assert len(ranks[1]["step_summary"]) == 5  # the other rank keeps its summary
    assert s.summaries.omitted == 1
    wire_report.HostReport.from_dict(sent[1])  # the coordinator's parser takes the rank
    exported = generate_latest(registry_of(AgentCollector(SlotTracker(str(tmp_path)), LoopStats(), sender=s)))
    assert b"watchdog_agent_step_summaries_omitted_total 1.0" in exported


def plain_steps(n):
    return [testing.step_record(i, i + 1, S // 10) for i in range(n)]


def registry_of(collector):
    reg = CollectorRegistry()
    reg.register(collector)
    return reg


def test_step_samples_every_few_seconds_when_asked_liveness_in_every_report_none_lost():
    # A coordinator at hundreds of reports a second asks for step samples every 4 s:
    # reports still go every second with each rank's step and heartbeat, and the
    # samples held back meanwhile all come in the next report that carries them.
    t = _VirtualTime()
    views = [view("j", 0)]
    sent = []
    settings = [2, 128, 50, 20, 4]

    def post(url, payload, token, timeout):
        sent.append(payload)
        return {"ok": True, "steps_interval_s": 4.0, "step_summary_config": settings}

    s = make(views, post, job="j", mono_ns=t.mono, rand=lambda: 1.0)  # first batch a full interval on
    for second in range(9):
        t.ns = second * S
        views[0] = view("j", 0, [testing.step_record(i, i + 1, S // 4) for i in range(4 * second + 4)])
        s.send_once()
    carried = [[x["step"] for x in p["ranks"][0]["recent_steps"]] for p in sent]
    assert [len(c) for c in carried] == [4, 0, 0, 0, 16, 0, 0, 0, 16]  # every 4th report after the first
    assert [s for c in carried for s in c] == list(range(1, 37))  # every sample once, in order
    # (the first report goes before any reply gave summary settings)
    assert [p["ranks"][0]["step_summary"] != [] for p in sent[1:]] == [c != [] for c in carried[1:]]
    assert [p["ranks"][0]["step"] for p in sent] == [0] * 9  # the hook's header: here unchanged, sent every time
    assert s.reports_without_steps == 6


def test_held_step_samples_go_at_once_on_a_death_a_failure_or_too_many_waiting():
    import dataclasses

    t = _VirtualTime()
    recs = [testing.step_record(i, i + 1, S // 4) for i in range(8)]
    views = [view("j", 0, recs[:4]), view("j", 1, recs[:4])]
    sent: list[int] = []
    replies: list[object] = []

    def post(url, payload, token, timeout):
        sent.append(len(payload["ranks"][0]["recent_steps"]))
        r = replies.pop(0) if replies else {"ok": True, "steps_interval_s": 4.0}
        if isinstance(r, Exception):
            raise r
        return r

    s = make(views, post, job="j", mono_ns=t.mono, rand=lambda: 1.0)  # first batch a full interval on
    s.send_once()  # samples 1-4 delivered; the advice arrives with its reply
    t.ns = 1 * S
    views[0] = view("j", 0, recs)
    s.send_once()  # held
    t.ns = 2 * S
    views[1] = dataclasses.replace(view("j", 1, recs), proc=ProcSample(False, "gone"), state=slot_states.DEAD)
    s.send_once()  # a rank died: the samples go now
    t.ns = 3 * S  # still dead, nothing of it waiting: no reason to send rank 0's new sample yet
    replies.append(ConnectionRefusedError("down"))
    views[0] = view("j", 0, recs + [testing.step_record(8, 9, S // 4)])
    s.send_once()  # held, and failed anyway
    t.ns = 6 * S
    replies.append(ConnectionRefusedError("down"))
    s.send_once()  # due (4 s since the last delivered), failed: the samples stay unreported
    t.ns = 7 * S
    s.send_once()  # so the next report carries them again
    assert sent == [4, 0, 4, 0, 1, 1]
    many = [testing.step_record(i, i + 1, S // 100) for i in range(9, 9 + 129)]
    views[0] = view("j", 0, recs + many)
    t.ns = 8 * S
    s.send_once()  # more than half a report's cap (256) waiting: sent at once
    assert sent[-1] == 129


def test_step_interval_advice_is_bounded_and_ignored_when_malformed():
    sent: list[dict] = []
    advice = [None, 4.0, 1e6, "x", True, -1.0]

    def post(url, payload, token, timeout):
        val = advice[len(sent)]
        sent.append(payload)
        return {"ok": True, **({} if val is None else {"steps_interval_s": val})}

    s = make([view("a", 0)], post)
    got = []
    for _ in advice:
        s.send_once()
        got.append(s.steps_interval_s)
    assert got == [0.0, 4.0, 10.0, 0.0, 0.0, 0.0]


def test_agents_given_the_advice_together_send_their_batches_in_different_seconds():
    # Every agent gets the advice in the same second; were their batches in step, the
    # coordinator would take all the job's samples in one second of every four.
    t = _VirtualTime()
    seconds = {}
    for u in (0.2, 0.4, 0.6, 0.8):
        views = [view("j", 0)]
        sent: list[dict] = []

        def post(url, payload, token, timeout, sent=sent):
            sent.append(payload)
            return {"ok": True, "steps_interval_s": 4.0}

        s = make(views, post, job="j", mono_ns=t.mono, rand=lambda u=u: u)
        for second in range(10):
            t.ns = second * S
            views[0] = view("j", 0, [testing.step_record(i, i + 1, S // 4) for i in range(4 * second + 4)])
            s.send_once()
        seconds[u] = [i for i, p in enumerate(sent) if p["ranks"][0]["recent_steps"]]
    # the first report (before any advice) carries samples; then each agent every 4 s from its own phase
    assert seconds == {0.2: [0, 1, 5, 9], 0.4: [0, 2, 6], 0.6: [0, 3, 7], 0.8: [0, 4, 8]}


def test_reports_without_step_samples_carry_each_collective_record_once():
    # A version-1 slot numbers its Flight Recorder signatures with its step samples in
    # one ring: holding the samples back must not send the signatures again and again.
    t = _VirtualTime()
    sent = []

    def post(url, payload, token, timeout):
        sent.append(payload["ranks"][0])
        return {"ok": True, "steps_interval_s": 4.0}

    def coll(index, seq):
        payload = (0, seq, int(wire.CollOp.ALL_REDUCE), 6, 1, 1, wire.pack_shape((2, 3)), 0, 0, 0, 2, 1)
        return wire.Record(index=index, kind=int(wire.RecordKind.COLL_SIG), t_ns=0, step=seq, payload=payload)

    views = [view("j", 0)]
    s = make(views, post, job="j", mono_ns=t.mono, rand=lambda: 1.0)
    for second in range(6):  # each second a step sample, then a signature, in the one ring
        t.ns = second * S
        steps = tuple(testing.step_record(2 * i, i + 1, S // 4) for i in range(second + 1))
        colls = tuple(coll(2 * i + 1, i + 1) for i in range(second + 1))
        views[0] = dataclasses.replace(view("j", 0, steps), coll_records=colls)
        s.send_once()
    assert [[c["seq"] for c in r["recent_colls"]] for r in sent] == [[i + 1] for i in range(6)]
    assert [[x["step"] for x in r["recent_steps"]] for r in sent] == [[1], [], [], [], [2, 3, 4, 5], []]


def test_a_report_waits_for_a_reading_made_after_the_agent_itself_was_stopped():
    """Resumed after a SIGSTOP (or a starved CPU), the slots were last read before the gap:
    aged across it, every rank would look frozen for as long as the agent was. No report
    goes from such a reading; the next one, after the poll loop read again, does."""
    sent: list[dict] = []
    age = [20.0]
    s = make([view("a", 0)], keeps(sent), read_age_s=lambda: age[0])
    s.send_once()
    assert sent == [] and s.stale_skipped == 1
    age[0] = 0.1
    s.send_once()
    assert [p["seq"] for p in sent] == [1] and s.stale_skipped == 1
