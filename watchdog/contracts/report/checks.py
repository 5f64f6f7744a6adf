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
from collections.abc import Callable
from itertools import chain
from operator import attrgetter, itemgetter, le, lt
from typing import Any

from watchdog import stepsummary

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


_counts_of, _positives_of = getter(attrgetter, COUNTS), getter(attrgetter, POSITIVES)
_ages_of, _words_of = getter(attrgetter, AGES), getter(attrgetter, WORDS)
_coll_counts_of, _coll_secs_of = getter(attrgetter, COLL_COUNTS), getter(attrgetter, COLL_SECONDS)
_coll_words_of = getter(attrgetter, COLL_WORDS)
_sample_counts_of, _sample_seconds_of = getter(attrgetter, STEP_COUNTS), getter(attrgetter, STEP_SECONDS)
_bounded_of = getter(attrgetter, tuple(n for n, _ in BOUNDED))
_BOUNDED_GE: tuple[Any, ...] = tuple(r.ge for _, r in BOUNDED)
_BOUNDED_LT: tuple[Any, ...] = tuple(r.lt for _, r in BOUNDED)
_finites_of, _nos_of = getter(attrgetter, FINITES), getter(attrgetter, NEVER_OR_SECONDS)
_texts_of = getter(attrgetter, tuple(n for n, _ in TEXTS))
_TEXT_LIMITS: tuple[Any, ...] = tuple(n for _, n in TEXTS)
_INT, _FLOAT = {int}, {float}


def _nos_fine(v: Any) -> bool:
    return v == -1.0 or (type(v) is float and 0 <= v < MAX_SECONDS)


def plainly_fine(r: RankState) -> bool:
    """True only if ``rank_problem`` would find nothing. Exact types only (int
    counts, float seconds); anything else, or any doubt, is left to the
    field-by-field checks, which name the problem."""
    world, rank = getattr(r, WORLD_NAME), getattr(r, RANK_NAME)
    if not (0 < world <= MAX_WORLD_SIZE and 0 <= rank < world):
        return False
    c = r.coll
    counts = (*_counts_of(r), *_coll_counts_of(c))
    secs = (*_ages_of(r), *_coll_secs_of(c))
    steps = r.recent_steps
    if steps:
        counts += tuple(chain.from_iterable(map(_sample_counts_of, steps)))
        secs += tuple(chain.from_iterable(map(_sample_seconds_of, steps)))
    words = (*_coll_words_of(c), *_words_of(r))
    bounded = _bounded_of(r)
    finites = _finites_of(r)
    return (
        set(map(type, counts)) == _INT
        and min(counts) >= 0
        and max(counts) < MAX_COUNT
        and min(_positives_of(r), default=1) > 0
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
        and all(map(_nos_fine, _nos_of(r)))
        and not r.recent_gpu  # GPU-side steps: checked one by one
        and all(map(le, map(len, _texts_of(r)), _TEXT_LIMITS))
        and not (r.step_summary and stepsummary.problem(r.step_summary))
    )


# -- the same on a version-2 row's values as read (FAST_NAMES order), and on columns

_AT = {n: i for i, n in enumerate(FAST_NAMES)}


def _at(names: tuple[str, ...], at: dict[str, int] = _AT) -> Callable[[Any], tuple]:
    return getter(itemgetter, tuple(at[n] for n in names))


_COLL_AT = {n: i for i, n in enumerate(COLL_NAMES)}
_counts_at, _ages_at, _positives_at, _words_at = _at(COUNTS), _at(AGES), _at(POSITIVES), _at(WORDS)
_bounded_at, _finites_at, _nos_at = _at(tuple(n for n, _ in BOUNDED)), _at(FINITES), _at(NEVER_OR_SECONDS)
_texts_at = _at(tuple(n for n, _ in TEXTS))
_coll_counts_at, _coll_words_at = _at(COLL_COUNTS, _COLL_AT), _at(COLL_WORDS, _COLL_AT)
_coll_secs_at = _at(COLL_SECONDS, _COLL_AT)
_W_AT, _R_AT = _AT[WORLD_NAME], _AT[RANK_NAME]


def in_range(vals: tuple, cvals: tuple, step_counts: tuple, step_secs: tuple) -> bool:
    """``plainly_fine`` on a version-2 row's values as read, before they become a
    RankState, for values already known to be exactly of their types (an int
    count, a float second): the same ranges, without an attribute read per field.
    False means "not known": ``rank_problem`` then decides."""
    counts = (*_counts_at(vals), *_coll_counts_at(cvals), *step_counts)
    secs = (*_ages_at(vals), *_coll_secs_at(cvals), *step_secs)
    words = (*_coll_words_at(cvals), *_words_at(vals))
    bounded = _bounded_at(vals)
    world = vals[_W_AT]
    return (
        math.isfinite(sum(_finites_at(vals)))
        and 0 < world <= MAX_WORLD_SIZE
        and 0 <= vals[_R_AT] < world
        and min(counts) >= 0
        and max(counts) < MAX_COUNT
        and min(_positives_at(vals), default=1) > 0
        and math.isfinite(sum(secs))
        and min(secs) >= 0
        and max(secs) < MAX_SECONDS
        and min(words, default=0) >= -INT64
        and max(words, default=0) < INT64
        and all(map(le, _BOUNDED_GE, bounded))
        and all(map(lt, bounded, _BOUNDED_LT))
        and all(map(_nos_fine, _nos_at(vals)))
        and all(map(le, map(len, _texts_at(vals)), _TEXT_LIMITS))
    )


def all_in_range(cols: tuple, ccols: tuple, step_counts: tuple, step_secs: tuple, n: int) -> bool:
    """``in_range`` of every row of a report, and their ranks distinct, on
    columns (a field's values over the rows: ``cols`` the simple fields' in
    ``FAST_NAMES`` order, ``ccols`` the collectives', ``step_*`` the step
    samples' counts and seconds): a min, a max or a sum per group of values
    instead of per row. Never True where a row's ``in_range`` is not; a sum
    that overflows to inf makes it False (the per-row path then decides)."""
    world, rank = cols[_W_AT], cols[_R_AT]
    counts = (*_counts_at(cols), *_coll_counts_at(ccols), *step_counts)
    secs = (*_ages_at(cols), *_coll_secs_at(ccols), *step_secs)
    bounded, nos = _bounded_at(cols), _nos_at(cols)
    words = (*_coll_words_at(ccols), *_words_at(cols))
    flat = chain.from_iterable
    return (
        min(world) > 0
        and max(world) <= MAX_WORLD_SIZE
        and min(rank) >= 0
        and all(map(lt, rank, world))
        and len(set(rank)) == n
        and min(flat(_positives_at(cols)), default=1) > 0
        and min(flat(counts)) >= 0
        and (sum(flat(counts)) < MAX_COUNT or max(flat(counts)) < MAX_COUNT)  # each is at most their sum
        and min(flat(secs)) >= 0
        # A NaN makes the sum NaN (not <), an infinity makes it not finite.
        and (sum(flat(secs)) < MAX_SECONDS or (math.isfinite(sum(flat(secs))) and max(flat(secs)) < MAX_SECONDS))
        and math.isfinite(sum(flat((*bounded, *_finites_at(cols), *nos))))
        and all(min(c) >= ge and max(c) < lt_ for c, ge, lt_ in zip(bounded, _BOUNDED_GE, _BOUNDED_LT))
        and all(max(c) < MAX_SECONDS for c in nos)
        and all(min(c) >= 0 or min((a for a in c if a != -1.0), default=0.0) >= 0 for c in nos)  # -1: never read
        and min(flat(words), default=0) >= -INT64
        and max(flat(words), default=0) < INT64
        and all(max(map(len, c)) <= limit for c, limit in zip(_texts_at(cols), _TEXT_LIMITS))
    )
