"""The report decoder's fast path accepts exactly what the checking path
accepts, with the same result; everything else falls through to it."""

from __future__ import annotations

import copy
import json
import random

import pytest

from watchdog import report
from watchdog.coordinator import testing as t


def slow(raw, i=0):
    saved = report._fast_rank
    report._fast_rank = lambda raw: None
    try:
        return report._rank_from_dict(raw, i)
    finally:
        report._fast_rank = saved


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
]


@pytest.mark.parametrize("mutate", [None, *MUTATIONS])
def test_fast_path_agrees_with_the_checking_path(mutate):
    raw = good()
    if mutate is not None:
        mutate(raw)
    fast = report._fast_rank(copy.deepcopy(raw))
    try:
        expected = slow(copy.deepcopy(raw))
    except report.ReportError:
        assert fast is None
        return
    assert fast is None or fast == expected
    assert report._rank_from_dict(raw, 0) == expected


def test_fast_path_is_taken_for_agent_reports():
    assert report._fast_rank(good()) == slow(good())
    rng = random.Random(1)
    raw = good()
    raw["heartbeat_age_s"] = rng.random()
    assert report._fast_rank(raw) is not None
