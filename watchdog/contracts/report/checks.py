"""Whether a rank's values are in range: each kind of range (``ranges.Range``)
checked once here, for every field of that kind in the table (``table.py``).

``rank_problem`` names the first problem; the others answer only "plainly
fine" (True) or "not known" (False, and ``rank_problem`` then decides), a
group of fields at a time in C (attrgetter, map, min, max, sum) instead of a
Python call per value: the coordinator checks every rank of every report,
16,384 a second at 16,384 ranks. A sum of finite values below a bound each is
finite, and NaN or an infinity makes it not, so one ``isfinite`` covers a
whole group."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from itertools import chain
from operator import attrgetter, itemgetter, le, lt
from typing import Any

from watchdog.contracts import stepsummary

from .fields import RankState
from .parse import count_ok, seconds_ok
from .ranges import INT64, MAX_COUNT, MAX_SECONDS, MAX_WORLD_SIZE
from .table import (
    AGES,
    BOUNDED,
    COLL_COUNTS,
    COLL_NAMES,
    COLL_SECONDS,
    COLL_WORDS,
    COUNTS,
    FAST_NAMES,
    FINITES,
    GPU_FIELDS,
    NEVER_OR_SECONDS,
    POSITIVES,
    RANK,
    RANK_NAME,
    STEP_COUNTS,
    STEP_SECONDS,
    TEXTS,
    WORDS,
    WORLD_NAME,
)


def rank_problem(r: RankState) -> str:
    """Why one rank entry is out of range ("" if it is fine). The agent drops such a
    rank before sending and the coordinator drops it on receipt; either way only
    that rank is lost, never its host's report."""
    if plainly_fine(r):
        return ""
    world, rank = getattr(r, WORLD_NAME), getattr(r, RANK_NAME)
    if not 0 < world <= MAX_WORLD_SIZE:
        return f"{WORLD_NAME} {world} outside 1..{MAX_WORLD_SIZE}"
    if not 0 <= rank < world:
        return f"{RANK_NAME} {rank} outside world size {world}"
    for name in COUNTS:
        if not count_ok(getattr(r, name)):
            return f"{name} must be an integer in 0..2^62, got {getattr(r, name)!r}"
    for name in POSITIVES:
        if getattr(r, name) <= 0:
            return f"{name} must be > 0, got {getattr(r, name)}"
    for name in AGES:
        if not seconds_ok(getattr(r, name)):
            return f"{name} must be a finite number of seconds >= 0, got {getattr(r, name)!r}"
    for f in RANK:  # the other kinds, in field order
        problem = _PROBLEMS[f.range.kind](f.name, getattr(r, f.name), f.range) if f.range is not None else ""
        if problem:
            return problem
    return _coll_problem(r) or _history_problem(r)


def _coll_problem(r: RankState) -> str:
    """``rank_problem`` for the rank's collective fields."""
    c = r.coll
    for name in COLL_COUNTS:
        if not count_ok(getattr(c, name)):
            return f"coll.{name} must be an integer in 0..2^62, got {getattr(c, name)!r}"
    for name in COLL_WORDS:
        if not (isinstance(getattr(c, name), int) and -INT64 <= getattr(c, name) < INT64):
            return f"coll.{name} out of range: {getattr(c, name)!r}"
    for name in COLL_SECONDS:
        if not seconds_ok(getattr(c, name)):
            return f"coll.{name} must be a finite number of seconds >= 0, got {getattr(c, name)!r}"
    return ""


def _history_problem(r: RankState) -> str:
    """``rank_problem`` for the rank's recent steps, GPU times and step summary."""
    for j, x in enumerate(r.recent_steps):
        if not all(count_ok(getattr(x, k)) for k in STEP_COUNTS):
            return f"recent_steps[{j}]: {' and '.join(STEP_COUNTS)} must be integers in 0..2^62"
        if not all(seconds_ok(getattr(x, k)) for k in STEP_SECONDS):
            return f"recent_steps[{j}]: durations must be finite seconds >= 0"
    for j, g in enumerate(r.recent_gpu):
        if not count_ok(g.step) or not all(seconds_ok(getattr(g, k)) for k in GPU_FIELDS):
            return f"recent_gpu[{j}]: step must be a count and durations finite seconds >= 0"
    if r.step_summary:
        return stepsummary.problem(r.step_summary)
    return ""


def _bounded(name: str, v: Any, rng: Any) -> str:
    return "" if math.isfinite(v) and rng.ge <= v < rng.lt else f"{name} out of range: {v!r}"


def _finite(name: str, v: Any, rng: Any) -> str:
    if isinstance(v, (int, float)) and math.isfinite(v):
        return ""  # (a field ``x`` of this kind is sent with its flag ``x_finite``)
    return f"{name} must be a finite number (a NaN or infinite {name} is sent as {name}_finite false), got {v!r}"


def _never_or_seconds(name: str, v: Any, rng: Any) -> str:
    if v == -1.0 or seconds_ok(v):
        return ""
    return f"{name} must be -1 (never read) or finite seconds >= 0, got {v!r}"


def _word(name: str, v: Any, rng: Any) -> str:
    return "" if -INT64 <= v < INT64 else f"{name} out of range: {v!r}"


def _text(name: str, v: Any, rng: Any) -> str:
    return "" if len(v) <= rng.max_length else f"{name} is at most {rng.max_length} characters"


def _checked_before(name: str, v: Any, rng: Any) -> str:
    return ""


# The checks of the kinds rank_problem does not check first, by kind.
_PROBLEMS: dict[str, Callable[[str, Any, Any], str]] = {
    "bounded": _bounded,
    "finite": _finite,
    "never_or_seconds": _never_or_seconds,
    "int64": _word,
    "text": _text,
    **dict.fromkeys(("world", "rank", "count", "seconds"), _checked_before),
}


def getter(get: Callable[..., Any], names: tuple[Any, ...]) -> Callable[[Any], tuple]:
    """``get(*names)`` (attrgetter, itemgetter) that always gives a tuple, for one name or none too."""
    if len(names) > 1:
        return get(*names)
    if names:
        one = get(names[0])
        return lambda x: (one(x),)
    return lambda x: ()


def split_valid(ranks: tuple[RankState, ...]) -> tuple[tuple[RankState, ...], list[tuple[RankState, str]]]:
    """(the ranks to send, [(dropped rank, why)]): the agent's half of ``rank_problem``."""
    good, bad = [], []
    for r in ranks:
        problem = rank_problem(r)
        (bad.append((r, problem)) if problem else good.append(r))
    return tuple(good), bad


# Each check reads its fields through one getter, in this order; a kind's
# fields are a slice of what it gives.
_BOUNDED_NAMES, _TEXT_NAMES = tuple(n for n, _ in BOUNDED), tuple(n for n, _ in TEXTS)
_ORDER = (*COUNTS, *POSITIVES, *AGES, *_BOUNDED_NAMES, *FINITES, *NEVER_OR_SECONDS, *WORDS, *_TEXT_NAMES)
_COLL_ORDER = (*COLL_COUNTS, *COLL_SECONDS, *COLL_WORDS)


def _slices(*groups: tuple) -> Iterator[slice]:
    at = 0
    for g in groups:
        yield slice(at, at + len(g))
        at += len(g)


_COUNTS, _POSITIVES, _AGES, _BOUNDED, _FINITES, _NOS, _WORDS, _TEXTS = _slices(
    COUNTS, POSITIVES, AGES, _BOUNDED_NAMES, FINITES, NEVER_OR_SECONDS, WORDS, _TEXT_NAMES
)
_C_COUNTS, _C_SECONDS, _C_WORDS = _slices(COLL_COUNTS, COLL_SECONDS, COLL_WORDS)
_BOUNDED_GE: tuple[Any, ...] = tuple(r.ge for _, r in BOUNDED)
_BOUNDED_LT: tuple[Any, ...] = tuple(r.lt for _, r in BOUNDED)
_TEXT_LIMITS: tuple[Any, ...] = tuple(n for _, n in TEXTS)
_rank_of, _coll_of = attrgetter(*_ORDER), getter(attrgetter, _COLL_ORDER)
_sample_counts_of, _sample_seconds_of = getter(attrgetter, STEP_COUNTS), getter(attrgetter, STEP_SECONDS)
_NOT_NEVER = (-1.0).__ne__  # never-or-seconds: -1 is "never", any other value is seconds
_NEVER = {-1.0}
_INT, _FLOAT = {int}, {float}


def plainly_fine(r: RankState) -> bool:
    """True only if ``rank_problem`` would find nothing. Exact types only (int
    counts, float seconds); anything else, or any doubt, is left to the
    field-by-field checks, which name the problem."""
    world, rank = getattr(r, WORLD_NAME), getattr(r, RANK_NAME)
    if not (0 < world <= MAX_WORLD_SIZE and 0 <= rank < world):
        return False
    c = r.coll
    v, cv = _rank_of(r), _coll_of(c)
    counts = v[_COUNTS] + cv[_C_COUNTS]
    secs = v[_AGES] + cv[_C_SECONDS]
    steps = r.recent_steps
    if steps:
        counts += tuple(chain.from_iterable(map(_sample_counts_of, steps)))
        secs += tuple(chain.from_iterable(map(_sample_seconds_of, steps)))
    words, bounded, finites, nos = cv[_C_WORDS] + v[_WORDS], v[_BOUNDED], v[_FINITES], v[_NOS]
    return (
        set(map(type, counts)) == _INT
        and min(counts) >= 0
        and max(counts) < MAX_COUNT
        and min(v[_POSITIVES], default=1) > 0
        and set(map(type, secs)) == _FLOAT
        and math.isfinite(sum(secs))
        and min(secs) >= 0
        and max(secs) < MAX_SECONDS
        and set(map(type, words)) <= _INT
        and min(words, default=0) >= -INT64
        and max(words, default=0) < INT64
        and set(map(type, bounded)) <= _FLOAT
        and all(map(le, _BOUNDED_GE, bounded))
        and all(map(lt, bounded, _BOUNDED_LT))
        and set(map(type, finites)) <= _FLOAT
        and math.isfinite(sum(finites))
        and set(map(type, nos)) <= _FLOAT
        and max(nos, default=0.0) < MAX_SECONDS
        and min(filter(_NOT_NEVER, nos), default=0.0) >= 0
        and not r.recent_gpu  # GPU-side steps: checked one by one
        and all(map(le, map(len, v[_TEXTS]), _TEXT_LIMITS))
        and not (r.step_summary and stepsummary.problem(r.step_summary))
    )


# -- the same on a version-2 row's values as read (FAST_NAMES order), and on columns

_AT = {n: i for i, n in enumerate(FAST_NAMES)}
_row_at = itemgetter(*(_AT[n] for n in _ORDER))
_coll_at = getter(itemgetter, tuple(COLL_NAMES.index(n) for n in _COLL_ORDER))
_W_AT, _R_AT = _AT[WORLD_NAME], _AT[RANK_NAME]


def in_range(vals: tuple, cvals: tuple, step_counts: tuple, step_secs: tuple) -> bool:
    """``plainly_fine`` on a version-2 row's values as read, before they become a
    RankState, for values already known to be exactly of their types (an int
    count, a float second): the same ranges, without an attribute read per field.
    False means "not known": ``rank_problem`` then decides."""
    v, cv = _row_at(vals), _coll_at(cvals)
    counts = (*v[_COUNTS], *cv[_C_COUNTS], *step_counts)
    secs = (*v[_AGES], *cv[_C_SECONDS], *step_secs)
    words, bounded, nos = cv[_C_WORDS] + v[_WORDS], v[_BOUNDED], v[_NOS]
    world = vals[_W_AT]
    return (
        math.isfinite(sum(v[_FINITES]))
        and 0 < world <= MAX_WORLD_SIZE
        and 0 <= vals[_R_AT] < world
        and min(counts) >= 0
        and max(counts) < MAX_COUNT
        and min(v[_POSITIVES], default=1) > 0
        and math.isfinite(sum(secs))
        and min(secs) >= 0
        and max(secs) < MAX_SECONDS
        and min(words, default=0) >= -INT64
        and max(words, default=0) < INT64
        and all(map(le, _BOUNDED_GE, bounded))
        and all(map(lt, bounded, _BOUNDED_LT))
        and max(nos, default=0.0) < MAX_SECONDS
        and min(filter(_NOT_NEVER, nos), default=0.0) >= 0
        and all(map(le, map(len, v[_TEXTS]), _TEXT_LIMITS))
    )


def _longest(texts: tuple) -> int:
    return max(map(len, texts))


def all_in_range(cols: tuple, ccols: tuple, step_counts: tuple, step_secs: tuple, n: int) -> bool:
    """``in_range`` of every row of a report, and their ranks distinct, on
    columns (a field's values over the rows: ``cols`` the simple fields' in
    ``FAST_NAMES`` order, ``ccols`` the collectives', ``step_*`` the step
    samples' counts and seconds): a min, a max or a sum per group of values
    instead of per row. Never True where a row's ``in_range`` is not; a sum
    that overflows to inf makes it False (the per-row path then decides)."""
    world, rank = cols[_W_AT], cols[_R_AT]
    v, cv = _row_at(cols), _coll_at(ccols)
    counts = (*v[_COUNTS], *cv[_C_COUNTS], *step_counts)
    secs = (*v[_AGES], *cv[_C_SECONDS], *step_secs)
    words, bounded, nos = cv[_C_WORDS] + v[_WORDS], v[_BOUNDED], v[_NOS]
    flat = chain.from_iterable
    return (
        min(world) > 0
        and max(world) <= MAX_WORLD_SIZE
        and min(rank) >= 0
        and all(map(lt, rank, world))
        and len(set(rank)) == n
        and min(flat(v[_POSITIVES]), default=1) > 0
        and min(flat(counts)) >= 0
        and (sum(flat(counts)) < MAX_COUNT or max(flat(counts)) < MAX_COUNT)  # each is at most their sum
        and min(flat(secs)) >= 0
        # A NaN makes the sum NaN (not <), an infinity makes it not finite.
        and (sum(flat(secs)) < MAX_SECONDS or (math.isfinite(sum(flat(secs))) and max(flat(secs)) < MAX_SECONDS))
        and math.isfinite(sum(flat((*bounded, *v[_FINITES], *nos))))
        and all(map(le, _BOUNDED_GE, map(min, bounded)))
        and all(map(lt, map(max, bounded), _BOUNDED_LT))
        and max(flat(nos), default=0.0) < MAX_SECONDS
        and min(set(flat(nos)) - _NEVER, default=0.0) >= 0  # -1: never
        and min(flat(words), default=0) >= -INT64
        and max(flat(words), default=0) < INT64
        and all(map(le, map(_longest, v[_TEXTS]), _TEXT_LIMITS))
    )
