"""Runs of one job at several world sizes, read from Prometheus instead of journals.

Each run is a training job (its ``training_job`` label: give each run its own
job id). Over a window ending at ``at``, from the series every agent exports:

- steps per rank: how much ``watchdog_rank_steps_total`` grew between the
  first and the last sample in the window (max_over_time - min_over_time);
- each rank's data wait, collective and compute time over those steps: the
  same growth of ``watchdog_rank_step_part_seconds_total`` by ``part``;
- the world size: ``watchdog_job_world_size`` (one value over the window, or
  the run is refused, as a journal whose world size changed is);
- goodput, where a coordinator served the job: its ``goodput_ratio`` joined to
  its ``info`` series on the scrape target.

Per rank, each part divided by its steps; the run's step, compute, collective
and data wait are the medians over its ranks, as the journal's goodput record
gives the median rank's. Unlike the journal, warm-up steps are not left out:
choose a window that starts after them for the closest match. The growth
between samples is read as it is, not extrapolated as ``increase()`` does (its
extrapolation to the window's edges moved these ratios by 1.5% in the
test against a real Prometheus); a counter that went back (a rank restarted in
the window) refuses the run instead of mixing two processes' counts.
"""

from __future__ import annotations

import math
import re

from watchdog.agent.export import metrics as am
from watchdog.promquery import Endpoint, PromError, query
from watchdog.stepstats.stats import median

from .runs import Run, RunError

_JOB_RE = re.compile(r"^[\w.:/@+-]{1,200}$")  # what is put in a PromQL string literal: no quotes, no escapes


def read_prometheus(
    base: str | Endpoint, job: str, window_s: float, at: float | None = None, timeout: float = 10.0
) -> Run:
    if not _JOB_RE.match(job):
        raise RunError(f"training job {job!r}: only letters, digits and . _ : / @ + - may be queried")
    sel = f'{{training_job="{job}"}}'
    w = f"[{max(1, round(window_s))}s]"
    where = f"prometheus {base} training_job={job}"
    try:
        steps = {
            s["metric"].get("rank", ""): s["value"]
            for s in query(base, f"sum by (rank) ({_growth(am.RANK_STEPS.name + sel, w)})", timeout, at)
        }
        resets = query(base, f"sum(resets({am.RANK_STEPS.name}{sel}{w}))", timeout, at)
        parts: dict[str, dict[str, float]] = {}
        expr = f"sum by (rank, part) ({_growth(am.RANK_PART_TOTAL.name + sel, w)})"
        for s in query(base, expr, timeout, at):
            parts.setdefault(s["metric"].get("rank", ""), {})[s["metric"].get("part", "")] = s["value"]
        sizes = [
            s["value"]
            for agg in ("min", "max")
            for s in query(base, f"{agg}({agg}_over_time({am.JOB_WORLD_SIZE.name}{sel}{w}))", timeout, at)
        ]
        good = query(
            base,
            f"max(last_over_time(watchdog_coordinator_goodput_ratio{w}) * on (instance, job) group_left "
            f"last_over_time(watchdog_coordinator_info{sel}{w}))",
            timeout,
            at,
        )
    except PromError as exc:
        raise RunError(f"{where}: {exc}") from None
    if not sizes:
        raise RunError(f"{where}: no {am.JOB_WORLD_SIZE.name} series in the last {w[1:-1]} (no agent saw the job)")
    if min(sizes) != max(sizes):
        raise RunError(
            f"{where}: the run changed world size ({min(sizes):.0f} to {max(sizes):.0f}); scale runs must keep one"
        )
    if resets and resets[0]["value"] > 0:
        raise RunError(f"{where}: a rank's step counter went back in the window (a restart); shorten --window-seconds")
    per_rank = []  # (step, compute, collective, data) seconds per step
    for rank, n in steps.items():
        p = parts.get(rank, {})
        if n > 0 and all(math.isfinite(v) and v >= 0 for v in p.values()):
            data, coll, comp = (p.get(k, 0.0) / n for k in am.PARTS)
            per_rank.append((data + coll + comp, comp, coll, data))
    if not per_rank:
        raise RunError(f"{where}: no rank completed a step in the last {w[1:-1]}")
    return Run(
        path=f"prometheus:{job}",
        world_size=int(sizes[0]),
        steps=round(median(list(steps.values()))),
        step_s=median([r[0] for r in per_rank]),
        compute_s=median([r[1] for r in per_rank]),
        coll_s=median([r[2] for r in per_rank]),
        data_s=median([r[3] for r in per_rank]),
        goodput=good[0]["value"] if good else 0.0,
    )


def _growth(series: str, window: str) -> str:
    """How much a counter grew between its first and last sample in the window."""
    return f"max_over_time({series}{window}) - min_over_time({series}{window})"
