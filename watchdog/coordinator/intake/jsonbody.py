"""A report body's JSON, read by orjson where it gives what the standard
library gives, and by the standard library everywhere else.

At 16,384 ranks the coordinator reads 2,048 bodies of ~6-9 KB a second; the
standard library's parser took ~90-130 us of each, orjson ~20 (measured on the
scale simulator's reports). Every accepted report is decoded, so that is ~0.2
of a core at that size.

The result must be the same value, to the type: the schema tells an integer
from a float, and hostile input must meet the same checks with the same
messages as before. orjson differs from ``json.loads`` in two ways, each sent
to the standard library:

- what orjson refuses and the standard library reads: a number too large for a
  double (``1e400``: the standard library gives inf, which the schema then
  refuses), a lone surrogate escape (``"\\ud800"``); orjson raises, and the
  body is read again by the standard library, which also gives every error its
  usual message;
- an integer past 64 bits (``2^64``, ``-2^63 - 1``): orjson gives a float where
  the standard library gives the exact integer. Bodies with any run of 19
  digits or more that is not a fraction or an exponent (an integer of 10^18 or
  more, a float's long integer part, or digits in a string) are read by the
  standard library without trying orjson; the agents' reports carry no such
  number (counts stop at 2^62, times are floats).

A ``--no-deps`` install without orjson reads every body with the standard library.
tests/test_coord_jsonbody.py compares both readers on random and hostile bodies."""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - a --no-deps install: the standard library alone
    orjson = None  # type: ignore[assignment]

# Digits become "0"; the characters that continue a number past its integer part
# (fraction, exponent) become "x"; everything else a space. An integer literal of 19
# digits or more then reads as a space (or the body's start) and 19 zeros.
_SHAPE = bytes(ord("0") if c in b"0123456789" else ord("x") if c in b".eE" else ord(" ") for c in range(256))
_LONG = b"0" * 19


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads_stdlib(body: bytes) -> Any:
    """JSON, strictly: NaN/Infinity would poison every age computed from them."""
    return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)


def has_long_integer(body: bytes) -> bool:
    """Whether ``body`` has a run of 19+ digits not preceded by a digit, "." or an exponent's "e"."""
    shape = body.translate(_SHAPE)
    return shape.startswith(_LONG) or b" " + _LONG in shape


def loads(body: bytes) -> Any:
    """What ``loads_stdlib`` gives (the same value and types, or the same error), faster."""
    if orjson is None or has_long_integer(body):
        return loads_stdlib(body)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:  # what orjson refuses: read again, for the standard library's value or error
        return loads_stdlib(body)
