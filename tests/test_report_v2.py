"""Version-2 reports (ranks and steps as rows under field lists): the same
content decodes to exactly the same HostReport as its version-1 body, accepted
or refused alike; hostile field lists and rows are clear errors; the fast path
is the one agent reports take."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import replace
from typing import TypedDict

import pytest

from watchdog import report
from watchdog.contracts.report import rows, table
from watchdog.coordinator import testing as t
from watchdog.report import CollSig, GpuStep, HostReport, ReportError, as_rows

HOSTILE: list[object] = [0, 1, -1, 0.0, 1.5, -1e-9, 1e9, 1e11, 2**62, 2**63, True, False, "1", None, [], {}]
OPTIONAL = ("loss", "loss_finite", "loss_step", "coll_bytes_total", "batch_per_rank", "death", "recent_colls")


def wire(obj):
    """What the coordinator's JSON decoder gives for ``obj``."""
    return json.loads(json.dumps(obj))


def decoded(body, tolerant=True):
    """(HostReport, deaths, dropped) or the ReportError's message."""
    dropped: list = []
    try:
        rep = HostReport.from_dict(copy.deepcopy(body), dropped if tolerant else None)
    except ReportError as exc:
        return str(exc)
    return rep, [r.death for r in rep.ranks], dropped


class _Extra(TypedDict, total=False):
    """The fields some agents send and others do not."""

    recent_colls: tuple[CollSig, ...]
    recent_gpu: tuple[GpuStep, ...]
    gpu_clock: str
    death: dict[str, object]
    loss: float
    loss_step: int
    fr_read_age_s: float
    frame: str
    frame_step: int


def random_report(rng: random.Random) -> dict:
    """A version-1 body as some agent might send it: older agents' missing fields,
    Flight Recorder signatures, GPU steps, deaths, and now and then a hostile value."""
    world = rng.choice([1, 8, 16])
    ranks = []
    for r in rng.sample(range(world), rng.randint(0, min(world, 8))):
        extra = _Extra()
        if rng.random() < 0.3:
            extra["recent_colls"] = tuple(t.sig(s, elements=rng.randint(1, 99)) for s in range(1, rng.randint(2, 5)))
        if rng.random() < 0.2:
            extra["recent_gpu"] = t.gpu_steps(5, rng.randint(1, 3), lag_s=rng.random())
            extra["gpu_clock"] = "gpu"
        if rng.random() < 0.2:
            extra["death"] = {"summary": "killed by SIGKILL", "signal": "SIGKILL", "exit_code": -9}
        if rng.random() < 0.3:
            extra["loss"], extra["loss_step"], extra["fr_read_age_s"] = (
                rng.random() * 3,
                rng.randint(1, 99),
                rng.random(),
            )
        if rng.random() < 0.2:
            extra["frame"], extra["frame_step"] = (
                rng.choice(("upload_metrics (train.py:21)", "é" * 44)),
                rng.randint(1, 99),
            )
        rs = t.rank(
            r,
            world_size=world,
            step=rng.randint(0, 10**6),
            heartbeat_age_s=rng.random(),
            cpu_percent=rng.random() * 100,
            recent_steps=t.steps(rng.randint(1, 99), rng.randint(0, 5), step_s=rng.random()),
            collective=t.coll(seq=rng.randint(0, 99), outstanding=rng.randint(0, 1), since_s=rng.random()),
            **extra,
        )
        ranks.append(rs)
    body = wire(t.report("h", ranks, seq=rng.randint(1, 10**6)).to_dict())
    older = rng.random() < 0.2
    short_steps = rng.random() < 0.2
    for d in body["ranks"]:
        if older:  # an agent from before these fields: every rank of it lacks them
            for k in OPTIONAL:
                d.pop(k, None)
        if short_steps:
            for x in d["recent_steps"]:  # before any hostile value: a list of objects
                for k in ("coll_bytes", *table.FINER):
                    x.pop(k)
        for _ in range(rng.choice([0, 0, 0, 1, 2])):  # hostile or merely unusual values
            where = rng.choice(["rank", "coll", "step"])
            if where == "rank":
                d[rng.choice(list(d))] = rng.choice(HOSTILE)
            elif where == "coll" and isinstance(d["coll"], dict):
                d["coll"][rng.choice(list(d["coll"]))] = rng.choice(HOSTILE)
            elif where == "step" and isinstance(d["recent_steps"], list) and d["recent_steps"]:
                x = rng.choice(d["recent_steps"])
                x[rng.choice(list(x))] = rng.choice(HOSTILE)
    return body


def test_v1_and_v2_of_the_same_content_decode_equal():
    """Over many generated reports (valid, older agents', hostile values): the
    same HostReport and deaths, the same ranks dropped for the same reasons, or
    the same refusal of the whole report."""
    rng = random.Random(13)
    outcomes = {"accepted": 0, "dropped": 0, "refused": 0}
    for _ in range(600):
        v1 = random_report(rng)
        try:
            v2 = wire(as_rows(v1))
        except ValueError:
            continue  # a hostile value made one rank's coll or steps unlike the others': v2 has no form for it
        assert v2["v"] == 2 and all(type(row) is list for row in v2["ranks"])
        for tolerant in (True, False):
            one, two = decoded(v1, tolerant), decoded(v2, tolerant)
            if isinstance(one, str):
                assert isinstance(two, str), (one, v2)
                assert one == two or "must be an array of the" in two
                continue
            assert not isinstance(two, str), (two, v1)
            assert one[:2] == two[:2]
            assert [(i, r) for i, r, _ in one[2]] == [(i, r) for i, r, _ in two[2]]
            for (*_, why1), (*_, why2) in zip(one[2], two[2], strict=True):
                # the same words, but v2 names a coll or step that is not an array of its field list's
                # values first (v1 finds a bad simple field first, or calls the same value not an object)
                assert why1 == why2 or "must be an array of the" in why2
            if tolerant:
                outcomes["dropped" if one[2] else "accepted"] += 1
        if isinstance(decoded(v1), str):
            outcomes["refused"] += 1
    assert outcomes["accepted"] > 200 and outcomes["dropped"] > 50  # the generator reaches both


def test_agent_reports_take_the_positional_fast_path_and_are_known_in_range():
    ranks = [t.rank(r, recent_steps=t.steps(1, 4)) for r in range(8)]
    v2 = wire(as_rows(t.report("h", ranks).to_dict()))
    lay = rows.layout(v2)
    for row, expected in zip(v2["ranks"], ranks, strict=True):
        fast = lay.fast_rank(row)
        assert fast is not None and fast == (expected, True)
    older = wire(t.report("h", ranks).to_dict())
    for d in older["ranks"]:
        for k in OPTIONAL:
            d.pop(k)
    lay = rows.layout(wire(as_rows(older)))
    assert lay.pad and lay.fast_rank(wire(as_rows(older))["ranks"][0]) == (ranks[0], True)


def test_known_in_range_only_where_rank_problem_finds_nothing():
    """Every numeric field of a rank, its collective and a step, set in turn to
    each hostile value: whenever the positional path says "in range", the
    field-by-field checks agree."""
    base = t.rank(3, recent_steps=t.steps(1, 3), cpu_percent=50.0)
    cases = 0
    for value in HOSTILE + [float("nan"), float("inf")]:
        for f in table.RANK:
            if f.type in (int, float):
                cases += _check_range(replace(base, **{f.name: value}))  # type: ignore[arg-type]  # hostile: any type in any field
        for name in report.COLL_FIELDS:
            if name != "op":
                cases += _check_range(replace(base, coll=replace(base.coll, **{name: value})))  # type: ignore[arg-type]  # hostile: any type in any field
        for name in report.STEP_FIELDS:
            if name != "phase":
                steps = (base.recent_steps[0], replace(base.recent_steps[1], **{name: value}))  # type: ignore[arg-type]  # hostile: any type in any field
                cases += _check_range(replace(base, recent_steps=steps))
    assert cases > 300


def _check_range(r) -> int:
    try:
        body = json.loads(json.dumps(as_rows(t.report("h", [r]).to_dict())))
    except ValueError:
        return 0  # NaN as JSON: the coordinator's decoder refuses it before any schema
    lay = rows.layout(body)
    fast = lay.fast_rank(body["ranks"][0])
    if fast is not None and fast[1]:
        assert report.rank_problem(fast[0]) == "", r
    return 1


def good_v2():
    return wire(as_rows(t.report("h", [t.rank(r, recent_steps=t.steps(1, 2)) for r in range(2)]).to_dict()))


def _set(path, value):
    def mutate(b):
        *parents, last = path
        for p in parents:
            b = b[p]
        b[last] = value

    return mutate


REFUSED = [  # (the hostile change, what the message says): the whole report is refused
    ("no rank_fields", lambda b: b.pop("rank_fields"), "missing field 'rank_fields'"),
    ("no step_fields", lambda b: b.pop("step_fields"), "missing field 'step_fields'"),
    ("rank_fields an object", _set(["rank_fields"], {"rank": 0}), "'rank_fields' must be list"),
    ("empty coll_fields", _set(["coll_fields"], []), "coll_fields must list 1..128 field names, got 0"),
    ("too long", lambda b: b["rank_fields"].extend(f"x{i}" for i in range(200)), "must list 1..128"),
    ("a number as a name", lambda b: b["rank_fields"].__setitem__(3, 7), "rank_fields[3] must be a field name"),
    ("a list as a name", lambda b: b["step_fields"].__setitem__(0, ["step"]), "step_fields[0] must be a field"),
    ("an empty name", lambda b: b["coll_fields"].__setitem__(0, ""), "coll_fields[0] must be a field name"),
    ("an absurd name", lambda b: b["rank_fields"].__setitem__(0, "r" * 10_000), "rank_fields[0] must be a field"),
    ("a name twice", lambda b: b["rank_fields"].__setitem__(1, "rank"), "rank_fields names 'rank' twice"),
    ("ranks an object", _set(["ranks"], {}), "'ranks' must be list"),
    ("too many rows", lambda b: b.update(ranks=b["ranks"] * 3000), "report has 6000 ranks, limit 4096"),
]
N = len(report.RANK_FIELDS)
DROPPED = [  # (the hostile change to rank 1's row, what its drop says): rank 0 is kept
    ("row an object", lambda b: b["ranks"].__setitem__(1, {"rank": 1}), f"must be an array of the {N} values"),
    ("row too short", lambda b: b["ranks"][1].pop(), f"has {N - 1} values; rank_fields names {N}"),
    ("row too long", lambda b: b["ranks"][1].append(0), f"has {N + 1} values; rank_fields names {N}"),
    ("rank a string", lambda b: b["ranks"][1].__setitem__(0, "1"), "field 'rank' must be int, got str"),
    ("pid negative", lambda b: b["ranks"][1].__setitem__(3, -5), "pid must be an integer in 0..2^62"),
    ("loss step absurd", lambda b: b["ranks"][1].__setitem__(_at(b, "loss_step"), 1 << 70), "loss_step must be"),
    ("loss step negative", lambda b: b["ranks"][1].__setitem__(_at(b, "loss_bad_step"), -1), "loss_bad_step must"),
    ("loss infinite", lambda b: b["ranks"][1].__setitem__(_at(b, "loss"), 1e400), "loss must be a finite number"),
    ("frame too long", lambda b: b["ranks"][1].__setitem__(_at(b, "frame"), "f" * 45), "frame is at most 44"),
    ("frame step negative", lambda b: b["ranks"][1].__setitem__(_at(b, "frame_step"), -1), "frame_step must be"),
    ("coll an object", lambda b: _coll_row(b).update(), "coll must be an array of the 7 values coll_fields"),
    ("coll short", lambda b: b["ranks"][1][_at(b, "coll")].pop(), "coll must be an array of the 7 values"),
    ("a step short", lambda b: b["ranks"][1][_at(b, "recent_steps")][0].pop(), "recent_steps[0] must be an array"),
    ("steps absurd", lambda b: _steps(b, [[]] * 100_000), "recent_steps must be a list of at most 256"),
    ("step a str", lambda b: _steps(b, ["x"]), "ranks[1].recent_steps[0] must be an array of the 10 values"),
    ("step NaN-ish", lambda b: _steps(b, [[1, "x", 0.0, 0.0, "train", 0, 0.0, 0.0, 0.0, 0.0]]), "'step_s' must be"),
]


def _at(b, name):
    return b["rank_fields"].index(name)


def _coll_row(b):
    b["ranks"][1][_at(b, "coll")] = {"seq": 1}
    return {}


def _steps(b, steps):
    b["ranks"][1][_at(b, "recent_steps")] = steps


@pytest.mark.parametrize("name,mutate,message", REFUSED, ids=[c[0] for c in REFUSED])
def test_hostile_field_lists_refuse_the_report_with_a_clear_message(name, mutate, message):
    body = good_v2()
    mutate(body)
    got = decoded(body)
    assert isinstance(got, str) and message in got, got


@pytest.mark.parametrize("name,mutate,message", DROPPED, ids=[c[0] for c in DROPPED])
def test_a_hostile_row_costs_its_rank_only(name, mutate, message):
    body = good_v2()
    mutate(body)
    got = decoded(body)
    assert not isinstance(got, str), got
    rep, _, dropped = got
    assert [r.rank for r in rep.ranks] == [0]
    assert len(dropped) == 1 and dropped[0][0] == 1 and message in dropped[0][2], dropped


def test_unknown_field_names_are_skipped_as_unknown_keys_are():
    """A newer agent may add fields: v1 ignores unknown keys, v2 unknown names."""
    base = good_v2()
    newer = copy.deepcopy(base)
    newer["rank_fields"].insert(5, "from_the_future")
    for row in newer["ranks"]:
        row.insert(5, {"anything": [1, 2]})
    newer["step_fields"].append("also_new")
    for row in newer["ranks"]:
        for x in row[_at(newer, "recent_steps")]:
            x.append("x")
    assert decoded(newer) == decoded(base)
    lay = rows.layout(newer)
    assert lay.fast_rank(newer["ranks"][0]) is not None  # still the fast path


def test_remembered_field_lists_are_bounded():
    for i in range(3 * rows.MAX_LAYOUTS):
        body = good_v2()
        body["rank_fields"].append(f"new{i}")
        for row in body["ranks"]:
            row.append(i)
        assert not isinstance(decoded(body), str)
    assert len(rows.LAYOUTS) <= rows.MAX_LAYOUTS


def test_a_report_with_no_ranks_has_field_lists_too():
    body = wire(as_rows(t.report("h", []).to_dict()))
    assert body["rank_fields"] == list(report.RANK_FIELDS)
    assert decoded(body)[0] == HostReport.from_dict(wire(t.report("h", []).to_dict()))


def test_v2_is_smaller():
    rep = t.report("h", [t.rank(r, recent_steps=t.steps(1, 4)) for r in range(8)])
    assert len(json.dumps(as_rows(rep.to_dict()))) < 0.6 * len(json.dumps(rep.to_dict()))


def test_field_lists_without_a_required_field_drop_every_rank_by_name():
    """No "rank" (or no "coll") in rank_fields: each rank is dropped with the
    version-1 message, not a crash; with a default (an older agent's), it is filled."""
    body = good_v2()
    i = body["rank_fields"].index("rank")
    del body["rank_fields"][i]
    for row in body["ranks"]:
        del row[i]
    rep, _, dropped = decoded(body)
    assert rep.ranks == () and [(j, r) for j, r, _ in dropped] == [(0, None), (1, None)]
    assert all("missing field 'rank'" in why for *_, why in dropped)
    body = good_v2()
    i = body["rank_fields"].index("gone_age_s")
    del body["rank_fields"][i]
    for row in body["ranks"]:
        del row[i]
    assert decoded(body)[0] == decoded(good_v2())[0]


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b["ranks"][1].pop("loss"),  # a field the other rank has
        lambda b: b["ranks"][1].update(extra=1),  # one it lacks
        lambda b: b["ranks"][1].update(extra=b["ranks"][1].pop("loss")),  # as many, not the same
        lambda b: b["ranks"][0]["recent_steps"][0].pop("phase"),
        lambda b: b["ranks"][1]["coll"].update(extra=0),
    ],
)
def test_version_two_cannot_say_that_one_entry_lacks_a_field_another_has(change):
    body = wire(t.report("h", [t.rank(r, recent_steps=t.steps(1, 2)) for r in range(2)]).to_dict())
    assert as_rows(body)["ranks"]  # as sent
    change(body)
    with pytest.raises(ValueError, match="lacks a field"):
        as_rows(body)
