"""Periodic stalls: the same rank holding the job up at a regular step interval.

Real scripts evaluate, checkpoint or log on one rank every N steps while the
others wait. Once that has happened twice at the same interval on the same rank,
in the same place, the next time is expected: it is worth saying once ("rank 0
holds the job ~6 s every 1,000 steps in eval: mark it or raise the allowance"),
never paging and never acting on, and it is no straggler.

Pure: ``patterns`` is a function of the occurrences it is given (the step, the
rank, the cost and where: a phase, a frame).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from ...stepstats import stats

MIN_OCCURRENCES = 3  # the first one, and two more at the same interval
TOLERANCE = 0.1  # of the period, at least one step: an interval counts as "the same"
MIN_PERIOD = 4  # steps: a rank stalling more often than that is slow, not on a schedule
# seconds one occurrence costs the job (median): a tiny model's torch.save every 5 steps
# "held the job ~0.0 s" and was said, on a healthy run; under this it is a step's jitter
MIN_COST_S = 0.1
# Where a heartbeat freeze is (stalls.Stalls.beat): the rank's main thread held the GIL, so
# neither its heartbeat nor its frame sampler could run.
FREEZE_WHERE = "with its heartbeat frozen (a call that holds the GIL)"


@dataclass(frozen=True)
class Occurrence:
    rank: int
    step: int  # the step it held up
    cost_s: float  # the job's wall time it cost (the others' wait)
    where: str  # the phase or frame it was in ("eval", "estimate_loss (train.py)"): what groups them
    frame: str = ""  # the frame as sampled, line included ("estimate_loss (train.py:41)"), for people
    lines: tuple[int, ...] = ()  # the lines of ``where`` sampled during it (a loop's body shows several)


def frame_key(frame: str) -> str:
    """The frame without its line: ``estimate_loss (train.py:41)`` and
    ``estimate_loss (train.py:44)`` are one place (a loop in one function
    samples at different lines)."""
    head, colon, tail = frame.rpartition(":")
    return f"{head})" if colon and tail.endswith(")") and tail[:-1].isdigit() else frame


def frame_line(frame: str) -> int | None:
    """The line of ``function (file.py:line)``; None for a phase or an odd text."""
    _, colon, tail = frame.rpartition(":")
    return int(tail[:-1]) if colon and tail.endswith(")") and tail[:-1].isdigit() else None


@dataclass(frozen=True)
class Pattern:
    rank: int
    period: int  # steps between occurrences
    cost_s: float  # median cost of one occurrence
    where: str
    occurrences: int
    first_step: int
    last_step: int
    frame: str = ""  # the newest occurrence's frame as sampled, when it was a frame

    def describe(self) -> str:
        if self.where == FREEZE_WHERE:  # its hook could not sample it: the frame is the step's, if any
            where = FREEZE_WHERE + (f", in the step it spent in {self.frame}" if self.frame else "")
        else:
            where = f"in {self.frame or self.where}"
        return (
            f"rank {self.rank} holds the job ~{self.cost_s:.1f} s every {self.period:,} steps {where} "
            f"({self.occurrences} times since step {self.first_step}): expected work it does alone; "
            "mark it (mon.phase) or raise the allowance"
        )


def regular(steps: Sequence[int], tolerance: float = TOLERANCE) -> int | None:
    """The period of ``steps`` (sorted, distinct) if every gap is within
    ``tolerance`` of their median (at least one step), else None."""
    if len(steps) < 2:
        return None
    gaps = [b - a for a, b in pairwise(steps)]
    period = round(stats.median(gaps))
    if period <= 0:
        return None
    slack = max(1.0, tolerance * period)
    return period if all(abs(g - period) <= slack for g in gaps) else None


def patterns(occurrences: Iterable[Occurrence], minimum: int = MIN_OCCURRENCES) -> list[Pattern]:
    """Per (rank, where): a pattern when every occurrence noted is on one regular
    interval of at least ``MIN_PERIOD`` steps, ``minimum`` of them or more, each
    costing the job ``MIN_COST_S`` or more (median).
    Strict on purpose: a rank slow at random steps (a noisy neighbour, a slow
    host) has stalls that now and then line up, and one off-schedule stall
    among them means it is not only a schedule. A schedule that changed says
    nothing until the old occurrences have left the window."""
    by: dict[tuple[int, str], dict[int, float]] = defaultdict(dict)
    frames: dict[tuple[int, str], str] = {}
    for o in occurrences:
        by[(o.rank, o.where)][o.step] = o.cost_s
        if o.frame:
            frames[(o.rank, o.where)] = o.frame
    out = []
    for (rank, where), costs in sorted(by.items()):
        steps = sorted(costs)
        period = regular(steps) if len(steps) >= minimum else None
        if period is None or period < MIN_PERIOD:
            continue
        cost_s = stats.median([costs[s] for s in steps])
        if cost_s < MIN_COST_S:
            continue
        out.append(
            Pattern(
                rank=rank,
                period=period,
                cost_s=cost_s,
                where=where,
                occurrences=len(steps),
                first_step=steps[0],
                last_step=steps[-1],
                frame=frames.get((rank, where), ""),
            )
        )
    return out
