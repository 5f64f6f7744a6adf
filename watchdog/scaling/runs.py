"""Runs of one job at several world sizes -> its scaling table.

Each journal's last ``goodput`` record (the coordinator writes one every minute
and one at stop) carries the job's mean step split: wall step time, the median
rank's compute, collective time and data wait, over the steps it accounted
(warm-up steps left out), and the world size. Runs at the same world size are
combined by their median.

Efficiency, against the smallest world size measured (``base``):

- weak scaling (the default: each rank keeps its batch, so the global batch
  grows with the world): throughput is ranks / step time, and efficiency is
  step_base / step_N;
- strong scaling (``--strong``: the global batch is fixed, each rank's share
  shrinks): efficiency is (step_base x base) / (step_N x N).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.stepstats.stats import median


class RunError(ValueError):
    """A journal that cannot be used; the message names it and why."""


@dataclass(frozen=True)
class Run:
    path: str
    world_size: int
    steps: int
    step_s: float
    compute_s: float
    coll_s: float
    data_s: float
    goodput: float


@dataclass(frozen=True)
class Row:
    world_size: int
    runs: int
    step_s: float
    compute_s: float
    coll_s: float
    data_s: float
    throughput: float  # relative: rank-steps per second (weak) or steps per second (strong), base = 1
    efficiency: float
    speedup: float


def read_run(path: str) -> Run:
    try:
        recs = journal.read(path)
    except OSError as exc:
        raise RunError(f"{path}: cannot read: {exc.strerror or exc}") from None
    goodputs = [r for r in recs if r.get("event") == je.GOODPUT and isinstance(r.get("profile"), dict)]
    if not goodputs:
        raise RunError(
            f"{path}: no goodput record (a journal from a coordinator that predates them, or a run "
            "that never completed a step)"
        )
    g = goodputs[-1]
    prof = g["profile"]
    sizes = [s for s in g.get("world_sizes") or () if isinstance(s, int) and s > 0]
    world = int(g.get("world_size") or 0) if len(sizes) != 1 else sizes[0]
    if len(sizes) > 1:
        raise RunError(f"{path}: the run changed world size ({sizes}); scale runs must keep one")
    try:
        run = Run(
            path=path,
            world_size=world,
            steps=int(g.get("steps", 0)),
            step_s=float(prof["step_s"]),
            compute_s=float(prof["compute_s"]),
            coll_s=float(prof["coll_s"]),
            data_s=float(prof["data_s"]),
            goodput=float(g.get("goodput", 0.0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RunError(f"{path}: malformed goodput record ({exc})") from None
    if run.world_size < 1 or run.steps < 1 or run.step_s <= 0:
        raise RunError(f"{path}: no measured steps (world size {run.world_size}, {run.steps} steps)")
    return run


def table(runs: Iterable[Run], strong: bool = False) -> list[Row]:
    by_size: dict[int, list[Run]] = {}
    for r in runs:
        by_size.setdefault(r.world_size, []).append(r)
    if not by_size:
        return []
    rows = []
    base = min(by_size)
    base_step = median([r.step_s for r in by_size[base]])
    for n in sorted(by_size):
        rs = by_size[n]
        step = median([r.step_s for r in rs])
        if strong:
            throughput = base_step / step
            eff = (base_step * base) / (step * n)
        else:
            throughput = (n / step) / (base / base_step)
            eff = base_step / step
        rows.append(
            Row(
                world_size=n,
                runs=len(rs),
                step_s=step,
                compute_s=median([r.compute_s for r in rs]),
                coll_s=median([r.coll_s for r in rs]),
                data_s=median([r.data_s for r in rs]),
                throughput=throughput,
                efficiency=eff,
                speedup=throughput,
            )
        )
    return rows


def first_below(rows: Sequence[Row], threshold: float) -> Row | None:
    return next((r for r in rows if r.efficiency < threshold), None)


def explain(rows: Sequence[Row], threshold: float) -> str:
    """Where efficiency drops below the threshold, and what grew."""
    if len(rows) < 2:
        return "one world size measured: nothing to compare (run the job at 1, 2, 4, ... workers)"
    low = first_below(rows, threshold)
    last = rows[-1]
    if low is None:
        return (
            f"efficiency stays at or above {threshold:.0%} up to {last.world_size} ranks ({last.efficiency:.0%} there)"
        )
    base = rows[0]
    grew = {
        "communication": low.coll_s - base.coll_s,
        "data wait": low.data_s - base.data_s,
        "compute": low.compute_s - base.compute_s,
    }
    what = max(grew, key=lambda k: grew[k])
    return (
        f"efficiency drops below {threshold:.0%} at {low.world_size} ranks ({low.efficiency:.0%}): "
        f"per step, {what} grew from {_ms(getattr(base, _FIELD[what]))} at {base.world_size} rank(s) to "
        f"{_ms(getattr(low, _FIELD[what]))}; more workers pay less than they cost from there"
    )


_FIELD = {"communication": "coll_s", "data wait": "data_s", "compute": "compute_s"}


def _ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"
