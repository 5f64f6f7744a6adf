"""The journal's typed records (watchdog.contracts.journal): a line of every event
type, as the coordinator has written it, loads into its record without losing a
field; a record built by a writer is the line the journal has always had; unknown
events and fields are kept, and old or hostile lines load as they always did."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from watchdog.contracts import journal as cj
from watchdog.contracts.finding import Finding
from watchdog.contracts.journal import line as journal_line
from watchdog.contracts.journal import names
from watchdog.contracts.journal.actions import ActionRecord, LauncherRestartRecord, RepeatFailureRecord, ResumedRecord
from watchdog.contracts.journal.commands import CommandDoneRecord, EvidenceRecord
from watchdog.contracts.journal.findings import FindingRecord, ResolvedRecord
from watchdog.contracts.journal.lifecycle import StartRecord
from watchdog.contracts.journal.ranks import StateRecord
from watchdog.coordinator import policy_file
from watchdog.coordinator.control import replay as recover
from watchdog.coordinator.journal import jsonl as journal
from watchdog.timeline import load

# One line per event type in the shape the coordinator writes it (taken from
# journals of real runs and unit tests, cut short where they ran long).
LINES = {
    names.START: b'{"event":"start","t_wall":1796431011.344213,"t_mono":13470.784168,"pid":7238,"address":"127.0.0.1:33435","job":"job","run_id":"","world_size":4,"event_loop":"uvloop"}',
    names.CONFIG: b'{"event":"config","t_wall":1796431011.34,"t_mono":13470.78,"config":{"job":"job","world_size":4,"journal":"/tmp/j.jsonl"}}',
    names.STOP: b'{"event":"stop","t_wall":1796422813.4382,"t_mono":5272.878155,"reason":"SIGTERM","active_findings":[{"kind":"dead_rank","ranks":[1]}]}',
    names.JOURNAL_GAP: b'{"event":"journal_gap","t_wall":1700000000.0,"t_mono":0.0,"lost_records":2,"since_wall":1699999990.5,"error":"[Errno 28] No space left on device"}',
    names.COORDINATOR_STALLED: b'{"event":"coordinator_stalled","t_wall":1700000000.0,"t_mono":0.0,"gap_s":29.5,"hold_max_s":5.0,"hosts":["a","b"]}',
    names.FINDING: b'{"event":"finding","t_wall":1700000000.0,"t_mono":0.0,"kind":"dead_rank","ranks":[2,3],"hosts":["b"],"reason":"host b lost","onset_mono":10.0,"detected_mono":12.51,"evidence":{"silent_s":2.51,"agent_id":"agent-b"},"wants_stacks":[],"onset_wall":1700000009.99,"detected_wall":1700000012.5}',
    names.RESOLVED: b'{"event":"resolved","t_wall":1796423737.687745,"t_mono":6197.1277,"kind":"collective_hang","ranks":[0,1],"hosts":["vm"],"duration_s":16.692,"reason":"no progress for 14.4 s","opened_wall":1796423735.1871142}',
    names.EXPECTED_FINDING: b'{"event":"expected_finding","t_wall":1796422690.197783,"t_mono":5149.637739,"kind":"dead_rank","ranks":[2],"hosts":["vm"],"reason":"rank 2 died","onset_mono":5149.359850746,"detected_mono":5149.636793881,"evidence":{"pids":{"2":2233}},"wants_stacks":[],"onset_wall":1796422689.919898,"detected_wall":1796422690.1968412,"caused_by_action":"a-1"}',
    names.HOST_SEEN: b'{"event":"host_seen","t_wall":1000000000.0,"t_mono":0.0,"host":"h","agent_id":"a","agent_restarted":false,"previous_agent_id":null}',
    names.HOST_LOST: b'{"event":"host_lost","t_wall":1700000000.0,"t_mono":0.0,"host":"b","agent_id":"agent-b","silent_s":2.51}',
    names.HOST_BACK: b'{"event":"host_back","t_wall":1700000003.0,"t_mono":3.0,"host":"b","agent_id":"agent-b"}',
    names.LAUNCHER_EXITED: b'{"event":"launcher_exited","t_wall":1700000000.0,"t_mono":0.0,"host":"h","pid":4242,"status":1}',
    names.RANK_JOINED: b'{"event":"rank_joined","t_wall":0.0,"t_mono":0.0,"rank":0,"host":"node-a","pid":1000,"local_rank":0,"world_size":4,"status":"running","pg_state":"joined"}',
    names.RANK_RESTARTED: b'{"event":"rank_restarted","t_wall":1700000000.0,"t_mono":0.0,"rank":0,"host":"h","pid":7000,"local_rank":0,"old_pid":1000,"old_host":"h","old_step":100}',
    names.STATE: b'{"event":"state","t_wall":1796422914.18028,"t_mono":5373.620235,"rank":1,"host":"vm","pid":5735,"local_rank":1,"step":0,"changed":{"alive":[true,false]},"cause":"exit -9 (SIGKILL)"}',
    names.ACTION: b'{"event":"action","t_wall":1796418584.063221,"t_mono":1043.503177,"action_id":"a-2","action":"restart","reason":"dead_rank: rank 1 died","kind":"dead_rank","ranks":[1],"hosts":["vm"],"dry_run":false,"job_state":"degraded","fingerprint":{"kind":"dead_rank","hosts":["vm"],"ranks":[1],"group":null,"seq":null,"op":"","step":14,"frames":[]},"restart":2}',
    names.ACTION_PROGRESS: b'{"event":"action_progress","t_wall":1796422689.701438,"t_mono":5149.141394,"action_id":"a-1","action":"restart","kind":"collective_hang","ranks":[2],"phase":"term","signal":"SIGTERM","workers":[0,1],"launchers":[],"idents":[[0,2231,1796422669330000,"vm"],[1,2232,1796422669340000,"vm"]],"reached_step":30}',
    names.CHECKPOINTED: b'{"event":"checkpointed","t_wall":1700000010.0,"t_mono":10.0,"action_id":"a-1","action":"checkpoint_restart","kind":"straggler","ranks":[0,1],"step":40,"seconds":1.5}',
    names.CHECKPOINT_FAILED: b'{"event":"checkpoint_failed","t_wall":1700000010.0,"t_mono":10.0,"action_id":"a-1","action":"checkpoint_restart","kind":"straggler","ranks":[1],"step":40,"error":"no checkpoint within 60 s"}',
    names.RESTART: b'{"event":"restart","t_wall":1796418584.312385,"t_mono":1043.75234,"action_id":"a-2","action":"restart","kind":"dead_rank","ranks":[1],"restart":2,"stopped":[0,1],"seconds":0.25}',
    names.LAUNCHER_RESTART: b'{"event":"launcher_restart","t_wall":1796419114.385036,"t_mono":1573.824991,"action_id":"a-1","action":"restart","kind":"dead_rank","ranks":[1],"restart":1,"gone":[0,1],"idents":[[0,349,1796419101230000,"vm"],[1,350,1796419101230000,"vm"]]}',
    names.RESUMED: b'{"event":"resumed","t_wall":1796423103.739265,"t_mono":5563.17922,"action_id":"a-1","action":"restart","kind":"dead_rank","ranks":[1],"restart":1,"step":20,"world_size":4,"seconds":5.999,"steps_lost":0}',
    names.ACTION_OUTCOME: b'{"event":"action_outcome","t_wall":1796418583.064314,"t_mono":1042.50427,"action_id":"a-1","action":"restart","kind":"dead_rank","ranks":[1],"ok":true,"result":"restart 1, resumed from step 0","seconds":12.0}',
    names.ACTION_HELD: b'{"event":"action_held","t_wall":1796423096.73985,"t_mono":5556.179805,"reason":"restart for dead_rank held: finding is 0.0 s old, policy waits 1 s","kind":"dead_rank"}',
    names.ACTION_ERROR: b'{"event":"action_error","t_wall":1700000000.0,"t_mono":0.0,"error":"boom"}',
    names.REPEAT_FAILURE: b'{"event":"repeat_failure","t_wall":1700000000.0,"t_mono":0.0,"action_id":"a-2","kind":"dead_rank","ranks":[1],"hosts":["vm"],"dry_run":false,"fingerprint":{"kind":"dead_rank","ranks":[1]},"action":"abort","rule":"same_failure","reason":"came back","occurrences":2,"earlier":[]}',
    names.COMMAND: b'{"event":"command","t_wall":1700000000.0,"t_mono":0.0,"id":"c-7f57ba0a97bd853a","type":"signal","host":"host0","ranks":[0],"trigger":{"kind":"collective_hang","ranks":[3],"action":"a-1"},"attempt":1,"signed":true,"expires_wall":1700000030.0,"target":{"rank":0,"pid":5000,"proc_start_us":1700000000000000},"args":{"signal":"SIGTERM"}}',
    names.COMMAND_DONE: b'{"event":"command_done","t_wall":1796422690.10037,"t_mono":5149.540325,"command_id":"c-8856622aa781a2fe","type":"signal","host":"vm","trigger":{"kind":"collective_hang","ranks":[2],"action":"a-1"},"ok":true,"error":""}',
    names.COMMAND_REFUSED: b'{"event":"command_refused","t_wall":1700000000.0,"t_mono":0.0,"command_id":"c-20d8b6faa0987ddf","type":"snapshot_slots","host":"host1","trigger":{"kind":"dead_rank","ranks":[3]},"reason":"bad_signature","error":"refused"}',
    names.COMMAND_EXPIRED: b'{"event":"command_expired","t_wall":1700000000.0,"t_mono":0.0,"type":"dump_stacks","host":"host0","ids":["c-40b49eb71747d20f"],"ranks":[3],"trigger":{"kind":"collective_hang","ranks":[3]},"acknowledged":false,"waited_s":10.0}',
    names.COMMAND_UNKNOWN_ACK: b'{"event":"command_unknown_ack","t_wall":1796423387.524165,"t_mono":5846.96412,"host":"a","id":"","type":"","more":252}',
    names.EVIDENCE: b'{"event":"evidence","t_wall":1796420013.218313,"t_mono":2472.658267,"command_id":"c-36d808746c9283e9","type":"dump_stacks","host":"vm","trigger":{"kind":"frozen_rank","ranks":[1]},"ok":false,"error":"rank 1: process gone","stacks":[{"host":"vm","rank":1,"pid":21095,"ok":false,"text":"","error":"process gone","method":"py-spy dump","taken_wall":1796420013.1394296,"duration_s":0.0}],"slots":[],"bound":{"parallel":8,"deadline_s":10.0,"duration_s":0.0003,"late":[]}}',
    names.STACK_GROUPS: b'{"event":"stack_groups","t_wall":1796430990.96858,"t_mono":13450.408536,"trigger":{"kind":"wedged","ranks":[]},"asked":1,"hosts_asked":1,"hosts_answered":0,"hosts_missing":["a"],"late_ranks":0,"ranks":0,"groups":[],"dropped_groups":0,"dropped_ranks":0,"summary":"no stacks","odd_ones_out":[]}',
    names.STACKS_CAPPED: b'{"event":"stacks_capped","t_wall":1700000000.0,"t_mono":0.0,"trigger":{"kind":"collective_hang","ranks":[3]},"max_per_host":3,"ranks_left_out":2,"hosts":{"host0":[[2,2]],"host1":[[7,7]]},"hosts_capped":2}',
    names.RECOVERED: b'{"event":"recovered","t_wall":1796421990.820618,"t_mono":4450.260573,"records":1,"job_state":"running","restarts_used":0,"restarts_last_hour":0,"last_action_s_ago":null,"next_action_id":"a-1","in_flight":null,"interrupted":[],"open_findings":[]}',
    names.VERDICT: b'{"event":"verdict","t_wall":1700000000.0,"t_mono":0.0,"verdict":"compute","previous":"unknown","reason":"compute-bound","shares":{"data":0.0,"communication":0.2},"evidence":{"ranks":4,"world_size":4}}',
    names.GOODPUT: b'{"event":"goodput","t_wall":1796423392.395964,"t_mono":5851.835919,"seconds":{"productive":0.0},"shares":{"productive":0.0},"total_s":0.0,"pending_s":0.0,"goodput":0.0,"steps":0,"world_sizes":[],"profile":{"step_s":0.0},"final":true,"summary":"goodput 0.0% of 0.0 s","verdict":"unknown","verdict_reason":"not enough steps yet","verdict_evidence":{"ranks":0},"world_size":4}',
}


def test_one_record_class_per_event_name():
    assert set(cj.RECORDS) == set(names.ALL) == set(LINES)
    assert all(name == cls.EVENT for name, cls in cj.RECORDS.items())


@pytest.mark.parametrize("event", names.ALL)
def test_every_event_as_written_loads_into_its_record_losing_nothing(event):
    raw = json.loads(LINES[event])
    rec = cj.parse(raw)
    assert type(rec) is cj.RECORDS[event] and rec.event == event
    assert rec.to_dict() == raw  # every field kept, unknown ones in extra
    assert rec.t_wall == raw["t_wall"] and rec.t_mono == raw["t_mono"]
    declared = {f.metadata.get("key", f.name) for f in dataclasses.fields(rec)} - {"extra", "t_wall", "t_mono"}
    for key in declared & set(raw):  # a field this version knows is read typed, not left aside
        assert key not in rec.extra or raw[key] in (None, False), key
    # Written back through the journal's one line codec, it is the line the coordinator wrote.
    assert journal_line.line(rec.to_dict()).rstrip(b"\n") == LINES[event]


def test_typed_fields_read_from_lines():
    action = cj.parse(json.loads(LINES[names.ACTION]))
    assert isinstance(action, ActionRecord)
    assert (action.action_id, action.restart, action.dry_run, action.ranks) == ("a-2", 2, False, [1])
    state = cj.parse(json.loads(LINES[names.STATE]))
    assert isinstance(state, StateRecord)
    assert state.rank == 1 and state.cause == "exit -9 (SIGKILL)" and not state.of_job
    job = cj.parse({"event": "state", "t_wall": 1.0, "job_state": "restarting", "from": "degraded", "on": "restart"})
    assert isinstance(job, StateRecord)
    assert job.of_job and (job.job_state, job.from_state, job.on) == ("restarting", "degraded", "restart")
    assert job.to_dict() == {
        "event": "state",
        "t_wall": 1.0,
        "job_state": "restarting",
        "from": "degraded",
        "on": "restart",
    }


def test_unknown_events_wrong_types_and_extra_fields_are_kept():
    unknown = cj.parse({"event": "from_the_future", "t_wall": 5.0, "x": [1]})
    assert isinstance(unknown, cj.Unknown) and unknown.event == "from_the_future"
    assert unknown.to_dict() == {"event": "from_the_future", "t_wall": 5.0, "x": [1]}
    odd = {"event": "finding", "t_wall": "yesterday", "kind": 7, "ranks": [1], "new_field": {"a": 1}}
    rec = cj.parse(odd)
    assert isinstance(rec, FindingRecord)
    assert rec.kind is None and rec.t_wall is None and rec.ranks == [1]  # wrong types read as absent
    assert rec.extra == {"t_wall": "yesterday", "kind": 7, "new_field": {"a": 1}}
    assert {k: v for k, v in rec.to_dict().items() if k in odd} == odd
    old = cj.parse({"event": "start", "t_wall": 1.0, "job": "job"})  # a journal from before run ids
    assert isinstance(old, StartRecord)
    assert old.run_id is None and old.to_dict()["job"] == "job" and "run_id" not in old.to_dict()


def _journal(tmp_path, lines):
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


def test_old_and_odd_journals_still_replay_and_load(tmp_path):
    """Every event type as written, plus what a reader must step over: an event it does
    not know, a field of the wrong type, a field it does not know, a torn last line."""
    lines = [LINES[e] for e in names.ALL]
    lines += [
        b'{"event":"from_the_future","t_wall":1796431012.0,"anything":[1,2]}',
        b'{"event":["not","a","name"],"t_wall":1796431012.5}',
        b'{"event":"finding","t_wall":1796431013.0,"kind":["not","a","string"],"ranks":"x","new":1}',
        b'{"event":"action_outcome","t_wall":1796431014.0,"action_id":5,"ok":"yes"}',
        b'{"event":"resolved","t_wall":1796431015.0,"kin',
    ]
    path = _journal(tmp_path, lines)
    rec = recover.replay(journal.read(path), 100.0, 1796431100.0, "job", policy_file.Policy())
    assert rec.count == 2 and rec.records > 0
    assert ("dead_rank", (2, 3)) in rec.active  # the finding opened and not resolved
    tl = load.load(path)
    assert tl.skipped_lines == 1 and tl.sections
    assert any(e.kind == "finding" for s in tl.sections for e in s.events)


def test_records_built_by_writers_are_the_lines_main_writes(tmp_path):
    """The coordinator's writers build records; the journal line is byte for byte the one
    written from the payload dict before (tests/golden pins the names, this the lines)."""

    def clock():
        return (1_700_000_000.5, 42.25)

    f = Finding(
        kind="dead_rank",
        ranks=(1,),
        hosts=("h",),
        reason="rank 1 died",
        onset_mono=1.0,
        detected_mono=2.0,
        evidence={"x": float("nan"), "pids": {"1": 9}},
        onset_wall=1.5,
        detected_wall=2.5,
    )
    old = journal.Journal(str(tmp_path / "old.jsonl"), clock)
    new = journal.Journal(str(tmp_path / "new.jsonl"), clock)
    resolved: dict[str, Any] = {
        "kind": "dead_rank",
        "ranks": [1],
        "hosts": ["h"],
        "duration_s": 3.0,
        "reason": "x",
        "opened_wall": 2.5,
    }
    old.write(names.FINDING, f.to_dict())
    new.write(FindingRecord.from_dict(f.to_dict()))
    old.write(names.RESOLVED, resolved)
    new.write(ResolvedRecord(**resolved))
    written = (
        names.START,
        names.STOP,
        names.HOST_LOST,
        names.VERDICT,
        names.RECOVERED,
        names.LAUNCHER_EXITED,
        names.STACKS_CAPPED,
    )
    for event in (*written, *names.COMMAND_EVENTS, names.EVIDENCE):
        payload = {k: v for k, v in json.loads(LINES[event]).items() if k not in ("event", "t_wall", "t_mono")}
        old.write(event, payload)
        new.write(cj.RECORDS[event](**payload))
    # A restart the launcher made on its own, and its resume (with and without the steps it cost).
    old.write(names.LAUNCHER_RESTART, {"restart": 1, "by": "launcher", "seen_s": 0.5})
    new.write(LauncherRestartRecord(restart=1, by="launcher", seen_s=0.5))
    for lost in ({}, {"steps_lost": 3}):
        old.write(names.RESUMED, {"restart": 1, "by": "launcher", "step": 20, "world_size": 4, "seconds": 6.0, **lost})
        new.write(
            ResumedRecord(
                restart=1, by="launcher", step=20, world_size=4, seconds=6.0, steps_lost=lost.get("steps_lost")
            )
        )
    # The dispatch's answers: "late" only when late, after the trigger; no Flight Recorder, no field.
    done = {k: v for k, v in json.loads(LINES[names.COMMAND_DONE]).items() if k not in ("event", "t_wall", "t_mono")}
    head = {k: done[k] for k in ("command_id", "type", "host", "trigger")}
    old.write(names.COMMAND_DONE, {**head, "late": True, "ok": True, "error": ""})
    new.write(CommandDoneRecord(**head, late=True, ok=True, error=""))
    old.write(names.EVIDENCE, {**head, "ok": True, "error": "", "stacks": [], "slots": []})
    new.write(EvidenceRecord(**head, late=False, ok=True, error="", stacks=[], slots=[], flight_recorder=None))
    old.close()
    new.close()
    assert (tmp_path / "new.jsonl").read_bytes() == (tmp_path / "old.jsonl").read_bytes()


def test_records_the_view_and_the_actions_build_are_the_lines_they_wrote_as_dicts(tmp_path):
    """The view's and the actions' records: every shape they write, explicit nulls
    included, is the line their payload dicts gave (an ``absent()`` field tells a
    field left out from one written as null)."""

    def clock():
        return (1_700_000_000.5, 42.25)

    brief = {"action_id": "a-1", "action": "restart", "kind": "dead_rank", "ranks": [1]}
    shapes = [json.loads(LINES[e]) for e in (*names.ACTION_STEPS, *names.CHECKPOINT_STEPS, *names.POLICY_HELD)]
    shapes += [json.loads(LINES[e]) for e in (names.HOST_SEEN, names.RANK_JOINED, names.RANK_RESTARTED, names.STATE)]
    shapes += [
        {"event": names.STATE, "job_state": "restarting", "from": "degraded", "on": "restart"},
        {"event": names.ACTION_OUTCOME, **brief, "ok": False, "result": "x", "restart": 1, "resume_timeout_s": 60.0, "seconds": 61.0},
        {"event": names.ACTION_OUTCOME, **brief, "ok": True, "result": "aborted", "seconds": 3.0, "kill_rounds": 1},
        {"event": names.ACTION_OUTCOME, **brief, "ok": False, "result": "alive", "alive": [2], "d_state": [2]},
        {"event": names.ACTION_OUTCOME, "action_id": "a-1", "action": "abort", "ok": True, "result": "dry run"},
        {"event": names.ACTION_PROGRESS, **brief, "phase": "rollback", "error": "no anomaly step"},
        {"event": names.ACTION_PROGRESS, **brief, "phase": "rollback", "before_step": 7, "hosts": ["h"]},
        {"event": names.ACTION, "action_id": "a-2", "action": "abort", "reason": "r", "kind": "dead_rank", "ranks": [1], "hosts": ["h"], "dry_run": False, "job_state": "degraded", "escalated_from": "a-0", "restart": 2},
        {"event": names.REPEAT_FAILURE, "action_id": "a-2", "kind": "dead_rank", "ranks": [1], "hosts": ["h"], "dry_run": False, "fingerprint": None, "action": "abort", "rule": "same_failure", "reason": "again", "occurrences": 2, "earlier": []},
    ]  # fmt: skip
    old = journal.Journal(str(tmp_path / "old.jsonl"), clock)
    new = journal.Journal(str(tmp_path / "new.jsonl"), clock)
    for shape in shapes:
        payload = {k: v for k, v in shape.items() if k not in ("event", "t_wall", "t_mono")}
        old.write(shape["event"], payload)
        fields = {("from_state" if k == "from" else k): v for k, v in payload.items()}
        rec = cj.RECORDS[shape["event"]](**fields)
        assert not rec.extra, shape  # every field declared, in the order written
        new.write(rec)
    old.close()
    new.close()
    assert (tmp_path / "new.jsonl").read_bytes() == (tmp_path / "old.jsonl").read_bytes()
    # Read back, a null stays a null and a field left out stays left out.
    nulls = cj.parse({"event": names.REPEAT_FAILURE, "fingerprint": None})
    assert isinstance(nulls, RepeatFailureRecord)
    assert nulls.fingerprint is None and nulls.has("fingerprint") and "fingerprint" in nulls.to_dict()
    left_out = cj.parse({"event": names.REPEAT_FAILURE})
    assert isinstance(left_out, RepeatFailureRecord)
    assert not left_out.fingerprint and not left_out.has("fingerprint") and "fingerprint" not in left_out.to_dict()
