"""Request handling without HTTP: authenticate, decode, validate, accept.

``handle_report`` maps every way a report can be bad to a status code, a JSON
``{"error": ...}`` and a counter reason, and never raises: the property tests
drive it with arbitrary bytes. The HTTP layer (``server.py``) only moves bytes.
"""

from __future__ import annotations

import hmac
import json
import math
from email.message import Message
from typing import Any, Mapping, Union

from .. import logs
from ..report import REPORT_VERSION, HostReport, ReportError
from .service import Coordinator, WrongJob

MAX_WORLD_SIZE = 1 << 20  # every per-rank structure is sized by it
# request headers: a plain dict in tests, http.server's message on the wire
Headers = Union[Mapping[str, str], Message]
Reply = tuple[int, dict[str, Any], str]  # (HTTP status, JSON body, counter reason or "" if accepted)


def header(headers: Headers, name: str) -> str:
    """Case-insensitive lookup in a plain dict or an http.client message."""
    get = getattr(headers, "get", None)
    val = get(name) if get else None
    if val is None:
        low = name.lower()
        val = next((v for k, v in headers.items() if k.lower() == low), None)
    return val or ""


def authorized(token: str, headers: Headers) -> bool:
    if not token:
        return True
    got = header(headers, "Authorization")
    scheme, _, cred = got.partition(" ")
    # compare_digest: the time taken must not tell an attacker how much matched.
    return hmac.compare_digest(cred.strip().encode("utf-8", "replace"), token.encode("utf-8")) and scheme.lower() == "bearer"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode(body: bytes) -> Any:
    """JSON, strictly: NaN/Infinity would poison every age computed from them."""
    return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)


def validate(report: HostReport) -> None:
    """What the schema cannot say: numbers in range, one entry per rank."""
    if not (math.isfinite(report.interval_s) and report.interval_s > 0):
        raise ReportError("report: interval_s must be > 0")
    if not math.isfinite(report.sent_wall):
        raise ReportError("report: sent_wall must be finite")
    seen: set[int] = set()
    for i, r in enumerate(report.ranks):
        if r.world_size > MAX_WORLD_SIZE:
            raise ReportError(f"ranks[{i}]: world_size {r.world_size} is above the supported {MAX_WORLD_SIZE}")
        if r.rank in seen:
            raise ReportError(f"ranks[{i}]: rank {r.rank} appears twice in one report")
        seen.add(r.rank)
        for name in ("step_age_s", "heartbeat_age_s", "phase_age_s", "pg_age_s", "data_wait_age_s",
                     "last_step_s", "last_data_s", "last_coll_s"):
            val = getattr(r, name)
            if not (math.isfinite(val) and 0 <= val < 1e9):
                raise ReportError(f"ranks[{i}]: {name} must be a finite number >= 0, got {val!r}")
        if not (math.isfinite(r.coll.since_s) and r.coll.since_s >= 0):
            raise ReportError(f"ranks[{i}].coll: since_s must be a finite number >= 0")
        for j, x in enumerate(r.recent_steps):
            if not all(math.isfinite(v) and 0 <= v < 1e9 for v in (x.step_s, x.data_s, x.coll_s)):
                raise ReportError(f"ranks[{i}].recent_steps[{j}]: durations must be finite numbers >= 0")


class ReportHandler:
    def __init__(self, coordinator: Coordinator, token: str) -> None:
        self.coordinator = coordinator
        self.token = token
        self.log = logs.get("watchdog.coordinator")
        self._limit = logs.RateLimited(every_s=60.0)

    def reject(self, status: int, reason: str, message: str, now: float, peer: str = "") -> Reply:
        self.coordinator.metrics.rejected.labels(reason).inc()
        first, suppressed = self._limit.should_log(reason, now)
        if first:
            self.log.warning("report_rejected", reason=reason, status=status, error=message[:300], peer=peer, suppressed=suppressed)
        return status, {"error": message}, reason

    def handle(self, headers: Headers, body: bytes, now: float, peer: str = "") -> Reply:
        if not authorized(self.token, headers):
            return self.reject(401, "unauthorized", "missing or wrong bearer token", now, peer)
        try:
            obj = decode(body)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            return self.reject(400, "bad_json", f"body is not valid JSON: {exc}"[:500], now, peer)
        if not isinstance(obj, dict):
            return self.reject(400, "schema", "report must be a JSON object", now, peer)
        v = obj.get("v")
        if type(v) is not int or v != REPORT_VERSION:  # 1.0 and true are not version 1
            return self.reject(400, "version", f"unsupported report version {obj.get('v')!r}; this coordinator speaks {REPORT_VERSION}", now, peer)
        try:
            report = HostReport.from_dict(obj)
            validate(report)
        except ReportError as exc:
            return self.reject(400, "schema", str(exc), now, peer)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            # The schema code should turn these into ReportError; never a 500 for bad input.
            return self.reject(400, "schema", f"invalid report: {type(exc).__name__}: {exc}"[:500], now, peer)
        try:
            return 200, self.coordinator.accept(report, now), ""
        except WrongJob as exc:
            return self.reject(409, "wrong_job", str(exc), now, peer)
