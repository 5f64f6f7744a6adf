"""Request handling without HTTP: authenticate, decode, validate, accept.

``handle_report`` maps every way a report can be bad to a status code, a JSON
``{"error": ...}`` and a counter reason, and never raises: the property tests
drive it with arbitrary bytes. The HTTP layer (``server.py``) only moves bytes.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Mapping
from email.message import Message
from typing import Any

from ... import jobtoken, launcherexit, logs
from ...contracts.report import typed
from ...report import (
    MAX_ACKS_PER_REPORT,
    MAX_COUNT,
    MAX_INTERVAL_S,
    MAX_WORLD_SIZE,
    MIN_INTERVAL_S,
    REPORT_VERSIONS,
    HostReport,
    ReportError,
    rank_problem,
)
from ...stepstats.steps import summary_config
from . import jsonbody
from .coordinator_protocol import ServedCoordinator, WrongJob

__all__ = ["MAX_WORLD_SIZE", "ReportHandler", "authorized", "decode", "validate"]
# request headers: a plain dict in tests, http.server's message on the wire
Headers = Mapping[str, str] | Message
Reply = tuple[int, dict[str, Any], str]  # (HTTP status, JSON body, counter reason or "" if accepted)
_VERSIONS = ", ".join(map(str, REPORT_VERSIONS))


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
    given = cred.strip().encode("utf-8", "replace")
    # compare_digest: the time taken must not tell an attacker how much matched. Agents
    # send the derived credential (jobtoken.bearer); a person with the token file may send it.
    derived = hmac.compare_digest(given, jobtoken.bearer(token).encode("ascii"))
    return (derived or hmac.compare_digest(given, token.encode("utf-8"))) and scheme.lower() == "bearer"


def decode(body: bytes) -> Any:
    """JSON, strictly: NaN/Infinity would poison every age computed from them."""
    return jsonbody.loads(body)


def validate(report: HostReport, ranks_checked: bool = False) -> None:
    """What the schema cannot say about the report as a whole: numbers in range.
    (Each rank is range-checked on its own, ``report.rank_problem``, and dropped
    alone: ``ranks_checked`` when ``from_dict`` did that already.)"""
    if not (math.isfinite(report.interval_s) and MIN_INTERVAL_S <= report.interval_s <= MAX_INTERVAL_S):
        raise ReportError(
            f"report: interval_s must be in {MIN_INTERVAL_S}..{MAX_INTERVAL_S:.0f} s, got {report.interval_s!r}"
        )
    if not (math.isfinite(report.sent_wall) and 0 <= report.sent_wall < 1e11):
        raise ReportError("report: sent_wall must be a finite epoch time")
    if not 0 <= report.seq < MAX_COUNT:
        raise ReportError(f"report: seq must be an integer in 0..2^62, got {report.seq}")
    for i, r in enumerate(() if ranks_checked else report.ranks):  # a caller that built the report itself
        problem = rank_problem(r)
        if problem:
            raise ReportError(f"ranks[{i}]: {problem}")


class ReportHandler:
    def __init__(self, coordinator: ServedCoordinator, token: str) -> None:
        self.coordinator = coordinator
        self.token = token
        self.log = logs.get("watchdog.coordinator")
        self._limit = logs.RateLimited(every_s=60.0)
        self._summary_config = list(summary_config(coordinator.cfg.detectors))
        read = coordinator.metrics.reports_read
        self._one_pass, self._checked = read.labels("one_pass"), read.labels("checked")

    def reject(self, status: int, reason: str, message: str, now: float, peer: str = "") -> Reply:
        self.coordinator.metrics.rejected.labels(reason).inc()
        first, suppressed = self._limit.should_log(reason, now)
        if first:
            self.log.warning(
                "report_rejected", reason=reason, status=status, error=message[:300], peer=peer, suppressed=suppressed
            )
        return status, {"error": message}, reason

    def _dropped(self, report: HostReport, dropped: list[tuple[int, Any, str]], now: float, peer: str) -> None:
        """Bad rank entries are left out, the rest of the host's report is kept:
        counted, and logged by name (rate-limited per host)."""
        self.coordinator.metrics.ranks_dropped.inc(len(dropped))
        first, suppressed = self._limit.should_log(f"ranks_dropped:{report.host[:80]}", now)
        if first:
            self.log.warning(
                "report_ranks_dropped",
                host=report.host,
                peer=peer,
                dropped=len(dropped),
                kept=len(report.ranks),
                ranks=[str(r)[:20] for _, r, _ in dropped[:16]],
                error=dropped[0][2],
                suppressed=suppressed,
            )

    def _too_many_acks(self, n: int, now: float, peer: str, host: Any) -> None:
        self.coordinator.metrics.acks_dropped.inc(n - MAX_ACKS_PER_REPORT)
        first, suppressed = self._limit.should_log(f"acks_dropped:{str(host)[:80]}", now)
        if first:
            self.log.warning(
                "report_acks_dropped",
                host=str(host)[:80],
                peer=peer,
                acks=n,
                kept=MAX_ACKS_PER_REPORT,
                suppressed=suppressed,
            )

    def handle(self, headers: Headers, body: bytes, now: float, peer: str = "") -> Reply:
        if not authorized(self.token, headers):
            return self.reject(401, "unauthorized", "missing or wrong bearer token", now, peer)
        dropped: list[tuple[int, Any, str]] = []
        # An agent's usual report in one pass; None for anything else: read below, with its drops and messages.
        report = typed.read(body)
        (self._checked if report is None else self._one_pass).inc()
        if report is None:
            got = self._read(body, dropped, now, peer)
            if not isinstance(got, HostReport):
                return got
            report = got
        try:
            validate(report, ranks_checked=True)
        except ReportError as exc:
            return self.reject(400, "schema", str(exc), now, peer)
        try:
            reply = self.coordinator.accept(report, now)
        except WrongJob as exc:
            return self.reject(409, "wrong_job", str(exc), now, peer)
        # Added field: the versions this coordinator reads. An agent sends version 2
        # only after a reply listing it, so an older coordinator keeps getting version 1.
        reply["report_versions"] = list(REPORT_VERSIONS)
        # Added field: the settings under which agents may compute their ranks' step
        # statistics and send them (watchdog.contracts.stepsummary); an older agent ignores it.
        reply["step_summary_config"] = self._summary_config
        if dropped:  # added field: the agent can see which entries were left out and why
            self._dropped(report, dropped, now, peer)
            reply["dropped"] = [
                {"index": i, "rank": r if isinstance(r, int) else None, "error": e[:200]} for i, r, e in dropped[:16]
            ]
        return 200, reply, ""

    def handle_launcher_exit(self, headers: Headers, body: bytes, now: float, peer: str = "") -> Reply:
        """``watchdog run``'s word that a host's launcher exited (launcherexit.py)."""
        if not authorized(self.token, headers):
            return self.reject(401, "unauthorized", "missing or wrong bearer token", now, peer)
        try:
            obj = decode(body)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            return self.reject(400, "bad_json", f"body is not valid JSON: {exc}"[:500], now, peer)
        try:
            ex = launcherexit.parse(obj)
        except ValueError as exc:
            return self.reject(400, "schema", str(exc)[:500], now, peer)
        try:
            self.coordinator.launcher_exited(ex.job, ex.host, ex.pid, ex.status, now)
        except WrongJob as exc:
            return self.reject(409, "wrong_job", str(exc), now, peer)
        return 200, {"ok": True}, ""

    def _read(self, body: bytes, dropped: list[tuple[int, Any, str]], now: float, peer: str) -> HostReport | Reply:
        """The report in ``body`` (the ranks it drops noted in ``dropped``), or the reply refusing it."""
        try:
            obj = decode(body)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            return self.reject(400, "bad_json", f"body is not valid JSON: {exc}"[:500], now, peer)
        if not isinstance(obj, dict):
            return self.reject(400, "schema", "report must be a JSON object", now, peer)
        v = obj.get("v")
        if type(v) is not int or v not in REPORT_VERSIONS:  # 1.0 and true are not version 1
            return self.reject(
                400,
                "version",
                f"unsupported report version {obj.get('v')!r}; this coordinator reads {_VERSIONS}",
                now,
                peer,
            )
        acks = obj.get("acks")
        if isinstance(acks, list) and len(acks) > MAX_ACKS_PER_REPORT:
            self._too_many_acks(len(acks), now, peer, obj.get("host"))
            obj = {**obj, "acks": acks[:MAX_ACKS_PER_REPORT]}
        try:
            return HostReport.from_dict(obj, dropped)  # drops each rank that rank_problem refuses
        except ReportError as exc:
            return self.reject(400, "schema", str(exc), now, peer)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            # The schema code should turn these into ReportError; never a 500 for bad input.
            return self.reject(400, "schema", f"invalid report: {type(exc).__name__}: {exc}"[:500], now, peer)
