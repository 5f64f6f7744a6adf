"""The report decoder's fast path accepts exactly what the checking path
accepts, with the same result; everything else falls through to it."""

from __future__ import annotations

import copy
import json
import random

import pytest

from watchdog import report
from watchdog.contracts.report import checks, table, v1
from watchdog.contracts.report import fast as fastpath
from watchdog.coordinator import testing as t


def slow(raw, i=0):
    saved = fastpath.fast_rank
    fastpath.fast_rank = lambda raw: None
    try:
        return v1.rank_from_dict(raw, i)
    finally:
        fastpath.fast_rank = saved


def good():
    """One rank as an agent sends it (JSON: lists, not tuples)."""
    return json.loads(json.dumps(t.report("h", [t.rank(3, recent_steps=t.steps(1, 4))]).to_dict()))["ranks"][0]


MUTATIONS = [
    lambda d: d.pop("gone_age_s"),  # optional: older agents omit it
    lambda d: d.pop("pid"),
    lambda d: d.update(pid=True),
    lambda d: d.update(step_age_s=1),  # an int where a float goes: fine, made a float
    lambda d: d.update(alive=1),
    lambda d: d.update(status=5),
    lambda d: d.update(rank=99),
    lambda d: d["coll"].update(op=3),
    lambda d: d["coll"].update(extra=1),
    lambda d: d["coll"].update(seq=False),
    lambda d: d["recent_steps"][0].update(phase=7),
    lambda d: d["recent_steps"][0].pop("phase"),
    lambda d: d["recent_steps"][0].update(step=1.5),
    lambda d: d.update(recent_steps="x"),
    lambda d: d.update(recent_steps=tuple(d["recent_steps"])),
    lambda d: d.update(unknown_new_field={"a": 1}),
    lambda d: d.update(death={}),
    lambda d: d.update(death=[]),  # not an object: refused, on either path
    lambda d: d.update(death={"exit_code": "1"}),
    lambda d: d.update(death={"summary": "x" * 10_000, "newer_field": 1}),  # cut and filtered by the checking path
    lambda d: d.update(gone_age_s=None),  # null is not "absent": refused
    lambda d: [d.pop(k) for k in ("loss", "loss_finite", "coll_bytes_total", "batch_per_rank", "proc_status")],
    lambda d: d.update(cpu_percent=7),
    lambda d: d.update(cpu_percent=7, step_age_s=2, loss=1),
    lambda d: d["recent_steps"][0].pop("h2d_s"),
    lambda d: [x.pop(k) for x in d["recent_steps"] for k in ("coll_bytes", *table.FINER)],  # an older agent's steps
    lambda d: d["recent_steps"][1].update(step_s=1),
    lambda d: d["recent_steps"][1].update(coll_bytes=1.0),
    lambda d: d["coll"].update(since_s=0),
    lambda d: d["coll"].pop("bytes"),
    lambda d: d["coll"].update(group=None),
]


@pytest.mark.parametrize("mutate", [None, *MUTATIONS])
def test_fast_path_agrees_with_the_checking_path(mutate):
    raw = good()
    if mutate is not None:
        mutate(raw)
    fast = fastpath.fast_rank(copy.deepcopy(raw))
    try:
        expected = slow(copy.deepcopy(raw))
    except report.ReportError:
        assert fast is None
        return
    assert fast is None or fast == expected
    assert v1.rank_from_dict(raw, 0) == expected


def test_fast_path_is_taken_for_agent_reports():
    assert fastpath.fast_rank(good()) == slow(good())
    rng = random.Random(1)
    raw = good()
    raw["heartbeat_age_s"] = rng.random()
    assert fastpath.fast_rank(raw) is not None
    older = good()  # an agent from before the loss fields and the finer step split
    for k in ("loss", "loss_finite", "loss_step", "coll_bytes_total", "batch_per_rank", "death", "recent_colls"):
        older.pop(k)
    for x in older["recent_steps"]:
        for k in ("coll_bytes", *table.FINER):
            x.pop(k)
    assert fastpath.fast_rank(copy.deepcopy(older)) == slow(older)


def checked(r):
    """rank_problem by its field-by-field checks alone."""
    saved = checks.plainly_fine
    checks.plainly_fine = lambda r: False
    try:
        return report.rank_problem(r)
    finally:
        checks.plainly_fine = saved


HOSTILE: list[object] = [0, 1, -1, 0.0, -0.0, 1.5, -1e-9, 1e9, 1e9 - 1, 1e11, 2**62 - 1, 2**62, 2**63, -(2**63) - 1]
HOSTILE += [float("nan"), float("inf"), -float("inf"), True, False, 10**400, "1", None]


def test_range_check_fast_path_never_passes_what_the_field_checks_refuse():
    """Every numeric field of a rank, its collective and a step sample, set in
    turn to each hostile value: the quick check answers "" only where the
    field-by-field checks do, and rank_problem's answer is theirs."""
    from dataclasses import fields, replace

    base = t.rank(3, recent_steps=t.steps(1, 3), cpu_percent=50.0)
    assert report.rank_problem(base) == "" and checks.plainly_fine(base)
    cases = []
    for f in fields(report.RankState):
        if f.name in (
            "coll",
            "recent_steps",
            "recent_colls",
            "recent_gpu",
            "gpu_clock",
            "death",
            "status",
            "phase",
            "pg_state",
            "proc_status",
        ):
            continue
        cases += [replace(base, **{f.name: v}) for v in HOSTILE]  # type: ignore[arg-type]  # hostile: any type in any field
    for f in fields(report.CollectiveState):
        if f.name != "op":
            cases += [replace(base, coll=replace(base.coll, **{f.name: v})) for v in HOSTILE]  # type: ignore[arg-type]  # hostile: any type in any field
    for f in fields(report.StepSample):
        if f.name != "phase":
            cases += [
                replace(base, recent_steps=(*base.recent_steps[:1], replace(base.recent_steps[1], **{f.name: v})))  # type: ignore[arg-type]  # hostile: any type in any field
                for v in HOSTILE
            ]
    for r in cases:
        try:
            expected = checked(r)
        except (TypeError, ValueError, OverflowError):
            continue  # a value no decoder produces (e.g. a str where a number goes)
        assert report.rank_problem(r) == expected, r
        if expected:
            assert not checks.plainly_fine(r)


def test_remembered_type_plans_are_bounded():
    """Each distinct tuple of field types gets its plan worked out once; a client
    sending ever new combinations cannot grow that memory without bound."""
    rng = random.Random(2)
    names = [n for n in table.FAST_NAMES if n not in ("rank", "world_size")]
    for _ in range(3 * fastpath.MAX_PLANS):
        raw = good()
        for name in rng.sample(names, 6):
            raw[name] = rng.choice([None, 1, 1.5, "x", True])
        fast = fastpath.fast_rank(copy.deepcopy(raw))
        try:
            expected = slow(copy.deepcopy(raw))
        except report.ReportError:
            assert fast is None
            continue
        assert fast is None or fast == expected
    assert len(fastpath.PLANS) <= fastpath.MAX_PLANS
