"""Version 2's whole-report path: every row of a report checked a column at
a time (a field's values over the rows, all the step samples together) and
built at once, when each is plainly fine; and a row's positional fast path.
Either answers None at any doubt, and the per-row checking path decides. The
typed reader (``typed.py``) builds its RankStates here too: the same objects,
the same shared values."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from itertools import chain, islice, repeat, starmap
from operator import add, itemgetter
from typing import Any

from watchdog.contracts import stepsummary
from watchdog.contracts.slot import Phase

from .build import built, twin
from .checks import all_in_range, getter, in_range
from .fast import PLANS, plan_of
from .fields import CollectiveState, RankState, StepSample, step_samples
from .parse import nested, summary_fast
from .ranges import MAX_STEPS_PER_RANK
from .table import (
    COLL_EXACT,
    COLL_NAMES,
    FAST_NAMES,
    FAST_TYPES,
    FINER,
    NESTED_NAMES,
    RANK,
    STEP_COUNTS,
    STEP_FULL,
    STEP_SECONDS,
    STEP_SHORT,
)

NO_STEPS: tuple = ()
_LIST, _STR, _DICT, _INT, _FLOAT = {list}, {str}, {dict}, {int}, {float}
_FAST_TYPE_LIST, _COLL_EXACT_LIST = list(FAST_TYPES), list(COLL_EXACT)
# A rank's field values in RankState's order from its simple fields' (FAST_NAMES order) then the others'.
# (ranks_of gives the nested ones in this order.)
assert NESTED_NAMES == ("coll", "recent_steps", "recent_colls", "recent_gpu", "step_summary", "death")
_RANK_ORDER = itemgetter(*((*FAST_NAMES, *NESTED_NAMES).index(f.name) for f in RANK))
# A sample's counts and seconds, by position, in the full form and the short (a prefix of it).
_FULL_COUNTS = tuple(STEP_FULL.index(n) for n in STEP_COUNTS)
_FULL_SECS = tuple(STEP_FULL.index(n) for n in STEP_SECONDS)
_SHORT_COUNTS = tuple(i for i in _FULL_COUNTS if i < len(STEP_SHORT))
_SHORT_SECS = tuple(i for i in _FULL_SECS if i < len(STEP_SHORT))
_full_counts_at, _full_secs_at = getter(itemgetter, _FULL_COUNTS), getter(itemgetter, _FULL_SECS)
_short_counts_at, _short_secs_at = getter(itemgetter, _SHORT_COUNTS), getter(itemgetter, _SHORT_SECS)
_phase_at = itemgetter(STEP_FULL.index("phase"))
_PHASE_AT = STEP_FULL.index("phase")
_FIRST_FINER = STEP_FULL.index(FINER[0])  # the finer split's columns, in the full form: from here on


def full_cols(c: tuple) -> tuple[tuple, tuple]:
    """A version-2 report's step samples' columns (all its ranks' together): (counts, seconds)."""
    return _full_counts_at(c), _full_secs_at(c)


def short_cols(c: tuple) -> tuple[tuple, tuple]:
    return _short_counts_at(c), _short_secs_at(c)


def plain_ranks(lay: Any, rows: list, n: int) -> tuple[RankState, ...] | None:
    if set(map(type, rows)) != _LIST or set(map(len, rows)) != {lay.width}:
        return None
    vals = list(map(lay.simple, map(add, rows, repeat(lay.padding, n)) if lay.pad else rows))
    if list(map(type, chain.from_iterable(vals))) != _FAST_TYPE_LIST * n:  # a list: no resizing as a tuple
        return None
    cvals = list(map(lay.coll_at, rows))
    if set(map(type, cvals)) != _LIST or set(map(len, cvals)) != {lay.coll_width}:
        return None
    if not lay.coll_as_is:
        cvals = list(map(lay.coll_of, cvals))
    if list(map(type, chain.from_iterable(cvals))) != _COLL_EXACT_LIST * n:
        return None
    stepped = steps_of(lay, rows, n)
    if stepped is None:
        return None
    samples, step_counts, step_secs = stepped
    got = nested_of(lay, rows, n)
    if got is None or not no_deaths(lay, rows):
        return None
    colls, gpus = got
    sums = summaries(lay, rows, n)
    if sums is None:
        return None
    if not all_in_range(tuple(zip(*vals)), tuple(zip(*cvals)), step_counts, step_secs, n):
        return None
    # GPU-side steps need no rank_problem: gpu_from_dict refused what it would find in them.
    return ranks_of(vals, cvals, samples, colls, gpus, sums)


def steps_of(lay: Any, rows: list, n: int) -> tuple[Any, tuple, tuple] | None:
    """The rows' step samples (an iterable of one tuple a row) and the columns
    ``all_in_range`` checks (counts, seconds); None where a row's are not each of
    exactly their JSON type."""
    if lay.steps_at is None:
        return repeat(NO_STEPS, n), (), ()
    steps = list(map(lay.steps_at, rows))
    if set(map(type, steps)) != _LIST:
        return None
    gots = list(chain.from_iterable(steps))
    if not gots:
        return repeat(NO_STEPS, n), (), ()
    lens = list(map(len, steps))
    if lay.step_of is None or max(lens) > MAX_STEPS_PER_RANK:
        return None
    if set(map(type, gots)) != _LIST or set(map(len, gots)) != {lay.step_width}:
        return None
    if not lay.steps_as_is:
        gots = list(map(lay.step_of, gots))
    if list(map(type, chain.from_iterable(gots))) != lay.step_types * len(gots):
        return None
    cols = tuple(zip(*gots))
    step_counts, step_secs = lay.step_cols(cols)
    return samples_of(cols, lens), step_counts, step_secs


def nested_of(lay: Any, rows: list, n: int) -> tuple[Any, Any] | None:
    """The rows' Flight Recorder signatures and GPU-side steps (each an iterable of
    one tuple a row), through the checking parsers where any row has some; None
    where they refuse one, or a value is not a list."""
    colls: Any = repeat(NO_STEPS, n)
    gpus: Any = repeat(NO_STEPS, n)
    colls_raw = list(map(lay.colls_at, rows)) if lay.colls_at is not None else []
    gpu_raw = list(map(lay.gpu_at, rows)) if lay.gpu_at is not None else []
    if any(colls_raw) or any(gpu_raw):  # Flight Recorder signatures, GPU-side steps: row by row
        got = list(map(nested, colls_raw or repeat([], n), gpu_raw or repeat([], n)))
        if None in got:
            return None
        colls, gpus = zip(*got)
    elif set(map(type, colls_raw)) - _LIST or set(map(type, gpu_raw)) - _LIST:
        return None  # an empty value that is not a list (null, say)
    return colls, gpus


def summaries(lay: Any, rows: list, n: int) -> Any:
    """The rows' step summaries (an iterable of one tuple a row), or None where
    one is not plainly fine (``stepsummary.all_fine``)."""
    if lay.summary_at is None:
        return repeat(NO_STEPS, n)
    raw = list(map(lay.summary_at, rows))
    if set(map(type, raw)) != _LIST or not stepsummary.all_fine(list(filter(None, raw))):
        return None
    return list(map(tuple, raw))


def no_deaths(lay: Any, rows: list) -> bool:
    """No row says why its rank died (rare: checked field by field)."""
    if lay.death_at is None:
        return True
    deaths = list(map(lay.death_at, rows))
    return set(map(type, deaths)) == _DICT and not any(deaths)


def fast_row(lay: Any, row: list) -> tuple[RankState, bool] | None:
    """``fast.fast_rank`` by position: a rank whose every field has exactly its
    JSON type, and whether its values are in range (``checks.in_range``); None
    for anything else."""
    vals = lay.simple(row + lay.padding if lay.pad else row)
    types = tuple(map(type, vals))
    plan = PLANS[types] if types in PLANS else plan_of(types)
    if plan is None:
        return None
    kw: dict[str, Any] = dict(zip(FAST_NAMES, vals))
    if plan:  # ints where floats go (absent fields were read from the padding, as their defaults)
        for name, default in plan:
            kw[name] = float(kw[name]) if default is float else default
    coll = row[lay.coll_i]
    if type(coll) is not list or len(coll) != lay.coll_width or lay.coll_of is None:
        return None
    cvals = lay.coll_of(coll)
    if tuple(map(type, cvals)) != COLL_EXACT:
        return None
    kw["coll"] = built(CollectiveState, dict(zip(COLL_NAMES, cvals)))
    steps = row[lay.steps_i] if lay.steps_i >= 0 else NO_STEPS
    if steps:
        stepped = row_steps(lay, steps)
        if stepped is None:
            return None
        samples, step_counts, step_secs = stepped
    elif type(steps) is not list and steps is not NO_STEPS:
        return None
    else:
        samples = step_counts = step_secs = ()
    got = nested(row[lay.colls_i] if lay.colls_i >= 0 else [], row[lay.gpu_i] if lay.gpu_i >= 0 else [])
    if got is None:
        return None
    colls, gpu = got
    if lay.death_i >= 0 and row[lay.death_i] != {}:  # why a rank died: rare, checked field by field
        return None
    if not 0 <= kw["rank"] < kw["world_size"]:
        return None
    summary = summary_fast(row[lay.summary_i]) if lay.summary_i >= 0 else ()
    if summary is None:
        return None
    kw["recent_steps"] = samples
    kw["recent_colls"] = tuple(colls)
    kw["recent_gpu"] = tuple(gpu)
    kw["step_summary"] = summary
    kw["death"] = {}
    if plan:  # the values as the rank holds them: floats for ints
        vals = tuple(map(kw.__getitem__, FAST_NAMES))
    fine = not gpu and in_range(vals, cvals, step_counts, step_secs)
    return built(RankState, kw), fine


def row_steps(lay: Any, steps: Any) -> tuple[tuple, tuple, tuple] | None:
    """One row's step samples (not none) and the columns ``in_range`` checks
    (counts, seconds); None where they are not each of exactly their JSON type.
    All at once in C: their shapes, then their values' types."""
    if type(steps) is not list or lay.step_of is None or len(steps) > MAX_STEPS_PER_RANK:
        return None
    if set(map(type, steps)) != _LIST or set(map(len, steps)) != {lay.step_width}:
        return None
    gots = list(map(lay.step_of, steps))
    if lay.step_full:
        step_counts = tuple(chain.from_iterable(map(_full_counts_at, gots)))
        step_secs = tuple(chain.from_iterable(map(_full_secs_at, gots)))
    else:
        step_counts = tuple(chain.from_iterable(map(_short_counts_at, gots)))
        step_secs = tuple(chain.from_iterable(map(_short_secs_at, gots)))
    if (
        set(map(type, step_counts)) != _INT
        or set(map(type, step_secs)) != _FLOAT
        or set(map(type, map(_phase_at, gots))) != _STR
    ):
        return None  # ints where floats go, say: the checking path converts them
    return tuple(starmap(StepSample, gots)), step_counts, step_secs


def samples_of(cols: tuple, lens: list[int]) -> list[tuple[StepSample, ...]]:
    """The step samples of a report's rows: ``cols`` their values' columns (all
    the rows' samples together, in StepSample's field order, checked), ``lens``
    how many each row has."""
    made = iter(step_samples(shared_values(cols)))
    return list(map(tuple, map(islice, repeat(made, len(lens)), lens)))


def ranks_of(vals: list, cvals: list, samples: Any, colls: Any, gpus: Any, summaries: Any) -> tuple[RankState, ...]:
    """The RankStates of a report's rows, each row's parts checked: its simple
    fields' values (``FAST_NAMES`` order), its collective's (``COLL_NAMES``),
    its step samples, Flight Recorder signatures, GPU-side steps and summary."""
    coll = twin(CollectiveState)
    rank = twin(RankState)
    out = list(
        starmap(
            rank,
            map(
                _RANK_ORDER,
                map(add, vals, zip(starmap(coll, cvals), samples, colls, gpus, summaries, map(dict, repeat(())))),
            ),
        )
    )
    for r in out:  # the twins become what they are twins of (the same layout)
        r.__class__ = RankState
        r.coll.__class__ = CollectiveState
    return tuple(out)


# Phases as the hook names them, one str object each: what shared_values maps a
# sample's phase to (another phase keeps its own object; nothing here grows).
_PHASE_OBJECTS = {p.label: p.label for p in Phase}


def shared_values(cols: tuple) -> Iterator[tuple]:
    """The step samples' values again (``cols``: their columns in StepSample's
    field order), with values that repeat from sample to sample as one object:
    the phase by name, and a finer-split column of zeros (not measured: every
    sample of an agent's full form has four) as the one 0.0. Equal values; the
    coordinator keeps ~256 samples a rank, and each such value was an object of
    its own from JSON: 54 bytes a phase, 24 a float, ~150 bytes of a ~370-byte
    sample (~600 MB at 16,384 ranks)."""
    out = list(cols)
    out[_PHASE_AT] = map(_PHASE_OBJECTS.get, out[_PHASE_AT], out[_PHASE_AT])
    for i in range(_FIRST_FINER, len(out)):  # the finer split, in the full form (floats: checked before)
        if not any(array("d", out[i]).tobytes()):  # every one +0.0, bit for bit (-0.0 stays itself)
            out[i] = repeat(0.0)
    return zip(*out)
