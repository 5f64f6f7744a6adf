"""A version-2 report body read straight into its HostReport, by msgspec.

The usual path reads a body in two passes: JSON into Python objects (orjson,
``jsonbody``), then the schema checks those objects' types and ranges and
builds the report from them (``HostReport.from_dict``: ``_Layout.plain`` for
rows that are plainly fine). At 16,384 ranks that was ~270 us of a report's
~600 us of CPU in process, most of it making and checking objects that were
thrown away. msgspec parses the rows into typed tuples in one pass in C, each
value checked against its field's type and range as it is read (``Meta``
constraints: the ranges of ``report._all_in_range``), so only what it cannot
say is left to Python: a rank below its world size, ranks distinct, the
Flight Recorder's and the GPU's rarer nested entries, the step summaries.
The RankStates are then built by the schema's own code (``report.ranks_of``,
``report.samples_of``): the same objects, the same shared values.

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
from operator import lt
from typing import Annotated, Any, Literal

from watchdog import report as schema
from watchdog.report import (
    MAX_ACKS_PER_REPORT,
    MAX_COUNT,
    MAX_RANKS_PER_REPORT,
    MAX_SECONDS,
    MAX_STEPS_PER_RANK,
    MAX_WORLD_SIZE,
    ROWS_VERSION,
    HostReport,
    ReportError,
)

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
        acks = schema._opt_list_of_dicts({"acks": outer.acks}, "acks")
        if ranks is None or len(acks) > MAX_ACKS_PER_REPORT:  # the handler logs the acks it drops
            return None
        return HostReport(
            job=outer.job,
            host=outer.host,
            agent_id=outer.agent_id,
            seq=outer.seq,
            sent_wall=outer.sent_wall,
            interval_s=outer.interval_s,
            ranks=ranks,
            accelerators=tuple(schema._opt_list_of_dicts({"accelerators": outer.accelerators}, "accelerators")),
            acks=tuple(acks),
            step_summary_config=config,
        )
    except (ReportError, msgspec.DecodeError, TypeError, ValueError, OverflowError, RecursionError):
        return None  # (only ReportError and DecodeError are expected) not sure: the usual path decides


if msgspec is not None:

    class _Outer(msgspec.Struct):
        """A version-2 report around its rows (read later, by the rows' field lists)."""

        v: Literal[2]
        job: str
        host: str
        agent_id: str
        seq: int
        sent_wall: float
        interval_s: float
        # An agent sends the same field lists and summary settings in every report:
        # kept as their bytes, read and checked once per distinct bytes (_reader, _config).
        rank_fields: msgspec.Raw
        coll_fields: msgspec.Raw
        step_fields: msgspec.Raw
        ranks: msgspec.Raw
        accelerators: Any = msgspec.field(default_factory=list)  # checked as from_dict checks them
        acks: Any = msgspec.field(default_factory=list)
        step_summary_config: msgspec.Raw = msgspec.Raw(b"[]")

    _OUTER = msgspec.json.Decoder(_Outer)
    _JSON = msgspec.json.Decoder()  # a field list's or the settings' bytes, as plain JSON values
    assert ROWS_VERSION == 2

    _COUNT = Annotated[int, Meta(ge=0, lt=MAX_COUNT)]
    _SECONDS = Annotated[float, Meta(ge=0.0, lt=MAX_SECONDS)]
    _INT64 = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
    # The ranges of report._all_in_range, field by field (a rank below its world size,
    # fr_read_age_s -1 or >= 0 and gpu_clock's length are checked after).
    _RANK_TYPES: dict[str, Any] = {
        **dict.fromkeys(schema._COUNTS, _COUNT),
        **dict.fromkeys(schema._AGES, _SECONDS),
        "world_size": Annotated[int, Meta(gt=0, le=MAX_WORLD_SIZE)],
        "rank": Annotated[int, Meta(ge=0, lt=MAX_WORLD_SIZE)],
        "pid": Annotated[int, Meta(gt=0, lt=MAX_COUNT)],
        "cpu_percent": Annotated[float, Meta(ge=0.0, lt=1e7)],
        "created_wall": Annotated[float, Meta(ge=0.0, lt=1e11)],
        "fr_read_age_s": Annotated[float, Meta(ge=-1.0, lt=MAX_SECONDS)],
        "loss": Annotated[float, Meta(ge=-1.7976931348623157e308, le=1.7976931348623157e308)],  # finite
        "fr_newest_group": _INT64,
    }
    for _name, _typ in schema._RANK_TYPES.items():
        if _typ is bool or _typ is str:
            _RANK_TYPES[_name] = _typ
    _RANK_TYPES["frame"] = Annotated[str, Meta(max_length=schema.FRAME_TEXT)]
    # A field added to RankState needs its range here: the rows it is in would all go the long way.
    assert set(_RANK_TYPES) == set(schema._FAST_NAMES), set(schema._FAST_NAMES) ^ set(_RANK_TYPES)
    _COLL_TYPES = {
        "group": _INT64,
        "seq": _COUNT,
        "done_seq": _COUNT,
        "op": str,
        "bytes": _COUNT,
        "outstanding": _COUNT,
        # The schema keeps an int here as sent (a RankState's seconds it makes floats): so does this.
        "since_s": Annotated[int, Meta(ge=0, lt=int(MAX_SECONDS))] | _SECONDS,
    }
    _STEP_TYPES = {
        "step": _COUNT,
        "step_s": _SECONDS,
        "data_s": _SECONDS,
        "coll_s": _SECONDS,
        "phase": str,
        "coll_bytes": _COUNT,
        **dict.fromkeys(schema._FINER, _SECONDS),
    }
    assert tuple(_COLL_TYPES) == schema._COLL_NAMES and tuple(_STEP_TYPES) == schema._STEP_FULL


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
        self.rank_at, self.world_at, self.fr_age_at = at["rank"], at["world_size"], at.get("fr_read_age_s", -1)
        self.clock_at = at.get("gpu_clock", -1)

    def ranks(self, raw: Any) -> tuple[schema.RankState, ...] | None:
        rows = self.decoder.decode(raw)
        lay, n = self.lay, len(rows)
        ranks = [r[self.rank_at] for r in rows]
        if not all(map(lt, ranks, (r[self.world_at] for r in rows))) or len(set(ranks)) != n:
            return None
        ages = [r[self.fr_age_at] for r in rows] if self.fr_age_at >= 0 else [0.0]
        if min(ages) < 0 and any(a != -1.0 for a in ages if a < 0):  # -1: never read
            return None
        if self.clock_at >= 0 and max(len(r[self.clock_at]) for r in rows) > schema._SIG_TEXT:
            return None
        nested = lay.nested(rows, n)
        if nested is None or not lay.no_deaths(rows):
            return None
        summaries = lay.summaries(rows, n)
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
                samples = schema.samples_of(tuple(zip(*gots)), list(map(len, steps)))
        colls, gpus = nested
        return schema.ranks_of(vals, cvals, samples, colls, gpus, summaries)


def _tuple_of(types: Iterable[Any]) -> Any:
    """The type of a fixed-length array of these types, in order."""
    return tuple.__class_getitem__(tuple(types))


def _list_of(typ: Any, at_most: int, at_least: int = 0) -> Any:
    return Annotated[list[typ], Meta(min_length=at_least, max_length=at_most)]


_MAX_READERS = 64  # as report._MAX_LAYOUTS: hostile field lists cannot grow it further
_READERS: dict[tuple[bytes, bytes, bytes], _Rows | None] = {}
_CONFIGS: dict[bytes, tuple[int, ...] | None] = {}


def _reader(lists: tuple[bytes, bytes, bytes]) -> _Rows | None:
    """The rows' reader for the field lists' JSON (rank, coll, step): None where
    the schema refuses them (``report._layout``: its message then comes from the
    usual path) or its whole-report path does not take their rows either."""
    if lists in _READERS:
        return _READERS[lists]
    try:
        lay = schema._layout(dict(zip(("rank_fields", "coll_fields", "step_fields"), map(_JSON.decode, lists))))
    except ReportError:
        lay = None
    rows = _Rows(lay) if lay is not None and lay.whole else None
    if len(_READERS) < _MAX_READERS:
        _READERS[lists] = rows
    return rows


def _config(raw: bytes) -> tuple[int, ...] | None:
    """``report._summary_config`` of the settings' JSON; None where it refuses them."""
    if raw in _CONFIGS:
        return _CONFIGS[raw]
    try:
        got: tuple[int, ...] | None = schema._summary_config({"step_summary_config": _JSON.decode(raw)})
    except ReportError:
        got = None
    if len(_CONFIGS) < _MAX_READERS:
        _CONFIGS[raw] = got
    return got
