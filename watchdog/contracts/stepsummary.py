"""A rank's step statistics as its agent computed them: the wire form and its checks.

At 16,384 ranks a large share of the coordinator's fold was turning each
rank's new step samples into its statistics (the p99 step time, the loader's
data share, the closed straggler windows: ``stepstats.steps.add_samples``),
~120 of ~460 us a report, on the one core that must take 2,048 reports a
second. The agent has the same samples, a core of its own per host and eight
ranks, not 16,384: it runs the same ``add_samples`` on the samples the
coordinator accepted from it, under the coordinator's settings (its replies
carry them: ``CONFIG_FIELDS``), and sends the result beside the samples. The
coordinator keeps each rank's history itself (goodput, the verdict and the
loader's onset read it) and takes the statistics from the agent when both
describe the same newest sample (``stepstats.steps.with_summary``); from
the same samples the numbers are those it would have computed, bit for bit.

A summary is a flat list of numbers (JSON floats): ``HEAD`` values, then
``WINDOW`` values per straggler window closed since the agent's previous
accepted report, oldest first. Nothing here imports the coordinator: the
agent and the schema both read this module."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from operator import lt
from typing import Protocol

# last_step (the newest sample kept: what the coordinator checks the summary against), p99_step_s,
# train_steps, data_share, windows_scanned (-1: none yet); steps.StepStats's fields of those names.
HEAD = 5
LAST_STEP, P99_STEP_S, TRAIN_STEPS, DATA_SHARE, WINDOWS_SCANNED = range(HEAD)
WINDOW = 5  # index, n, compute_s, step_s, spread (steps.WindowStat's fields, in order)
MAX_WINDOWS = 16  # windows closed in one report: 256 samples of a 20-step window close 13
# The coordinator settings a summary depends on, in the order the reply and the report list them.
CONFIG_FIELDS = (
    "warmup_steps",
    "history_steps",
    "starvation_window_steps",
    "straggler_window_steps",
    "straggler_windows",
)
MAX_CONFIG_VALUE = 1 << 20


class Settings(Protocol):
    """What the step statistics read of a config: CONFIG_FIELDS (the coordinator's
    ``DetectorConfig`` has them; an agent makes ``SummarySettings`` from a reply)."""

    @property
    def warmup_steps(self) -> int: ...
    @property
    def history_steps(self) -> int: ...
    @property
    def starvation_window_steps(self) -> int: ...
    @property
    def straggler_window_steps(self) -> int: ...
    @property
    def straggler_windows(self) -> int: ...


@dataclass(frozen=True)
class SummarySettings:
    """The settings a coordinator's reply gives, in CONFIG_FIELDS order."""

    warmup_steps: int
    history_steps: int
    starvation_window_steps: int
    straggler_window_steps: int
    straggler_windows: int


_EXACT = float(1 << 53)  # counts and step numbers above this are not exact as doubles
_MAX_SECONDS = 1e9  # report.MAX_SECONDS (not imported: report imports this module)
_FLOATS = {float}


def problem(values: Sequence[float]) -> str:
    """Why ``values`` is not a summary ("" if it is): its shape, and every number
    in range (counts whole and exact, durations finite seconds >= 0, window
    indices rising and closed). Floats only: the schema turns JSON ints into floats
    first. Checked a group of values at a time in C: every rank of every report."""
    n = len(values)
    wins = (n - HEAD) // WINDOW
    if n < HEAD or (n - HEAD) % WINDOW or wins > MAX_WINDOWS:
        return f"step_summary must hold {HEAD} numbers and {WINDOW} per window (at most {MAX_WINDOWS}), got {n}"
    if set(map(type, values)) != _FLOATS:
        return "step_summary must hold numbers only"
    if not math.isfinite(sum(values)):  # a NaN or an infinity anywhere (each value is checked below 1e9..2^53)
        return "step_summary must hold finite numbers"
    last, p99, train, share, scanned = values[:HEAD]
    counts = (
        last,
        train,
        scanned + 1,
        *islice(values, HEAD, None, WINDOW),
        *islice(values, HEAD + 1, None, WINDOW),
    )
    secs = (p99, share, *(values[i] for k in range(2, WINDOW) for i in range(HEAD + k, n, WINDOW)))
    if min(counts) < 0 or max(counts) >= _EXACT or not all(map(float.is_integer, counts)):
        return "step_summary: counts and step numbers must be whole numbers in 0..2^53 (windows_scanned: -1 where none)"
    if min(secs) < 0 or max(secs) >= _MAX_SECONDS:
        return "step_summary: durations and shares must be finite and >= 0"
    index = values[HEAD::WINDOW]
    if wins and (not all(map(lt, index, index[1:])) or index[-1] > scanned):
        return "step_summary: window indices must rise and be closed (at most windows_scanned)"
    return ""


def all_fine(summaries: list[list]) -> bool:
    """``not problem(s)`` for every one of ``summaries`` (the non-empty lists of a
    report's ranks), those without windows (most: a rank closes one every 20
    steps) checked together, a column at a time in C; False where any doubt."""
    heads = [s for s in summaries if len(s) == HEAD]
    if len(heads) != len(summaries) and any(problem(s) for s in summaries if len(s) != HEAD):
        return False
    if not heads:
        return True
    values = [x for s in heads for x in s]
    if set(map(type, values)) != _FLOATS or not math.isfinite(sum(values)):
        return False
    last, p99, train, share, scanned = (values[i::HEAD] for i in range(HEAD))
    counts = (*last, *train)
    secs = (*p99, *share)
    return (
        min(counts) >= 0
        and max(counts) < _EXACT
        and min(scanned) >= -1  # -1: none yet
        and max(scanned) < _EXACT
        and all(map(float.is_integer, (*counts, *scanned)))
        and min(secs) >= 0
        and max(secs) < _MAX_SECONDS
    )


def config_problem(values: object) -> str:
    """Why a report's ``step_summary_config`` is not a list of the settings ("" if it is)."""
    if type(values) is not list or len(values) != len(CONFIG_FIELDS):
        return f"step_summary_config must list {len(CONFIG_FIELDS)} settings: {', '.join(CONFIG_FIELDS)}"
    if not all(type(v) is int and 0 <= v <= MAX_CONFIG_VALUE for v in values):
        return f"step_summary_config: settings are integers in 0..{MAX_CONFIG_VALUE}"
    return ""
