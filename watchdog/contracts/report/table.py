"""The field table (``fields.py``) as the codecs and checks read it: each
record's fields with their JSON type, range and default, and the names of
each range's kind. Worked out once, at import, from the dataclasses'
declarations; nothing here is written twice."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Annotated, Any, get_args, get_origin, get_type_hints

from .fields import CollectiveState, GpuStep, HostReport, RankState, StepSample
from .ranges import Range

NUM = (int, float)  # a float field's JSON: an int is taken (and made a float)


@dataclass(frozen=True)
class Field:
    """One row of the table."""

    name: str
    type: type | None  # int, float, bool or str; None: a nested value (a record, a list, an object)
    range: Range | None  # None: any value of its type
    default: Any  # MISSING: required
    json: Any  # the JSON types it takes (a float field takes an int too)


def table(cls: type) -> tuple[Field, ...]:
    """The rows of a record's declaration, in its field order."""
    hints = get_type_hints(cls, include_extras=True)
    out = []
    for f in fields(cls):
        hint, rng = hints[f.name], None
        if get_origin(hint) is Annotated:
            hint, rng = get_args(hint)[0], get_args(hint)[1]
        typ = hint if hint in (int, float, bool, str) else None
        out.append(Field(f.name, typ, rng, f.default, NUM if typ is float else typ))
    return tuple(out)


def kind(rows: tuple[Field, ...], name: str) -> tuple[str, ...]:
    """The names of the fields whose range is of this kind, in field order."""
    return tuple(f.name for f in rows if f.range is not None and f.range.kind == name)


def only(rows: tuple[Field, ...], name: str) -> str:
    """The one field of a kind there is one of (the world size, the rank)."""
    (out,) = kind(rows, name)
    return out


RANK = table(RankState)
COLL = table(CollectiveState)
STEP = table(StepSample)
GPU = table(GpuStep)
REPORT = table(HostReport)

# Per rank: the simple fields (a JSON number, bool or string each) and the nested ones.
SIMPLE = tuple(f for f in RANK if f.type is not None)
FAST_NAMES = tuple(f.name for f in SIMPLE)
FAST_TYPES = tuple(f.type for f in SIMPLE)  # as an agent's JSON has them
FAST_TYPES_BY_NAME = dict(zip(FAST_NAMES, FAST_TYPES))
NESTED_NAMES = tuple(f.name for f in RANK if f.type is None)
RANK_DEFAULTS = {f.name for f in RANK if f.default is not MISSING}  # may be left out by an older agent
RANK_DEFAULT_VALUES = {f.name: f.default for f in SIMPLE if f.default is not MISSING}
COUNTS = kind(RANK, "count")
POSITIVES = tuple(f.name for f in RANK if f.range is not None and f.range.kind == "count" and f.range.gt == 0)
AGES = kind(RANK, "seconds")
BOUNDED = tuple((f.name, f.range) for f in RANK if f.range is not None and f.range.kind == "bounded")
FINITES = kind(RANK, "finite")
NEVER_OR_SECONDS = kind(RANK, "never_or_seconds")
WORDS = kind(RANK, "int64")
TEXTS = tuple((f.name, f.range.max_length) for f in RANK if f.range is not None and f.range.kind == "text")
WORLD_NAME, RANK_NAME = only(RANK, "world"), only(RANK, "rank")

# A rank's collective.
COLL_NAMES = tuple(f.name for f in COLL)
COLL_EXACT = tuple(f.type for f in COLL)
COLL_COUNTS, COLL_WORDS, COLL_SECONDS = kind(COLL, "count"), kind(COLL, "int64"), kind(COLL, "seconds")

# A step sample: an older agent sends the short form (no coll_bytes, no finer split).
STEP_FULL = tuple(f.name for f in STEP)
STEP_SHORT = STEP_FULL[: STEP_FULL.index("coll_bytes")]
FINER = tuple(n for n in kind(STEP, "seconds") if n not in STEP_SHORT)  # the finer split of the compute
STEP_FULL_TYPES = tuple(f.type for f in STEP)
STEP_SHORT_TYPES = STEP_FULL_TYPES[: len(STEP_SHORT)]
STEP_COUNTS, STEP_SECONDS = kind(STEP, "count"), kind(STEP, "seconds")
GPU_FIELDS = kind(GPU, "seconds")

# Per report: its simple fields (the nested ones are read each its own way).
REPORT_SIMPLE = tuple(f for f in REPORT if f.type is not None and f.name != "v")
assert all(f.range is None for f in REPORT_SIMPLE), "per-report fields: reader.py checks their types only"
