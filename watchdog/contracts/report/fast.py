"""The version-1 fast path: a rank object whose every field has exactly its
JSON type (an agent's), read in C and built without a check per field; None
for anything else, and the checking path (``v1.py``) decides with its
messages. Driven by the field table (``table.py``)."""

from __future__ import annotations

from dataclasses import MISSING
from operator import itemgetter
from typing import Any

from .build import built
from .fields import CollectiveState, RankState, StepSample, step_sample
from .parse import nested, summary_fast
from .ranges import MAX_STEPS_PER_RANK
from .table import (
    COLL,
    COLL_EXACT,
    COLL_NAMES,
    FAST_NAMES,
    NUM,
    RANK_DEFAULT_VALUES,
    SIMPLE,
    STEP,
    STEP_FULL,
    STEP_FULL_TYPES,
    STEP_SHORT,
    STEP_SHORT_TYPES,
)

_COLL_TYPES = {f.name: ((str,) if f.type is str else NUM) for f in COLL}
ABSENT_VALUE = object()  # a field missing from the JSON (None is JSON null)
_ABSENT = (ABSENT_VALUE,) * len(FAST_NAMES)
PLANS: dict[tuple[type, ...], tuple[tuple[str, Any], ...] | None] = {}
MAX_PLANS = 256  # distinct type tuples remembered; hostile input cannot grow it further
_coll_of = itemgetter(*COLL_NAMES)
_step_short_of, _step_full_of = itemgetter(*STEP_SHORT), itemgetter(*STEP_FULL)
# A sample's fields as ``_fast_step`` takes them: what each may be, and its value when absent.
_STEP_TAKES = tuple(NUM if f.type is float else (f.type,) for f in STEP)
_STEP_ABSENT = tuple(None if f.default is MISSING else f.default for f in STEP)
_STEP_FLOATS = tuple(f.type is float for f in STEP)


def fast_rank(raw: dict) -> RankState | None:
    """``v1.rank_from_dict`` for a rank whose every field has exactly its JSON type;
    None for anything else (the checking path then decides, with its messages).

    The simple fields are read in C (one ``map``) and judged by the tuple of
    their types: what to do for a given tuple of types (nothing, usually; fill an
    older agent's missing fields with their defaults; make an int a float; or
    refuse) is worked out once per tuple (``plan``) and remembered."""
    vals = tuple(map(raw.get, FAST_NAMES, _ABSENT))
    types = tuple(map(type, vals))
    plan = PLANS[types] if types in PLANS else plan_of(types)
    if plan is None:
        return None
    kw: dict[str, Any] = dict(zip(FAST_NAMES, vals))
    if plan:  # an older agent's missing fields, ints where floats go
        for name, default in plan:
            kw[name] = float(kw[name]) if default is float else default
    coll = _fast_coll(raw.get("coll"))
    if coll is None:
        return None
    kw["coll"] = coll
    steps = raw.get("recent_steps", [])
    if type(steps) is not list or len(steps) > MAX_STEPS_PER_RANK:
        return None
    samples = []
    for x in steps:
        if type(x) is not dict:
            return None
        sample = _exact_step(x) or _fast_step(x)
        if sample is None:
            return None
        samples.append(sample)
    got = nested(raw.get("recent_colls", []), raw.get("recent_gpu", []))
    if got is None:
        return None
    colls, gpu = got
    if "death" in raw and raw["death"] != {}:  # why a rank died: rare, checked field by field below
        return None
    if not 0 <= kw["rank"] < kw["world_size"]:
        return None
    summary = summary_fast(raw["step_summary"]) if "step_summary" in raw else ()
    if summary is None:
        return None
    kw["recent_steps"] = tuple(samples)
    kw["recent_colls"] = tuple(colls)
    kw["recent_gpu"] = tuple(gpu)
    kw["step_summary"] = summary
    kw["death"] = {}
    return built(RankState, kw)  # every field set: the plan filled in what an older agent leaves out


def _fast_coll(coll: Any) -> CollectiveState | None:
    """``fast_rank``'s collective state: every field of exactly its JSON type (or
    a number where a float goes); None for anything else."""
    if type(coll) is not dict:
        return None
    if len(coll) == len(COLL_NAMES) and COLL_NAMES[0] in coll:
        try:
            cvals = _coll_of(coll)
        except KeyError:
            return None
        if tuple(map(type, cvals)) == COLL_EXACT:
            return built(CollectiveState, dict(zip(COLL_NAMES, cvals)))
    if not all(type(v) in _COLL_TYPES.get(k, ()) for k, v in coll.items()):
        return None
    try:
        return CollectiveState(**coll)
    except TypeError:
        return None


def _exact_step(x: dict) -> StepSample | None:
    """A step sample with all its fields, or all but the finer split, each of
    exactly its JSON type; None for anything else."""
    full = len(x) == len(STEP_FULL)
    if not full and len(x) != len(STEP_SHORT):
        return None
    try:
        got = (_step_full_of if full else _step_short_of)(x)
    except KeyError:
        return None
    if tuple(map(type, got)) != (STEP_FULL_TYPES if full else STEP_SHORT_TYPES):
        return None
    # The coordinator keeps ~256 of these per rank, so they have slots, not a dict
    # each (120 bytes instead of 168; at 16,384 ranks' full histories ~200 MB less).
    return step_sample(*got)


def plan_of(types: tuple[type, ...]) -> tuple[tuple[str, Any], ...] | None:
    """For a rank whose simple fields have ``types`` (in ``FAST_NAMES`` order):
    () when every one is exactly of its type; else the (field, default) to fill
    in, with ``float`` as the "default" of an int to convert; None when a field
    is missing without a default or of another type (the checking path decides)."""
    plan: list[tuple[str, Any]] | None = []
    for f, got in zip(SIMPLE, types):
        if got is f.type:
            continue
        if got is type(ABSENT_VALUE) and f.name in RANK_DEFAULT_VALUES:
            plan.append((f.name, RANK_DEFAULT_VALUES[f.name]))  # type: ignore[union-attr]
        elif f.type is float and got in NUM:
            plan.append((f.name, float))  # type: ignore[union-attr]
        else:
            plan = None
            break
    out = None if plan is None else tuple(plan)
    if len(PLANS) < MAX_PLANS:
        PLANS[types] = out
    return out


def _fast_step(x: dict) -> StepSample | None:
    """A step sample whose fields are of their JSON types, ints where floats go
    made floats, absent ones (an older agent's) their defaults; None else."""
    vals: tuple[Any, ...] = tuple(map(x.get, STEP_FULL, _STEP_ABSENT))
    if not all(type(v) in takes for v, takes in zip(vals, _STEP_TAKES)):
        return None
    return step_sample(*(float(v) if f else v for v, f in zip(vals, _STEP_FLOATS)))
