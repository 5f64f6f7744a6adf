"""The typed reader (``contracts/report/typed.py``) changes no outcome: where it
answers, its report is the one the usual path (JSON, then ``HostReport.from_dict``)
makes of the same bytes, value for value and type for type, with nothing
dropped; for anything else (hostile, odd, a version-1 body) it answers None and
the usual path decides, with its drops and messages. And it does answer for
agents' reports: otherwise it would only cost."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import fields

import pytest
from test_report_plain import HOSTILE, _mutate, agent_body, hostile_rows

from watchdog import report
from watchdog.contracts.report import table
from watchdog.contracts.report import typed as typedbody
from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config
from watchdog.coordinator.intake import jsonbody
from watchdog.coordinator.intake.api import ReportHandler
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.service import Coordinator
from watchdog.report import HostReport, ReportError, as_rows


def usual(body: bytes) -> tuple:
    """What the usual path makes of ``body``: the report, and what it dropped."""
    dropped: list = []
    try:
        rep = HostReport.from_dict(jsonbody.loads(body), dropped)
    except (ReportError, ValueError, TypeError, OverflowError, RecursionError, UnicodeDecodeError) as exc:
        return None, f"refused: {type(exc).__name__}"
    return rep, dropped


def shape(rep: HostReport) -> tuple:
    """A report as exactly as it can be compared: repr tells 1 from 1.0 and True,
    then the types the fields hold and the death dicts (not compared by ==)."""
    return (
        repr(rep),
        [r.death for r in rep.ranks],
        [[type(getattr(r, f.name)) for f in fields(r)] for r in rep.ranks],
        [[type(getattr(r.coll, f.name)) for f in fields(r.coll)] for r in rep.ranks],
    )


def check(body: bytes) -> bool:
    """``read`` answers only with the usual path's report, and only where that
    drops nothing; True where it answered."""
    got = typedbody.read(body)
    if got is None:
        return False
    rep, dropped = usual(body)
    assert rep is not None and dropped == [], (body, dropped)
    assert shape(got) == shape(rep), body
    return True


def raw(obj) -> bytes:
    return json.dumps(obj).encode()


def test_agents_reports_are_read_in_one_pass_as_the_usual_path_reads_them():
    rng = random.Random(7)
    answered = 0
    for _ in range(300):
        body = agent_body(rng)
        answered += check(raw(body))
    # Those it leaves are the ones the schema's whole-report path leaves too (a
    # newer agent's field holding an object is one: fine, but not plainly so).
    assert answered > 250


@pytest.mark.parametrize("seed", range(4))
def test_hostile_rows_are_left_to_the_usual_path_or_read_as_it_reads_them(seed):
    rng = random.Random(seed)
    left = 0
    for _ in range(150):
        body = agent_body(rng)
        for _ in range(rng.choice([1, 1, 2, 3])):
            _mutate(rng, body)
        left += not check(raw(body))
    assert left > 75  # most changes are refusals or drops: never answered


def test_every_value_of_a_row_set_to_each_hostile_value():
    cases = 0
    # Past 64 bits and past a double too: json.dumps writes them, msgspec reads them otherwise than floats.
    for body in hostile_rows(HOSTILE + [10**19, -(10**19), 2**64, 1e400, -1e400]):
        check(raw(body))
        cases += 1
    assert cases > 1000


def test_the_report_around_the_rows():
    """Its own fields, each set to what an agent would not send, are never read
    otherwise than the usual path reads them (mostly: left to it)."""
    rng = random.Random(4)
    base = agent_body(rng, n=3)
    assert check(raw(base))
    changes: dict[str, list[object]] = {
        "v": [1, 2.0, True, "2", 3, None],
        "seq": [True, 1.5, -1, 2**62, 2**64, "1"],
        "sent_wall": [1, -1.0, 1e11, 1e400, True],
        "interval_s": [1, 0.01, 3601.0, False],
        "job": [1, None, ""],
        "host": [[], "h" * 300],
        "agent_id": [None, 7],
        "rank_fields": [[], ["rank"] * 2, [1], ["x" * 65], None],
        "coll_fields": [[], None, ["group"]],
        "step_fields": [[], ["step", "step"], None],
        "ranks": [[], None, {}, [[]]],
        "accelerators": [[{"index": 0, "name": "H200"}], [1], {}, None, [{"x": 2**70}]],
        "acks": [[{"id": "c1", "ok": True}], [{}] * 257, [[]], None],
        "step_summary_config": [[], [1, 2], [True] * 6, None, "x"],
    }
    answered = 0
    for name, values in changes.items():
        for value in values:
            body = copy.deepcopy(base)
            body[name] = value
            answered += check(raw(body))
            del body[name]
            check(raw(body))
    assert answered >= 5  # the fine ones: version 2, an accelerator, an ack, a float for an int second...
    # Too many acks: the handler drops the rest, and says so; the usual path's business.
    body = copy.deepcopy(base)
    body["acks"] = [{"id": f"c{i}", "ok": True} for i in range(report.MAX_ACKS_PER_REPORT + 1)]
    assert typedbody.read(raw(body)) is None


def test_field_lists_and_settings_are_read_once_per_distinct_bytes_and_the_memory_stays_bounded():
    """A newer agent's field lists (an extra name) and other spellings of the same
    lists are read as the usual path reads them; a flood of distinct ones (hostile)
    leaves the remembered readers and settings bounded, and answers unchanged."""
    rng = random.Random(9)
    base = agent_body(rng, n=2)
    for i in range(3 * typedbody._MAX_READERS):
        body = copy.deepcopy(base)
        body["rank_fields"].append(f"newer_{i}")
        for row in body["ranks"]:
            row.append(i)
        body["step_summary_config"] = [i % 3 - 1, 128, 20, 20, 3]  # refused (-1) every third: the usual path's
        answered = check(raw(body))
        assert answered == (i % 3 != 0), i
    assert len(typedbody._READERS) <= typedbody._MAX_READERS and len(typedbody._CONFIGS) <= typedbody._MAX_READERS
    assert check(raw(base)) and check(raw(base).replace(b'"rank_fields": [', b'"rank_fields":[ ', 1))


def test_bytes_that_are_not_plain_json():
    base = raw(agent_body(random.Random(8), n=2))
    assert check(base)
    for body in (
        base[:-1],
        base + b"x",
        base + b" \n",
        b"\xef\xbb\xbf" + base,
        base.replace(b'"h"', b'"\\ud800"', 1),
        base.replace(b'"h"', b'"\xff"', 1),
        base.replace(b'"v": 2', b'"v": 2, "v": 1', 1),
        base.replace(b'"v": 2', b'"v": 1, "v": 2', 1),
        base.replace(b"[", b" [ ", 3),
        b"[]",
        b"null",
        b"",
    ):
        check(body)


def test_version_one_bodies_and_field_lists_the_schema_does_not_take_whole():
    rep = t.report("h", [t.rank(0, recent_steps=t.steps(1, 3)), t.rank(1)])
    v1 = raw(json.loads(json.dumps(rep.to_dict())))
    assert typedbody.read(v1) is None  # version 1: the usual path
    v2 = as_rows(json.loads(v1))
    assert check(raw(v2))
    lacking = copy.deepcopy(v2)  # no "coll": the schema reads such rows one by one
    at = lacking["rank_fields"].index("coll")
    del lacking["rank_fields"][at]
    for row in lacking["ranks"]:
        del row[at]
    assert typedbody.read(raw(lacking)) is None


def test_the_samples_it_keeps_share_what_repeats():
    """As the schema's: one phase object, one zero for the unmeasured finer split
    (the coordinator keeps ~128 samples a rank)."""
    steps = t.steps(first=10, n=4, phase="train")
    got = typedbody.read(raw(as_rows(t.report("h", [t.rank(3, recent_steps=steps)]).to_dict())))
    assert got is not None and got.ranks[0].recent_steps == steps
    samples = got.ranks[0].recent_steps
    assert len({id(x.phase) for x in samples}) == 1
    assert len({id(getattr(x, f)) for x in samples for f in table.FINER}) == 1


def test_without_msgspec_every_body_takes_the_usual_path(monkeypatch):
    body = raw(agent_body(random.Random(9)))
    monkeypatch.setattr(typedbody, "msgspec", None)
    assert typedbody.read(body) is None


def test_the_handler_accepts_the_same_reports_either_way(monkeypatch, tmp_path):
    """Through the request handler: the same replies and the same views from the
    same bodies (a rank dropped, a report refused, plain ones), read in one pass
    where it can."""
    rng = random.Random(12)
    bodies = []
    for seq in range(1, 40):
        b = agent_body(rng, n=4)
        b.update(host="h", agent_id="a", seq=seq)
        at = {n: i for i, n in enumerate(b["rank_fields"])}
        for row in b["ranks"]:
            row[at["world_size"]] = 64
            row[at["rank"]] %= 64
        if len({row[at["rank"]] for row in b["ranks"]}) < len(b["ranks"]):
            continue
        if seq % 7 == 0:
            _mutate(rng, b)
        bodies.append(raw(b))
    headers = {"Authorization": "Bearer tok"}
    outcomes = []
    real = typedbody.read
    for typed in (True, False):
        calls: list[bytes] = []

        def read(body: bytes, typed: bool = typed, calls: list = calls):
            calls.append(body)
            return real(body) if typed else None

        monkeypatch.setattr(typedbody, "read", read)
        path = str(tmp_path / f"j{typed}.jsonl")
        coord = Coordinator(Config(job="job", token="tok", journal=path), Journal(path, lambda: (1e9, 0.0)))
        handler = ReportHandler(coord, "tok")
        replies = [handler.handle(headers, body, 100.0 + i) for i, body in enumerate(bodies)]
        view = coord.view_at(200.0)
        outcomes.append((replies, repr(sorted(view.ranks.items())), repr(sorted(view.hosts.items()))))
        coord.journal.close()
        assert len(calls) == len(bodies)
        read_by_path = {
            path: coord.registry.get_sample_value("watchdog_coordinator_reports_read_total", {"path": path})
            for path in ("one_pass", "checked")
        }
        one_pass = sum(real(body) is not None for body in bodies) if typed else 0
        assert read_by_path == {"one_pass": one_pass, "checked": len(bodies) - one_pass}  # what an operator sees
    assert outcomes[0] == outcomes[1]
    assert sum(r[0] == 200 for r in outcomes[0][0]) > 20
