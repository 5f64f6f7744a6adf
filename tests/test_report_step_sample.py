"""``report.step_sample`` builds the StepSamples of every report without the
frozen ``__init__``, and ``report.made`` the other objects the coordinator
builds per rank per report (RankState, FoldedRank, StepStats): what they give
must be like any other instance, since the coordinator keeps them, compares,
hashes and replaces them."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from watchdog.coordinator import testing
from watchdog.coordinator.view.cluster import FoldedRank
from watchdog.report import HostReport, RankState, StepSample, as_rows, made, step_sample
from watchdog.stepstats.steps import StepStats, add_samples

_FLOATS = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
_FULL = st.tuples(
    st.integers(0, 1 << 62), _FLOATS, _FLOATS, _FLOATS, st.sampled_from(["train", "eval", "checkpoint"]),
    st.integers(0, 1 << 40), _FLOATS, _FLOATS, _FLOATS, _FLOATS,
)  # fmt: skip


@given(_FULL, st.integers(4, 10))
def test_equal_to_the_one_init_builds(values: tuple, n: int) -> None:
    got, want = step_sample(*values[:n]), StepSample(*values[:n])
    assert type(got) is StepSample
    assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
    assert dataclasses.astuple(got) == dataclasses.astuple(want)  # defaults filled in alike
    assert pickle.loads(pickle.dumps(got)) == want
    assert copy.copy(got) == want


def test_frozen_like_any_other() -> None:
    got = step_sample(3, 0.2, 0.01, 0.02, "train")
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.step = 4  # type: ignore[misc]
    # A new attribute fails as on one __init__ built (TypeError from the frozen
    # __setattr__ of a slots dataclass on Python 3.11, AttributeError on others).
    for x in (got, StepSample(3, 0.2, 0.01, 0.02, "train")):
        with pytest.raises((AttributeError, TypeError)):
            x.extra = 1  # type: ignore[attr-defined]
        assert not hasattr(x, "__dict__")
    assert dataclasses.replace(got, step=4) == StepSample(4, 0.2, 0.01, 0.02, "train")


def test_missing_field_is_an_error_as_with_init() -> None:
    with pytest.raises(TypeError):
        step_sample(3, 0.2)


def test_reports_decode_to_such_samples() -> None:
    """Both report forms give exact StepSamples, equal to those the values make."""
    steps: list[dict[str, Any]] = [  # a sample's fields as JSON carries them
        {"step": 7, "step_s": 0.25, "data_s": 0.01, "coll_s": 0.03, "phase": "train"},
        {"step": 8, "step_s": 0.5, "data_s": 0.0, "coll_s": 0.0, "phase": "eval"},
    ]
    want = tuple(StepSample(**x) for x in steps)
    body = json.loads(json.dumps(testing.report("h", [testing.rank(0, step=8, recent_steps=want)]).to_dict()))
    for form in (body, as_rows(body)):
        got = HostReport.from_dict(form).ranks[0].recent_steps
        assert [type(x) for x in got] == [StepSample, StepSample]
        assert got == want


def _values(obj) -> tuple:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))


@pytest.mark.parametrize(
    "want",
    [
        testing.rank(3, recent_steps=testing.steps(1, 4), death={"summary": "x"}),
        FoldedRank(state=testing.rank(5), host="h", received_at=1.0, registered_at=0.5, progress_at=0.9,
                   last_alive_at=1.0, died_at=2.0),
        add_samples(StepStats(), testing.steps(1, 40), testing.DetectorConfig()),
    ],
    ids=["RankState", "FoldedRank", "StepStats"],
)  # fmt: skip
def test_made_gives_what_init_gives(want) -> None:
    cls = type(want)
    got = made(cls, *_values(want))
    assert type(got) is cls and not hasattr(got, "__dict__")
    assert got == want and repr(got) == repr(want) and _values(got) == _values(want)
    if cls is not FoldedRank:  # FoldedRank holds arrays (its loss history): not hashable, as through __init__
        assert hash(got) == hash(want)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(got, dataclasses.fields(got)[0].name, None)
    assert dataclasses.replace(got) == want
    assert copy.copy(got) == want
    try:  # fields left out: their defaults, or an error where one has none, as with __init__
        bare = cls()
    except TypeError:
        with pytest.raises(TypeError):
            made(cls)
    else:
        assert made(cls) == bare


def test_rank_states_of_every_report_are_such() -> None:
    rep = HostReport.from_dict(
        json.loads(
            json.dumps(as_rows(testing.report("h", [testing.rank(3, recent_steps=testing.steps(1, 4))]).to_dict()))
        )
    )
    assert type(rep.ranks[0]) is RankState and rep.ranks[0] == testing.rank(3, recent_steps=testing.steps(1, 4))
