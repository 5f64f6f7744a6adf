"""A journal line by orjson is the standard library's line, value for value, on
random and hostile records; what orjson refuses still gets written."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math
import random

import pytest

from watchdog.contracts.journal import line as jl

pytestmark = pytest.mark.skipif(jl.orjson is None, reason="orjson not installed")


class State(str, enum.Enum):
    IDLE = "idle"


@dataclasses.dataclass(frozen=True)
class Point:
    x: float


class Opaque:
    def __str__(self) -> str:
        return "opaque!"


def _value(rng: random.Random, depth: int):
    kinds = ["int", "float", "odd_float", "str", "bool", "none", "enum", "obj"]
    if depth < 3:
        kinds += ["dict", "list", "tuple", "set"]
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.choice((0, -1, 7, 2**62, -(2**63)))
    if kind == "float":
        return rng.choice((0.5, 1e-05, 1e16, -3.25, 1796183591.373746, 0.1 + 0.2))
    if kind == "odd_float":
        return rng.choice((math.nan, math.inf, -math.inf))
    if kind == "str":
        return rng.choice(("", "rank 3", "héllo ✓", 'quote " and \\ backslash', "\n\t"))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "enum":
        return State.IDLE
    if kind == "obj":
        return rng.choice((Opaque(), Point(1.5), datetime.datetime(2026, 12, 2, 4, 30)))
    n = rng.randrange(4)
    if kind == "dict":
        return {f"k{i}": _value(rng, depth + 1) for i in range(n)}
    if kind == "set":
        return {rng.randrange(100) for _ in range(n)}
    items = [_value(rng, depth + 1) for _ in range(n)]
    return tuple(items) if kind == "tuple" else items


def test_orjson_lines_read_back_as_the_standard_librarys_on_random_records():
    rng = random.Random(13)
    for _ in range(3000):
        rec = {"event": "x", "t_wall": 1.5, **{f"f{i}": _value(rng, 0) for i in range(rng.randrange(6))}}
        fast, slow = jl.line(rec), jl.line_stdlib(rec)
        assert fast.endswith(b"\n") and fast.count(b"\n") == 1
        assert json.loads(fast) == json.loads(slow), rec


@pytest.mark.parametrize(
    "rec",
    [
        {"event": "x", "detail": {3: "int key"}},  # orjson refuses non-string keys
        {"event": "x", "big": 2**70},  # past 64 bits
        {"event": "x", "s": "\ud800"},  # a lone surrogate
        {"event": "x", "nested": [{"k": {(1, 2): 1}}]},
    ],
    ids=["int key", "big int", "surrogate", "tuple key"],
)
def test_what_orjson_refuses_is_written_by_the_standard_library(rec):
    assert jl.line(rec) == jl.line_stdlib(rec)
    assert json.loads(jl.line(rec))["event"] == "x"
