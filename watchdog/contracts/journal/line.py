"""A journal record as one line of JSON: non-finite floats as null (JSON has
none, and a journal line must stay parseable by anything), keys as strings,
tuples and sets as lists, anything else as its ``str``.

orjson writes that by itself where it can, ~10-20x faster than cleaning the
record in Python and encoding it with the standard library: after a hang at
16,384 ranks the coordinator journals ~6,000 commands and their outcomes, each
carrying the finding's rank list, and cleaning and encoding them was most of
its CPU for tens of seconds while reports queued. A record orjson refuses (a
key that is not a string, an integer past 64 bits, a lone surrogate) is
written by the standard library, as before. The lines differ in form only (orjson
leaves non-ASCII unescaped and writes ``1e-5`` for ``1e-05``), never in the
values a reader gets: tests/test_coord_journal_line.py compares both on random
and hostile records. A ``--no-deps`` install without orjson uses the standard
library alone.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - a --no-deps install: the standard library alone
    orjson = None  # type: ignore[assignment]

# Dataclasses and datetimes to ``default`` (their str, as the standard library path
# writes them), not orjson's own rendering of them.
_OPTIONS = (
    orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_APPEND_NEWLINE if orjson else 0
)


def _default(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def line_stdlib(record: dict[str, Any]) -> bytes:
    return json.dumps(_clean(record), default=_default, separators=(",", ":")).encode() + b"\n"


def line(record: dict[str, Any]) -> bytes:
    """``record`` as one JSON line, newline included."""
    if orjson is not None:
        try:
            return orjson.dumps(record, default=_default, option=_OPTIONS)
        except TypeError:  # orjson.JSONEncodeError is one
            pass
    return line_stdlib(record)


# -- the per-line MAC ------------------------------------------------------------------
#
# A journal line written with a job token ends in ``,"mac":"<32 hex>"}``: HMAC-SHA256
# (truncated to 128 bits) of the same line without that field, keyed by the token under
# a domain of its own (a journal MAC is never valid as a command signature). A line
# appended by anyone without the token is told apart on replay (control/replay.py). The rest of
# the line is byte for byte what it is without a token.

MAC_DOMAIN = b"rank-watchdog journal line v1\n"
_MAC_HEX = 32
_MAC_OPEN = b',"mac":"'
_MAC_TAIL = len(_MAC_OPEN) + _MAC_HEX + 2  # ,"mac":"<hex>"}


def _mac(body: bytes, key: bytes) -> bytes:
    return hmac.new(key, MAC_DOMAIN + body, hashlib.sha256).hexdigest()[:_MAC_HEX].encode()


def sign(line_bytes: bytes, key: bytes) -> bytes:
    """``line_bytes`` (one record, newline included) with its MAC as the last field."""
    body = line_bytes.rstrip(b"\n")
    return body[:-1] + _MAC_OPEN + _mac(body, key) + b'"}\n'


def verify(raw: bytes, key: bytes) -> bool | None:
    """True: the line carries a MAC made with ``key``; False: it carries a wrong one;
    None: it carries none (a journal written without a token, or before MACs)."""
    body = raw.rstrip(b"\r\n")
    if len(body) <= _MAC_TAIL or body[-_MAC_TAIL : -_MAC_TAIL + len(_MAC_OPEN)] != _MAC_OPEN:
        return None
    got, unsigned = body[-_MAC_HEX - 2 : -2], body[:-_MAC_TAIL] + b"}"
    return hmac.compare_digest(got, _mac(unsigned, key))
