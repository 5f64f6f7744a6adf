"""The coordinator reads report bodies with orjson where it gives what the
standard library gives: the same value to the type (an integer stays an
integer, -0.0 stays -0.0), or the same error with the same message, on random
and hostile bodies. The schema's checks and messages depend on both."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from watchdog.coordinator import testing as t
from watchdog.coordinator.intake import jsonbody
from watchdog.report import as_rows

pytestmark = pytest.mark.skipif(jsonbody.orjson is None, reason="orjson not installed: the standard library reads all")


def same(a, b) -> bool:
    """Equal values of equal types all the way down (True != 1, 0.0 != -0.0, 1 != 1.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return math.copysign(1.0, a) == math.copysign(1.0, b) and (a == b or (a != a and b != b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


def outcome(read, body: bytes):
    try:
        return "ok", read(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return type(exc).__name__, str(exc)


def assert_read_alike(body: bytes) -> None:
    fast, plain = outcome(jsonbody.loads, body), outcome(jsonbody.loads_stdlib, body)
    assert fast[0] == plain[0], (body[:200], fast, plain)
    assert same(fast[1], plain[1]) if fast[0] == "ok" else fast[1] == plain[1], (body[:200], fast, plain)


numbers = st.one_of(
    st.integers(),  # hypothesis reaches far past 64 bits
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=-1e-3, max_value=1e-3, allow_nan=False),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(), st.text(st.characters(codec=None)))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.dictionaries(st.text(), inner, max_size=6)),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(values, st.booleans())
def test_random_json_reads_alike(value, ascii_only):
    assert_read_alike(json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_read_alike(body):
    assert_read_alike(body)


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": 1, "a": 2}',  # the last of duplicate keys
        b"[1e400, -1e400]",  # past a double: inf from the standard library, refused by the schema later
        b"[1.7976931348623159e308]",
        b"[1e-400, -0, -0.0, 4.9e-324, 2.2250738585072011e-308]",
        b"[18446744073709551615, 18446744073709551616, -9223372036854775808, -9223372036854775809]",
        b"[1180591620717411303424]",  # 2^70: an integer, for the range check's message
        b"1180591620717411303424",
        b'{"seq": -1180591620717411303424}',
        b"[12345678901234567890.5, 0.0012345678901234567, 1e0000000000000000000001]",
        b'"\\ud800"',  # a lone surrogate escape
        b'["\\udc00x", "\\u00e9"]',
        b'{"x": NaN}',
        b'{"x": Infinity}',
        b'{"x": -Infinity}',
        b"\xef\xbb\xbf{}",  # a byte order mark
        b'{"x": "\xff"}',  # not UTF-8
        b'{"x": "a\x01b"}',  # a raw control character in a string
        b"[1,]",
        b"",
        b"   ",
        b"[" * 5000 + b"]" * 5000,  # deeper than orjson's limit
        b'{"x": 1} trailing',
        b"\t\n\r [1]\t\n\r ",
    ],
)
def test_bodies_orjson_reads_differently_read_as_the_standard_library_does(body):
    assert_read_alike(body)


def test_hostile_mutations_of_a_real_report_read_alike():
    states = [t.rank(r, world_size=16, step=1_000 + r) for r in range(8)]
    body = json.dumps(as_rows(t.report("h0", states, sent_wall=1_764_575_674.123).to_dict())).encode()
    rng = random.Random(3)
    for _ in range(2_000):
        b = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            op = rng.random()
            if op < 0.4:
                b[i] = rng.randrange(256)
            elif op < 0.7:
                b[i:i] = rng.choice([b"NaN", b"1e400", b"99999999999999999999", b'"\\ud800"', b"-", b".5", b"\x00"])
            else:
                del b[i : i + rng.randint(1, 8)]
        assert_read_alike(bytes(b))


def test_a_report_is_read_by_orjson():
    """The point of it all: an agent's report has no integer of 19 digits, so the fast reader takes it."""
    states = [t.rank(r, world_size=16_384, step=10**9 + r) for r in range(8)]
    for body in (t.report("h0", states, sent_wall=1_764_575_674.123456).to_dict(),):
        for shaped in (body, as_rows(body)):
            raw = json.dumps(shaped, separators=(",", ":")).encode()
            assert not jsonbody.has_long_integer(raw)
            assert_read_alike(raw)
    assert jsonbody.has_long_integer(b'{"seq":1180591620717411303424}')
    assert jsonbody.has_long_integer(b"[-9223372036854775809]")
    assert not jsonbody.has_long_integer(b"[0.00012345678901234567, 1e0000000000000000000001]")
