"""A version-2 report body read straight into its HostReport, by msgspec.

The usual path reads a body in two passes: JSON into Python objects (orjson,
``coordinator/jsonbody``), then the schema checks those objects' types and
ranges and builds the report from them (``HostReport.from_dict``:
``Layout.plain`` for rows that are plainly fine). At 16,384 ranks that was
~270 us of a report's ~600 us of CPU in process, most of it making and checking objects that were
thrown away. msgspec parses the rows into typed tuples in one pass in C, each
value checked against its field's type and range as it is read (``Meta``
constraints: the field table's ranges, ``Range.bounds``), so only what it
cannot say is left to Python: a rank below its world size, ranks distinct, the
Flight Recorder's and the GPU's rarer nested entries, the step summaries.
The RankStates are then built by the schema's own code (``plain.ranks_of``,
``plain.samples_of``): the same objects, the same shared values.

``read`` answers only where it is sure: the report ``from_dict`` gives, with
nothing dropped. For anything else (a version-1 body, a field of the wrong
type or out of range, a field list it has no reader for, too many acks, an
error of any kind) it answers None and the usual path reads the body, with
its drops and messages. So it changes no outcome, only the cost of the common
one (tests/test_coord_typedbody.py compares both on agents' and hostile bodies).
Without msgspec (a ``--no-deps`` install) every body takes the usual path."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain
from operator import attrgetter, lt
from typing import Annotated, Any, Literal

from . import plain
from .fields import HostReport, RankState
from .parse import list_of_dicts, summary_config
from .ranges import MAX_ACKS_PER_REPORT, MAX_RANKS_PER_REPORT, MAX_STEPS_PER_RANK, ROWS_VERSION, ReportError
from .rows import FIELD_LISTS, MAX_LAYOUTS, layout
from .table import COLL, NEVER_OR_SECONDS, RANK_NAME, REPORT_SIMPLE, SIMPLE, STEP, WORLD_NAME, Field

_ANNOTATED: Any = Annotated  # subscripted with a type known at run time
_REPORT_NAMES = tuple(f.name for f in REPORT_SIMPLE)
_report_of = attrgetter(*_REPORT_NAMES)

try:
    import msgspec
    from msgspec import Meta
except ImportError:  # pragma: no cover - a --no-deps install: every body takes the usual path
    msgspec = None  # type: ignore[assignment]


def read(body: bytes) -> HostReport | None:
    """``HostReport.from_dict(jsonbody.loads(body), dropped)`` where that drops
    nothing and raises nothing; None where this reader is not sure of that."""
    if msgspec is None:
        return None
    try:
        outer = _OUTER.decode(body)
    except msgspec.DecodeError:  # ValidationError too: a type or a range
        return None
    try:
        rows = _reader((bytes(outer.rank_fields), bytes(outer.coll_fields), bytes(outer.step_fields)))
        config = _config(bytes(outer.step_summary_config))
        if rows is None or config is None:
            return None
        ranks = rows.ranks(outer.ranks)
        acks = list_of_dicts({"acks": outer.acks}, "acks")
        if ranks is None or len(acks) > MAX_ACKS_PER_REPORT:  # the handler logs the acks it drops
            return None
        return HostReport(
            **dict(zip(_REPORT_NAMES, _report_of(outer))),
            ranks=ranks,
            accelerators=tuple(list_of_dicts({"accelerators": outer.accelerators}, "accelerators")),
            acks=tuple(acks),
            step_summary_config=config,
        )
    except (ReportError, msgspec.DecodeError, TypeError, ValueError, OverflowError, RecursionError):
        return None  # (only ReportError and DecodeError are expected) not sure: the usual path decides


def typed(f: Field, as_sent: bool = False) -> Any:
    """A field's type as msgspec checks it: its Python type, within its range.
    ``as_sent``: a float field takes an int too and keeps it an int (the schema
    keeps a collective's seconds as sent; a RankState's it makes floats)."""
    if f.range is None:
        return f.type
    out = _ANNOTATED[f.type, Meta(**f.range.bounds())]
    if as_sent and f.type is float:
        as_int: dict[str, Any] = {k: int(v) for k, v in f.range.bounds().items()}
        return Annotated[int, Meta(**as_int)] | out
    return out


if msgspec is not None:
    # A version-2 report around its rows (read later, by the rows' field lists). An
    # agent sends the same field lists and summary settings in every report: kept as
    # their bytes, read and checked once per distinct bytes (_reader, _config).
    _Outer = msgspec.defstruct(
        "_Outer",
        [
            ("v", Literal[2]),
            *((f.name, typed(f)) for f in REPORT_SIMPLE),
            *((name, msgspec.Raw) for name in (*FIELD_LISTS, "ranks")),
            ("accelerators", Any, msgspec.field(default_factory=list)),  # checked as from_dict checks them
            ("acks", Any, msgspec.field(default_factory=list)),
            ("step_summary_config", msgspec.Raw, msgspec.Raw(b"[]")),
        ],
    )
    _OUTER: Any = msgspec.json.Decoder(_Outer)
    _JSON = msgspec.json.Decoder()  # a field list's or the settings' bytes, as plain JSON values
    assert ROWS_VERSION == 2
    # The table's ranges, field by field (a rank below its world size, and -1 as the
    # only value below 0 of a never-or-seconds field, are checked after).
    _RANK_TYPES = {f.name: typed(f) for f in SIMPLE}
    _COLL_TYPES = {f.name: typed(f, as_sent=True) for f in COLL}
    _STEP_TYPES = {f.name: typed(f) for f in STEP}


class _Rows:
    """The rows of one set of field lists, read by a msgspec decoder made for
    them: each row a tuple of the fields in the lists' order, typed and ranged;
    names this coordinator does not know read as whatever they hold (skipped
    later, as the schema skips them)."""

    def __init__(self, lay: Any) -> None:
        self.lay = lay
        coll = _tuple_of(_COLL_TYPES.get(n, Any) for n in lay.coll_fields)
        step = _tuple_of(_STEP_TYPES.get(n, Any) for n in lay.step_fields)
        special = {
            "coll": coll,
            "recent_steps": _list_of(step, MAX_STEPS_PER_RANK if lay.step_of else 0),  # 0: fields it cannot take
        }
        row = _tuple_of(special.get(n) or _RANK_TYPES.get(n, Any) for n in lay.rank_fields)
        self.decoder = msgspec.json.Decoder(_list_of(row, MAX_RANKS_PER_REPORT, at_least=1))
        self.padding = tuple(lay.padding)
        at = {n: i for i, n in enumerate(lay.rank_fields)}
        self.rank_at, self.world_at = at[RANK_NAME], at[WORLD_NAME]
        self.never_at = [at[n] for n in NEVER_OR_SECONDS if n in at]

    def ranks(self, raw: Any) -> tuple[RankState, ...] | None:
        rows = self.decoder.decode(raw)
        lay, n = self.lay, len(rows)
        ranks = [r[self.rank_at] for r in rows]
        if not all(map(lt, ranks, (r[self.world_at] for r in rows))) or len(set(ranks)) != n:
            return None
        for at in self.never_at:
            ages = [r[at] for r in rows]
            if min(ages) < 0 and any(a != -1.0 for a in ages if a < 0):  # -1: never
                return None
        nested = plain.nested_of(lay, rows, n)
        if nested is None or not plain.no_deaths(lay, rows):
            return None
        summaries = plain.summaries(lay, rows, n)
        if summaries is None:
            return None
        vals = list(map(lay.simple, map(tuple.__add__, rows, [self.padding] * n) if self.padding else rows))
        cvals = list(map(lay.coll_at, rows))
        if not lay.coll_as_is:
            cvals = list(map(lay.coll_of, cvals))
        samples: Any = [()] * n
        if lay.steps_at is not None:
            steps = list(map(lay.steps_at, rows))
            gots = list(chain.from_iterable(steps))
            if gots:
                if not lay.steps_as_is:
                    gots = list(map(lay.step_of, gots))
                samples = plain.samples_of(tuple(zip(*gots)), list(map(len, steps)))
        colls, gpus = nested
        return plain.ranks_of(vals, cvals, samples, colls, gpus, summaries)


def _tuple_of(types: Iterable[Any]) -> Any:
    """The type of a fixed-length array of these types, in order."""
    return tuple.__class_getitem__(tuple(types))


def _list_of(typ: Any, at_most: int, at_least: int = 0) -> Any:
    return Annotated[list[typ], Meta(min_length=at_least, max_length=at_most)]


_MAX_READERS = MAX_LAYOUTS  # hostile field lists cannot grow it further
_READERS: dict[tuple[bytes, bytes, bytes], _Rows | None] = {}
_CONFIGS: dict[bytes, tuple[int, ...] | None] = {}


def _reader(lists: tuple[bytes, bytes, bytes]) -> _Rows | None:
    """The rows' reader for the field lists' JSON (rank, coll, step): None where
    the schema refuses them (``rows.layout``: its message then comes from the
    usual path) or its whole-report path does not take their rows either."""
    if lists in _READERS:
        return _READERS[lists]
    try:
        lay = layout(dict(zip(FIELD_LISTS, map(_JSON.decode, lists))))
    except ReportError:
        lay = None
    rows = _Rows(lay) if lay is not None and lay.whole else None
    if len(_READERS) < _MAX_READERS:
        _READERS[lists] = rows
    return rows


def _config(raw: bytes) -> tuple[int, ...] | None:
    """``parse.summary_config`` of the settings' JSON; None where it refuses them."""
    if raw in _CONFIGS:
        return _CONFIGS[raw]
    try:
        got: tuple[int, ...] | None = summary_config({"step_summary_config": _JSON.decode(raw)})
    except ReportError:
        got = None
    if len(_CONFIGS) < _MAX_READERS:
        _CONFIGS[raw] = got
    return got
