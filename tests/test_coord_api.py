"""The report endpoint's handler: every bad input is a clear 4xx, counted, and
never an exception (property tests feed it arbitrary bytes and JSON)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from watchdog.coordinator import testing as t
from watchdog.coordinator.config import Config
from watchdog.coordinator.intake.api import ReportHandler, authorized
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.service import Coordinator
from watchdog.report import as_rows

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def coord(tmp_path):
    c = Coordinator(
        Config(job="job", token=TOKEN, journal=str(tmp_path / "j.jsonl")),
        Journal(str(tmp_path / "j.jsonl"), lambda: (time.time(), time.monotonic())),
    )
    yield c
    c.journal.close()


def body(report) -> bytes:
    return json.dumps(report.to_dict()).encode()


def rejected(c, reason):
    return c.registry.get_sample_value("watchdog_coordinator_reports_rejected_total", {"reason": reason})


def test_good_report_is_accepted(coord):
    status, reply, reason = ReportHandler(coord, TOKEN).handle(AUTH, body(t.report("a", t.healthy())), 10.0)
    assert (status, reply, reason) == (
        200,
        {"ok": True, "commands": [], "report_versions": [1, 2], "step_summary_config": [2, 128, 50, 20, 4]},
        "",
    )
    assert coord.registry.get_sample_value("watchdog_coordinator_reports_received_total") == 1
    assert len(coord.view.ranks) == 8


def schema_error(obj):
    del obj["ranks"][0]["heartbeat_age_s"]
    return obj


def negative_age(obj):
    obj["ranks"][0]["step_age_s"] = -1
    return obj


def dup_rank(obj):
    obj["ranks"].append(obj["ranks"][0])
    return obj


def other_job(obj):
    obj["job"] = "someone-else"
    return obj


def good():
    return json.loads(body(t.report("a", t.healthy())))


CASES = [
    ("no token", {}, json.dumps(good()).encode(), 401, "unauthorized", "bearer token"),
    ("wrong token", {"Authorization": "Bearer nope"}, json.dumps(good()).encode(), 401, "unauthorized", "bearer token"),
    (
        "token without Bearer",
        {"Authorization": TOKEN},
        json.dumps(good()).encode(),
        401,
        "unauthorized",
        "bearer token",
    ),
    ("not json", AUTH, b"{nope", 400, "bad_json", "not valid JSON"),
    ("not utf-8", AUTH, b"\xff\xfe", 400, "bad_json", "not valid JSON"),
    ("NaN", AUTH, b'{"v": NaN}', 400, "bad_json", "NaN"),
    ("array", AUTH, b"[1, 2]", 400, "schema", "JSON object"),
    ("wrong version", AUTH, json.dumps({**good(), "v": 99}).encode(), 400, "version", "unsupported report version 99"),
    ("ranks not a list", AUTH, json.dumps({**good(), "ranks": {}}).encode(), 400, "schema", "'ranks' must be list"),
    (
        "interval below the floor",
        AUTH,
        json.dumps({**good(), "interval_s": 0.001}).encode(),
        400,
        "schema",
        "interval_s must be in 0.05",
    ),
    ("negative seq", AUTH, json.dumps({**good(), "seq": -5}).encode(), 400, "schema", "seq must be an integer"),
    ("other job", AUTH, json.dumps(other_job(good())).encode(), 409, "wrong_job", "serves job 'job'"),
]


@pytest.mark.parametrize("name,headers,raw,status,reason,message", CASES, ids=[c[0] for c in CASES])
def test_bad_reports(coord, name, headers, raw, status, reason, message):
    got_status, reply, got_reason = ReportHandler(coord, TOKEN).handle(headers, raw, 10.0)
    assert (got_status, got_reason) == (status, reason)
    assert set(reply) == {"error"} and message in reply["error"]
    assert rejected(coord, reason) == 1
    assert coord.view.ranks == {}  # nothing half-folded


def out_of_range(field, value):
    def f(obj):
        mutate(obj, ("ranks", 0, *field), value)
        return obj

    return f


RANK_CASES = [
    ("missing field", schema_error, "ranks[0]: missing field 'heartbeat_age_s'"),
    ("negative age", negative_age, "step_age_s must be a finite number of seconds >= 0"),
    ("rank twice", dup_rank, "appears twice"),
    ("world size too big", out_of_range(("world_size",), 1 << 40), "world_size"),
    ("negative step", out_of_range(("step",), -1), "step must be an integer"),
    ("huge step", out_of_range(("step",), 1 << 63), "step must be an integer"),
    ("negative coll seq", out_of_range(("coll", "seq"), -3), "coll.seq"),
    ("negative coll bytes", out_of_range(("coll", "bytes"), -1), "coll.bytes"),
    ("rank outside world", out_of_range(("rank",), 99), "outside world size"),
]


@pytest.mark.parametrize("name,bad,message", RANK_CASES, ids=[c[0] for c in RANK_CASES])
def test_one_bad_rank_is_dropped_and_the_host_kept(coord, name, bad, message):
    """A forged or corrupt slot on one host must not cost that host's healthy ranks:
    the bad entry is dropped (counted, named), the report accepted."""
    obj = bad(good())
    status, reply, reason = ReportHandler(coord, TOKEN).handle(AUTH, json.dumps(obj).encode(), 10.0)
    assert (status, reason) == (200, "")
    assert reply["ok"] is True and len(reply["dropped"]) == 1 and message in reply["dropped"][0]["error"]
    assert coord.registry.get_sample_value("watchdog_coordinator_report_ranks_dropped_total") == 1
    assert "a" in coord.view.hosts and len(coord.view.ranks) >= 7  # the healthy ranks are there


def test_acks_beyond_the_bound_are_dropped_and_unknown_ones_journaled_a_few(coord, tmp_path):
    from watchdog.coordinator.journal import jsonl as jr

    obj = good()
    obj["acks"] = [{"id": f"c-{i:06d}", "type": "dump_stacks", "ok": True} for i in range(50_000)]
    status, _, _ = ReportHandler(coord, TOKEN).handle(AUTH, json.dumps(obj).encode(), 10.0)
    assert status == 200
    assert coord.registry.get_sample_value("watchdog_coordinator_report_acks_dropped_total") == 50_000 - 256
    unknown = [r for r in jr.read(coord.journal.path) if r["event"] == "command_unknown_ack"]
    assert len(unknown) <= 5 and unknown[-1]["more"] == 256 - 4


def test_authorized_is_case_insensitive_on_header_and_scheme():
    assert authorized(TOKEN, {"authorization": f"bearer {TOKEN}"})
    assert authorized("", {})  # no token configured: loopback-only mode
    assert not authorized(TOKEN, {"Authorization": f"Bearer {TOKEN}x"})


def test_first_report_adopts_the_job_when_none_configured(tmp_path):
    c = Coordinator(Config(journal=str(tmp_path / "j")), Journal(str(tmp_path / "j"), lambda: (0.0, 0.0)))
    h = ReportHandler(c, "")
    assert h.handle({}, body(t.report("a", t.healthy(), job="jobA")), 1.0)[0] == 200
    assert h.handle({}, body(t.report("b", t.healthy(), job="jobB")), 1.0)[0] == 409


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=12), kids, max_size=6),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=300))
def test_fuzz_arbitrary_bytes_never_raise(coord, raw):
    status, reply, _ = ReportHandler(coord, TOKEN).handle(AUTH, raw, 10.0)
    assert status in (200, 400, 409) and (status == 200 or "error" in reply)


def mutate(obj, path, value):
    cur = obj
    for key in path[:-1]:
        cur = cur[key]
    cur[path[-1]] = value
    return obj


FIELDS = [
    ("v",),
    ("job",),
    ("host",),
    ("seq",),
    ("interval_s",),
    ("ranks",),
    ("ranks", 0),
    ("ranks", 0, "rank"),
    ("ranks", 0, "world_size"),
    ("ranks", 0, "coll"),
    ("ranks", 0, "coll", "seq"),
    ("ranks", 0, "recent_steps"),
    ("ranks", 0, "step_age_s"),
    ("ranks", 0, "alive"),
    ("accelerators",),
    ("sent_wall",),
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(FIELDS), value=json_values)
def test_fuzz_mutated_reports_are_accepted_or_cleanly_refused(coord, path, value):
    obj = json.loads(body(t.report("a", [t.rank(0, recent_steps=t.steps(1, 3))])))
    raw = json.dumps(mutate(obj, path, value), allow_nan=False).encode()
    status, reply, reason = ReportHandler(coord, TOKEN).handle(AUTH, raw, 10.0)
    assert status in (200, 400, 409), reply
    if status != 200:
        assert reason in ("bad_json", "schema", "version", "wrong_job") and isinstance(reply["error"], str)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_accepted_reports_keep_the_view_usable(coord, data):
    """Whatever valid numbers arrive, the tick (all detectors) still runs clean."""
    n = data.draw(st.integers(1, 6))
    ages = st.floats(0, 1e6, allow_nan=False)
    states = [
        t.rank(
            r,
            world_size=n,
            heartbeat_age_s=data.draw(ages),
            step_age_s=data.draw(ages),
            alive=data.draw(st.booleans()),
            step=data.draw(st.integers(0, 10**9)),
            collective=t.coll(
                seq=data.draw(st.integers(0, 10**6)), outstanding=data.draw(st.integers(0, 3)), since_s=data.draw(ages)
            ),
            recent_steps=t.steps(
                data.draw(st.integers(0, 10**6)),
                data.draw(st.integers(0, 60)),
                step_s=data.draw(st.floats(0, 100)),
                data_s=data.draw(st.floats(0, 100)),
            ),
        )
        for r in range(n)
    ]
    seq = int(coord.registry.get_sample_value("watchdog_coordinator_reports_received_total") or 0) + 1
    status, _, _ = ReportHandler(coord, TOKEN).handle(AUTH, body(t.report("a", states, seq=seq)), 10.0 + seq)
    assert status == 200
    result = coord.tick(10.5 + seq, 1e9)
    assert all(o.ok for o in result.outcomes), [o.error for o in result.outcomes if not o.ok]


def test_float_or_bool_version_is_not_version_1(coord):
    for v in (1.0, True):
        status, _, reason = ReportHandler(coord, TOKEN).handle(AUTH, json.dumps({**good(), "v": v}).encode(), 10.0)
        assert (status, reason) == (400, "version")


def test_absurd_world_size_is_dropped(coord):
    obj = good()
    obj["ranks"][0]["world_size"] = 10**9
    status, reply, reason = ReportHandler(coord, TOKEN).handle(AUTH, json.dumps(obj).encode(), 10.0)
    assert (status, reason) == (200, "") and "world_size" in reply["dropped"][0]["error"]
    assert 0 not in {r.rank for r in coord.view.ranks.values()}


def rows(report) -> dict:
    return json.loads(json.dumps(as_rows(report.to_dict())))


def test_version_2_is_accepted_and_folds_as_version_1_does(tmp_path, coord):
    """The same reports, one coordinator fed version 1 and one version 2: the same view."""
    other = Coordinator(
        Config(job="job", token=TOKEN, journal=str(tmp_path / "k.jsonl")),
        Journal(str(tmp_path / "k.jsonl"), lambda: (time.time(), time.monotonic())),
    )
    try:
        for seq in (1, 2):
            rep = t.report("a", [t.rank(r, recent_steps=t.steps(seq * 5, 5)) for r in range(8)], seq=seq)
            one = ReportHandler(coord, TOKEN).handle(AUTH, body(rep), 10.0 + seq)
            two = ReportHandler(other, TOKEN).handle(AUTH, json.dumps(rows(rep)).encode(), 10.0 + seq)
            assert one == two and one[0] == 200 and one[1]["report_versions"] == [1, 2]
        assert coord.view_at(13.0) == other.view_at(13.0) and len(other.view.ranks) == 8
    finally:
        other.journal.close()


V2_REFUSED = [
    ({"rank_fields": None}, "'rank_fields' must be list"),
    ({"step_fields": ["step", "step"]}, "step_fields names 'step' twice"),
    ({"coll_fields": [f"f{i}" for i in range(1000)]}, "coll_fields must list 1..128 field names, got 1000"),
    ({"rank_fields": [{"rank": 1}]}, "rank_fields[0] must be a field name"),
    ({"v": 3}, "unsupported report version 3; this coordinator reads 1, 2"),
]


@pytest.mark.parametrize("change,message", V2_REFUSED)
def test_hostile_version_2_is_refused_clearly_counted_and_the_handler_goes_on(coord, change, message):
    h = ReportHandler(coord, TOKEN)
    raw = json.dumps({**rows(t.report("a", t.healthy())), **change}).encode()
    status, reply, reason = h.handle(AUTH, raw, 10.0)
    assert status == 400 and message in reply["error"]
    assert rejected(coord, reason) == 1 and reason == ("version" if "version" in message else "schema")
    assert h.handle(AUTH, json.dumps(rows(t.report("a", t.healthy()))).encode(), 11.0)[0] == 200


def test_a_bad_version_2_row_is_dropped_and_named_in_the_reply(coord):
    obj = rows(t.report("a", t.healthy(4)))
    obj["ranks"][2] = obj["ranks"][2][:-1]
    status, reply, _ = ReportHandler(coord, TOKEN).handle(AUTH, json.dumps(obj).encode(), 10.0)
    assert (
        status == 200
        and reply["dropped"][0]["index"] == 2
        and "values; rank_fields names" in reply["dropped"][0]["error"]
    )
    assert sorted(r.rank for r in coord.view.ranks.values()) == [0, 1, 3]
    assert coord.registry.get_sample_value("watchdog_coordinator_report_ranks_dropped_total") == 1


V2_FIELDS = [
    ("rank_fields",),
    ("rank_fields", 0),
    ("coll_fields", 2),
    ("step_fields",),
    ("step_fields", 1),
    ("ranks", 0),
    ("ranks", 0, 0),
    ("ranks", 0, 16),
    ("ranks", 0, 16, 3),
    ("ranks", 0, 25),
    ("ranks", 0, 25, 0),
    ("ranks", 0, 25, 0, 1),
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(V2_FIELDS), value=json_values)
def test_fuzz_mutated_version_2_reports_are_accepted_or_cleanly_refused(coord, path, value):
    obj = rows(t.report("a", [t.rank(0, recent_steps=t.steps(1, 3))]))
    assert obj["rank_fields"][16] == "coll" and obj["rank_fields"][25] == "recent_steps"
    raw = json.dumps(mutate(obj, path, value), allow_nan=False).encode()
    status, reply, reason = ReportHandler(coord, TOKEN).handle(AUTH, raw, 10.0)
    assert status in (200, 400, 409), reply
    if status != 200:
        assert reason == "schema" and isinstance(reply["error"], str)
