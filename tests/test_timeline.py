"""watchdog timeline on journals built in-process: slots written by the real hook
(FakeClock, exact times) and read the way the agent reads them, findings and
events shaped as the coordinator journals them. Fast; the real-run tests are in
test_timeline_real.py."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from timeline_support import check_trace, fake_stack, hang_records, hook_slot, write_journal

from watchdog import cli
from watchdog.contracts.journal.actions import ActionRecord
from watchdog.coordinator.journal import event_names as je
from watchdog.hook.testing import ENV_VARS
from watchdog.timeline import html, load, main, perfetto, text


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def hang(tmp_path):
    return write_journal(tmp_path / "journal.jsonl", hang_records(tmp_path))


def _lines(out: str) -> list[str]:
    return [x for x in out.splitlines() if x.strip()]


def test_text_names_the_culprit_first_with_its_state_and_stacks(hang):
    out = text.render(load.load(str(hang)))
    lines = _lines(out)
    assert lines[2] == "ROOT CAUSE: collective_hang naming rank 2"
    rank2 = next(x for x in lines if x.startswith("  rank 2 (host node-a, pid 1002; slot read"))
    assert "outside collectives and data loading for 5.0 s" in rank2 and "last collective #12 done" in rank2
    # the culprit's stack, then a waiting rank's, before the per-rank table
    i_culprit = out.index("stack of rank 2 (culprit")
    i_waiter = out.index("stack of rank 0 (waiting")
    i_table = out.index("ranks at ")
    assert i_culprit < i_waiter < i_table
    assert "stuck_here (train.py:213)" in out and "watchdog-heartbeat" not in out  # main thread only
    table = out[i_table:].splitlines()
    assert table[2].lstrip().startswith("2*")  # culprit row first
    assert "in training code for 5.0 s, not in a collective" in table[2]
    for r in (0, 1, 3):
        row = next(x for x in table if x.lstrip().startswith(f"{r} "))
        assert "13…" in row and "in ddp_all_reduce #13 for 5.0 s" in row
    assert "actions: none journaled" in out


def test_step_split_comes_from_the_ring(hang):
    sec = load.load(str(hang)).sections[0]
    lane = sec.lanes[0]
    assert [s.step for s in lane.steps] == list(range(1, 13))
    last = lane.steps[-1]
    assert last.data_s == pytest.approx(0.001) and last.coll_s == pytest.approx(0.010)
    assert last.compute_s == pytest.approx(0.055) and last.last_seq == 12 and last.n_coll == 1
    checkpoint = [s for s in lane.spans if s.kind == "checkpoint"]
    assert len(checkpoint) == 1 and checkpoint[0].end - checkpoint[0].start == pytest.approx(0.2)
    open_coll = [s for s in lane.spans if s.kind == "collective" and s.open]
    assert [s.seq for s in open_coll] == [13] and open_coll[0].end - open_coll[0].start == pytest.approx(5.0)


def test_torn_last_line_is_skipped_and_the_rest_still_reads(hang, tmp_path):
    data = hang.read_bytes()
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(data + b'{"event":"finding","t_wall":1.0,"kind":"dead_ra')
    tl = load.load(str(torn))
    assert tl.skipped_lines == 1
    root = tl.sections[0].root
    assert root is not None and root["ranks"] == [2]
    assert "1 unreadable journal line(s) skipped" in text.render(tl)


def test_without_evidence_the_coordinators_view_is_shown_and_said_to_be(tmp_path):
    j = write_journal(tmp_path / "old.jsonl", hang_records(tmp_path, evidence=False))
    tl = load.load(str(j))
    sec = tl.sections[0]
    assert not sec.has_slots and any(n.startswith("slot evidence missing") for n in sec.notes)
    out = text.render(tl)
    assert _lines(out)[2] == "ROOT CAUSE: collective_hang naming rank 2"
    assert "slot evidence missing" in out and "the coordinator's last known view" in out
    assert "rank 2 (host node-a, pid 1002; coordinator's last view): in training code" in out
    assert "waiting in ddp_all_reduce #13" in out  # the waiters, from the finding's own evidence
    page = html.render(tl)
    assert "slot evidence missing" in page and "No stacks were journaled" in page
    check_trace(perfetto.render(tl))


def test_sections_per_coordinator_start_and_per_worker_restart(tmp_path):
    world = 2
    first = [hook_slot(tmp_path / f"a{r}", r, world, steps=4, end="code", pid=100 + r) for r in range(world)]
    second = [hook_slot(tmp_path / f"b{r}", r, world, steps=3, end="code", pid=200 + r) for r in range(world)]
    t = first[0].created_wall_ns / 1e9

    def ev(slots, at):
        return {
            "event": je.EVIDENCE,
            "t_wall": at,
            "t_mono": 0,
            "host": "node-a",
            "slots": [s.to_dict() for s in slots],
            "stacks": [],
        }

    recs = [{"event": je.START, "t_wall": t - 1, "t_mono": 0, "job": "j", "world_size": world}]
    recs += [
        {"event": je.RANK_JOINED, "t_wall": t, "t_mono": 0, "rank": r, "host": "node-a", "pid": 100 + r}
        for r in range(world)
    ]
    recs.append(
        {
            "event": je.FINDING,
            "t_wall": t + 5,
            "t_mono": 0,
            "kind": "dead_rank",
            "ranks": [1],
            "onset_wall": t + 4,
            "detected_wall": t + 5,
            "reason": "rank 1 died",
            "evidence": {"pids": {"1": 101}, "step": 4},
        }
    )
    recs.append(
        {"event": "action", "t_wall": t + 6, "t_mono": 0, "action": "restart", "ranks": [0, 1], "outcome": "ok"}
    )
    recs += [
        {
            "event": je.RANK_RESTARTED,
            "t_wall": t + 8 + r,
            "t_mono": 0,
            "rank": r,
            "host": "node-a",
            "pid": 200 + r,
            "old_pid": 100 + r,
        }
        for r in range(world)
    ]
    # the coordinator notices the old rank 1 gone only now: a record about a process
    # of section 1 must not claim it for section 2 (seen on a real hang -> restart)
    recs.append(
        {
            "event": je.STATE,
            "t_wall": t + 10.5,
            "t_mono": 0,
            "rank": 1,
            "host": "node-a",
            "pid": 101,
            "changed": {"alive": [True, False]},
        }
    )
    # the old group's snapshot lands after the new processes were seen: it is still section 1's
    recs.append(ev(first, max(s.taken_wall for s in first) + 0.1))
    recs.append(ev(second, max(s.taken_wall for s in second) + 0.1))
    recs.append({"event": je.START, "t_wall": t + 30, "t_mono": 0, "job": "j", "world_size": world})
    tl = load.load(str(write_journal(tmp_path / "j.jsonl", recs)))
    assert [s.opened_by for s in tl.sections] == ["start", "restart", "start"]
    s1, s2, s3 = tl.sections
    assert {r: lane.pid for r, lane in s1.lanes.items()} == {0: 100, 1: 101}
    assert {r: lane.pid for r, lane in s2.lanes.items()} == {0: 200, 1: 201}
    root = s1.root
    assert root is not None and root["kind"] == "dead_rank" and s2.root is None
    assert all(lane.now is not None and lane.now.where.startswith("never registered") for lane in s3.lanes.values())
    assert not any("disagree" in n for n in s1.notes + s2.notes)
    assert [lane.steps[-1].step for lane in s1.lanes.values()] == [4, 4]
    assert s1.actions and isinstance(s1.actions[0], ActionRecord) and s1.actions[0].action == "restart"
    out = text.render(tl)
    assert out.count("== section ") == 3 and "section 2 of 3: ranks restarted" in out
    assert "restart ranks 0-1" in out
    assert "no finding in this section" in out
    assert html.render(tl).count('<section class="sec"') == 3


def test_a_host_whose_clock_disagrees_is_named(tmp_path):
    recs = hang_records(tmp_path)
    ev = next(r for r in recs if r["event"] == je.EVIDENCE)
    skewed = hook_slot(tmp_path / "b", 3, 4, steps=12, end="collective", host="node-b", pid=2003, wall_offset_s=7.5)
    recs.append({**ev, "host": "node-b", "stacks": [], "slots": [skewed.to_dict()]})
    sec = load.load(str(write_journal(tmp_path / "j.jsonl", recs))).sections[0]
    clocks = {c.host: c for c in sec.clocks}
    assert clocks["node-a"].agree and not clocks["node-b"].agree
    # agent clock minus the journal's: the skew, less the time the evidence took to arrive
    assert clocks["node-b"].offset_s == pytest.approx(skewed.taken_wall - ev["t_wall"], abs=0.001)
    assert 7.0 < clocks["node-b"].offset_s < 7.5
    assert any("host node-b disagrees" in n for n in sec.notes)


def test_missing_rank_stands_out_in_the_collective_matrix_and_lanes(hang):
    page = html.render(load.load(str(hang)))
    states = {
        int(r): c
        for c, r in re.findall(
            r'<g class="mx (\w+)" data-seq="13"><rect[^>]*/><text[^>]*>[^<]*'
            r"</text><title>rank (\d)",
            page,
        )
    }
    assert states == {2: "missing", 0: "waiting", 1: "waiting", 3: "waiting"}
    assert page.count('class="missing"') == 1 and "never entered ddp_all_reduce #13" in page
    assert re.search(r'class="lane culprit-label"[^>]*data-rank="2">rank 2', page)


def test_html_is_self_contained(hang):
    page = html.render(load.load(str(hang)))
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", page))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls  # the SVG namespace is a name, not a fetch
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", page)
    assert "@import" not in page and "url(http" not in page
    assert '<pre class="stack" data-rank="2">' in page and "stuck_here (train.py:213)" in page
    assert page.count("<script>") == 1 and "<style>" in page


def test_perfetto_is_a_valid_trace_one_process_per_host_one_track_per_rank(hang):
    tl = load.load(str(hang))
    events = check_trace(json.loads(json.dumps(perfetto.render(tl))))
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(procs.values()) == ["coordinator (journal)", "node-a"]
    host_pid = next(p for p, n in procs.items() if n == "node-a")
    threads = {
        e["tid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == host_pid
    }
    assert threads == {r: f"rank {r}" for r in range(4)}
    steps = [e for e in events if e["ph"] == "X" and e["cat"] == "step" and e["tid"] == 0 and e["pid"] == host_pid]
    assert len(steps) == 13 and steps[-1]["name"] == "step 13 (in progress)"
    assert steps[-2]["dur"] == 66_000  # 1 + 50 + 10 + 5 ms, in microseconds
    findings = [e for e in events if e.get("cat") == "finding"]
    assert len(findings) == 1 and findings[0]["s"] == "g" and findings[0]["args"]["root_cause"] is True


def test_an_action_is_told_as_one_story_even_across_the_restart_it_caused(hang, tmp_path):
    recs = [json.loads(x) for x in hang.read_text().splitlines()]
    stop = recs.pop()
    t = stop["t_wall"]
    trig = {"kind": "collective_hang", "ranks": [2], "action": "a-1"}
    common = {"t_mono": 0, "action_id": "a-1", "action": "restart", "kind": "collective_hang", "ranks": [2]}
    recs += [
        {
            "event": je.COMMAND,
            "t_wall": t - 3,
            "t_mono": 0,
            "id": "c1",
            "type": "dump_stacks",
            "host": "node-a",
            "ranks": [2, 0],
        },
        {
            "event": je.COMMAND_REFUSED,
            "t_wall": t - 2.9,
            "t_mono": 0,
            "command_id": "c1",
            "type": "dump_stacks",
            "host": "node-a",
            "reason": "unsigned",
        },
        *[
            {
                "event": je.ACTION_HELD,
                "t_wall": t - 2.5 + i / 10,
                "t_mono": 0,
                "kind": "collective_hang",
                "reason": f"restart for collective_hang held: finding is 0.{i} s old, policy waits 1 s",
            }
            for i in range(3)
        ],
        {**common, "event": je.ACTION, "t_wall": t - 2, "reason": "collective_hang: ...", "dry_run": False},
        {
            "event": je.STATE,
            "t_wall": t - 2,
            "t_mono": 0,
            "job_state": "restarting",
            "from": "degraded",
            "on": "restart",
        },
        {
            **common,
            "event": je.ACTION_PROGRESS,
            "t_wall": t - 2,
            "phase": "term",
            "signal": "SIGTERM",
            "workers": [0, 1, 2, 3],
            "launchers": [],
        },
        *[
            {
                "event": je.COMMAND,
                "t_wall": t - 1.9,
                "t_mono": 0,
                "id": f"s{r}",
                "type": "signal",
                "host": "node-a",
                "ranks": [r],
                "trigger": trig,
                "args": {"signal": "SIGTERM"},
            }
            for r in range(4)
        ],
        *[
            {
                "event": je.COMMAND_DONE,
                "t_wall": t - 1.8,
                "t_mono": 0,
                "command_id": f"s{r}",
                "type": "signal",
                "host": "node-a",
                "trigger": trig,
                "ok": r != 3,
                "error": "",
            }
            for r in range(4)
        ],
        {**common, "event": je.RESTART, "t_wall": t - 1.5, "restart": 1, "stopped": [0, 1, 2, 3], "seconds": 0.5},
        *[
            {
                "event": je.RANK_RESTARTED,
                "t_wall": t - 1,
                "t_mono": 0,
                "rank": r,
                "host": "node-a",
                "pid": 5000 + r,
                "old_pid": 1000 + r,
            }
            for r in range(4)
        ],
        {
            **common,
            "event": je.RESUMED,
            "t_wall": t,
            "restart": 1,
            "step": 12,
            "world_size": 4,
            "seconds": 7.0,
            "steps_lost": 8,
        },
        {
            **common,
            "event": je.ACTION_OUTCOME,
            "t_wall": t,
            "ok": True,
            "result": "restart 1, resumed from step 12",
            "seconds": 7.0,
        },
        stop,
    ]
    tl = load.load(str(write_journal(tmp_path / "j.jsonl", recs)))
    first, second = tl.sections
    assert second.opened_by == "restart" and not second.actions  # the restart's story stays with its cause
    assert any("evidence request dump_stacks to host node-a refused: unsigned" in n for n in first.notes)
    out = text.render(tl)
    after = out[out.index("actions:\n") :].splitlines()[1:]
    story = "\n".join(after[: next(i for i, x in enumerate(after) if not x.startswith("  "))])
    lines = [x.split(" ", 3)[-1].strip() for x in story.splitlines()]
    assert lines[:6] == [
        "held 3 time(s) from here: restart for collective_hang held: finding is 0.2 s old, policy waits 1 s",
        "restart for collective_hang rank 2",
        "term: SIGTERM to workers 0-3",
        "signal SIGTERM sent to ranks 0-3: 3 done ok, 1 done failed",
        "restart 1: workers 0-3 stopped, 500 ms after the action",
        "resumed from step 12 with 4 ranks, 8 steps lost, 7.0 s after the action",
    ], story
    assert lines[6] == "outcome ok: restart 1, resumed from step 12"
    assert "dump_stacks" not in story  # collecting evidence is not an action
    page = html.render(tl)
    assert "<h3>What was done</h3>" in page and "outcome ok: restart 1, resumed from step 12" in page
    assert "job degraded -&gt; restarting (on restart)" in page
    drawn = re.findall(r'<g class="ev ev-action"[^>]*>.*?<text[^>]*>([^<]*)</text>', page)
    assert drawn[:2] == [
        "restart for collective_hang rank 2",
        "restart 1: workers 0-3 stopped, 500 ms after the action",
    ]


def test_ranks_that_never_registered_get_a_lane(tmp_path):
    recs = [r for r in hang_records(tmp_path, world=4) if not (r["event"] == je.RANK_JOINED and r["rank"] == 3)]
    for r in recs:
        if r["event"] == "evidence":
            r["slots"] = [s for s in r["slots"] if s["rank"] != 3]
        if r["event"] == "finding":
            r["evidence"]["waiters"].remove(3)
    sec = load.load(str(write_journal(tmp_path / "j.jsonl", recs))).sections[0]
    assert sorted(sec.lanes) == [0, 1, 2, 3]
    now = sec.lanes[3].now
    assert now is not None and now.where.startswith("never registered")
    assert any("no slot snapshot of rank 3" in n for n in sec.notes)


def test_a_gone_rank_ends_at_its_last_sign_of_life(tmp_path):
    slot = hook_slot(tmp_path, 1, 2, steps=5, end="code", pid=301)
    t = slot.created_wall_ns / 1e9
    recs = [
        {"event": je.START, "t_wall": t - 1, "t_mono": 0, "job": "j", "world_size": 2},
        {"event": je.RANK_JOINED, "t_wall": t, "t_mono": 0, "rank": 1, "host": "node-a", "pid": 301},
        {
            "event": je.STATE,
            "t_wall": slot.taken_wall - 1,
            "t_mono": 0,
            "rank": 1,
            "host": "node-a",
            "pid": 301,
            "step": 5,
            "changed": {"alive": [True, False]},
        },
        {
            "event": je.FINDING,
            "t_wall": slot.taken_wall - 0.9,
            "t_mono": 0,
            "kind": "dead_rank",
            "ranks": [1],
            "onset_wall": slot.taken_wall - 1.2,
            "detected_wall": slot.taken_wall - 0.9,
            "reason": "rank 1 died",
        },
        {
            "event": je.EVIDENCE,
            "t_wall": slot.taken_wall,
            "t_mono": 0,
            "host": "node-a",
            "slots": [slot.to_dict()],
            "stacks": [
                replace(
                    fake_stack("node-a", 1, 301, "x", 0),
                    ok=False,
                    text="",
                    error="Error: Failed to get process executable name.\n\nCaused by:",
                ).to_dict()
            ],
        },
    ]
    tl = load.load(str(write_journal(tmp_path / "j.jsonl", recs)))
    lane = tl.sections[0].lanes[1]
    assert lane.now is not None
    assert lane.now.activity == "gone" and lane.now.where.startswith("process gone; last seen in training code")
    assert "5.0 s" not in lane.now.where  # not "for 5 s": it died at an unknown moment after its last sign of life
    gone = next(s for s in lane.spans if s.kind == "gone")
    assert gone.end == pytest.approx(slot.taken_wall - 1)
    assert gone.start == pytest.approx(lane.steps[-1].end + 0.040)  # last sign: the step's last stores
    out = text.render(tl)
    assert "py-spy dump failed: Error: Failed to get process executable name." in out and "Caused by" not in out
    assert "(waiting" not in out  # nobody is known to wait on a crash: no second stack is claimed


def test_cli_dispatches_and_writes_reports(hang, tmp_path, capsys):
    out_html, out_json = tmp_path / "t.html", tmp_path / "t.json"
    assert cli.main(["timeline", str(hang), "--html", str(out_html), "--perfetto", str(out_json)]) == 0
    cap = capsys.readouterr()
    assert cap.out == "" and f"wrote {out_html}" in cap.err  # files only: no text unless --text
    check_trace(json.loads(out_json.read_text()))
    assert out_html.read_text().startswith("<!doctype html>")
    assert main.main([str(hang)]) == 0
    assert "ROOT CAUSE: collective_hang naming rank 2" in capsys.readouterr().out
    assert main.main([str(tmp_path / "missing.jsonl")]) == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main.main([str(empty)]) == 1
    assert "the journal holds no events" in capsys.readouterr().out
