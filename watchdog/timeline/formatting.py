"""Formatting shared by the text and HTML renderers."""

from __future__ import annotations

import time

from watchdog.contracts.finding import seconds

from .model import Lane, Section, StepSpan

__all__ = ["clock", "date", "finding_times", "ordered_lanes", "seconds", "step_summary"]


def clock(t: float | None) -> str:
    """Local wall-clock time of day with milliseconds: what a person matches against logs."""
    if not t:
        return "?"
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"


def date(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t)) if t else "?"


def step_summary(steps: list[StepSpan]) -> str:
    """Mean step and its split over the given steps: '64 ms = data 1 + coll 10 + compute 53'."""
    if not steps:
        return "no steps recorded"
    n = len(steps)
    mean = lambda f: sum(f(s) for s in steps) / n  # noqa: E731
    total = mean(lambda s: s.end - s.start)
    return (
        f"{seconds(total)} = data {seconds(mean(lambda s: s.data_s))} + coll {seconds(mean(lambda s: s.coll_s))}"
        f" + compute {seconds(mean(lambda s: s.compute_s))}"
    )


def ordered_lanes(sec: Section) -> list[Lane]:
    """Culprits first (the reader's first question), then every other rank in order."""
    culprits = set(sec.culprits())
    lanes = list(sec.lanes.values())
    return sorted(lanes, key=lambda lane: (lane.rank not in culprits, lane.rank))


def finding_times(rec: dict) -> tuple[float | None, float | None]:
    onset, detected = rec.get("onset_wall"), rec.get("detected_wall")
    ok = lambda v: float(v) if isinstance(v, (int, float)) and v > 0 else None  # noqa: E731
    return ok(onset), ok(detected) or ok(rec.get("t_wall"))


def latest_split(sec: Section) -> str:
    """The finer split of compute (forward, backward, optimizer, host-to-device)
    the coordinator last measured in this section: the goodput record's verdict
    evidence (fresher), else the last verdict's; "" when no rank measured it."""
    from watchdog.coordinator.performance.verdict import split_line

    g = sec.goodput or {}
    for ev in (g.get("verdict_evidence"), *(v.get("evidence") for v in reversed(sec.verdicts))):
        line = split_line(ev) if isinstance(ev, dict) else ""
        if line:
            return line
    return ""
