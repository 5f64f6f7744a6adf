"""Version 2: the same content as version 1 with each rank, its collective
and each step sample a JSON array under a field list sent once per report
(``rank_fields``, ``coll_fields``, ``step_fields``). ``as_rows`` writes it;
``layout`` reads the field lists once per distinct lists into a ``Layout``,
which reads the rows: by position where a row is plainly fine (``plain.py``),
else as the version-1 object of the same content through its checking path
(the same result, the same messages)."""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from . import plain, v1
from .fields import RankState
from .parse import get
from .ranges import MAX_FIELD_NAME, MAX_FIELDS, MAX_STEPS_PER_RANK, ROWS_VERSION, ReportError
from .table import (
    COLL_NAMES,
    FAST_NAMES,
    RANK,
    RANK_DEFAULT_VALUES,
    STEP_FULL,
    STEP_FULL_TYPES,
    STEP_SHORT,
    STEP_SHORT_TYPES,
)

RANK_FIELDS = tuple(f.name for f in RANK)
COLL_FIELDS = COLL_NAMES
STEP_FIELDS = STEP_FULL
FIELD_LISTS = ("rank_fields", "coll_fields", "step_fields")
_SEQ = (list, tuple)


def as_rows(body: dict[str, Any]) -> dict[str, Any]:
    """The version-2 body of a version-1 body (``HostReport.to_dict()`` or JSON of
    it): the same content, each rank, its ``coll`` and each step sample an array
    under a field list sent once (the union of the names, first seen first). What
    v2 cannot say (a field one rank has and another lacks) is a ValueError; an
    agent's ranks all have every field. ``recent_colls``, ``recent_gpu`` and
    ``death`` stay objects inside the row: rarer, and read by the checking parser."""
    ranks = body["ranks"]
    rank_fields = _union(ranks) or RANK_FIELDS
    colls = [r["coll"] for r in ranks if isinstance(r.get("coll"), dict)]
    steps = [s for r in ranks if isinstance(r.get("recent_steps"), _SEQ) for s in r["recent_steps"]]
    coll_fields, step_fields = _union(colls) or COLL_FIELDS, _union(steps) or STEP_FIELDS
    rows = []
    for r in ranks:
        row = _row_of(r, rank_fields)
        if "coll" in r and isinstance(r["coll"], dict):
            row[rank_fields.index("coll")] = _row_of(r["coll"], coll_fields)
        if isinstance(r.get("recent_steps"), _SEQ):  # a tuple in to_dict(), a list in JSON
            row[rank_fields.index("recent_steps")] = [_row_of(x, step_fields) for x in r["recent_steps"]]
        rows.append(row)
    out = {k: v for k, v in body.items() if k != "ranks"}
    out.update(
        v=ROWS_VERSION,
        rank_fields=list(rank_fields),
        coll_fields=list(coll_fields),
        step_fields=list(step_fields),
        ranks=rows,
    )
    return out


def _union(objs: list) -> tuple[str, ...]:
    names: dict[str, None] = {}
    for o in objs:
        if not isinstance(o, dict):
            raise ValueError(f"version 2 has no form for {type(o).__name__} where an object goes")
        if o.keys() != names.keys():  # (as sets, in C) most have the same fields: nothing to add
            names.update(dict.fromkeys(o))
    return tuple(names)


def _row_of(obj: dict, names: tuple[str, ...]) -> list[Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"version 2 has no form for {type(obj).__name__} where an object goes")
    if len(obj) == len(names):
        try:  # as many fields, each of the names among them: the same fields
            return list(map(obj.__getitem__, names))
        except KeyError:
            pass
    raise ValueError("version 2 cannot say that one entry lacks a field another has")


MAX_LAYOUTS = 64  # distinct field lists remembered; hostile input cannot grow it further
LAYOUTS: dict[tuple, Layout] = {}


def layout(obj: dict) -> Layout:
    """The version-2 report's field lists, checked and turned into positions once
    per distinct lists (an agent sends the same lists in every report)."""
    lists = [get(obj, name, list, "report") for name in FIELD_LISTS]
    for name, names in zip(FIELD_LISTS, lists, strict=True):
        if not 0 < len(names) <= MAX_FIELDS:
            raise ReportError(f"report: {name} must list 1..{MAX_FIELDS} field names, got {len(names)}")
    try:
        key = tuple(map(tuple, lists))
        lay = LAYOUTS.get(key)
    except TypeError:  # an unhashable name (a list, an object): refused below
        key, lay = None, None
    if lay is not None:
        return lay
    for name, names in zip(FIELD_LISTS, lists, strict=True):
        for j, n in enumerate(names):
            if type(n) is not str or not 0 < len(n) <= MAX_FIELD_NAME:
                raise ReportError(f"report: {name}[{j}] must be a field name of 1..{MAX_FIELD_NAME} characters")
        if len(set(names)) != len(names):
            twice = next(n for j, n in enumerate(names) if n in names[:j])
            raise ReportError(f"report: {name} names {twice!r} twice")
    assert key is not None
    lay = Layout(*key)
    if len(LAYOUTS) < MAX_LAYOUTS:
        LAYOUTS[key] = lay
    return lay


class Layout:
    """Positions of the fields in one set of version-2 field lists. Names this
    coordinator does not know are skipped, as a version-1 object's unknown keys
    are: a newer agent can add fields. A rank whose row the positional fast path
    cannot take (a missing field without a default, a value not of exactly its
    JSON type, anything odd) is made into the version-1 object of the same
    content and goes through that parser: the same result, the same messages."""

    def __init__(self, rank_fields: tuple[str, ...], coll_fields: tuple[str, ...], step_fields: tuple[str, ...]):
        self.rank_fields, self.coll_fields, self.step_fields = rank_fields, coll_fields, step_fields
        self.width, self.coll_width, self.step_width = len(rank_fields), len(coll_fields), len(step_fields)
        at = {n: i for i, n in enumerate(rank_fields)}
        # The simple fields: every one present, or absent with a default (an older agent's,
        # or a sender that leaves defaults out), read from the padding after the row.
        absent = [n for n in FAST_NAMES if n not in at]
        self.fast = all(n in RANK_DEFAULT_VALUES for n in absent) and "coll" in at
        self.padding = [RANK_DEFAULT_VALUES.get(n) for n in absent]
        self.pad = bool(absent)
        self.rank_i = at.get("rank", -1)
        at.update((n, len(rank_fields) + j) for j, n in enumerate(absent))
        self.simple = itemgetter(*(at[n] for n in FAST_NAMES))
        self.coll_i = at.get("coll", -1)
        self.steps_i, self.colls_i = at.get("recent_steps", -1), at.get("recent_colls", -1)
        self.gpu_i, self.death_i = at.get("recent_gpu", -1), at.get("death", -1)
        self.summary_i = at.get("step_summary", -1)
        cat = {n: i for i, n in enumerate(coll_fields)}
        self.coll_of = itemgetter(*(cat[n] for n in COLL_NAMES)) if all(n in cat for n in COLL_NAMES) else None
        sat = {n: i for i, n in enumerate(step_fields)}
        self.step_of: Any = None
        self.step_full = all(n in sat for n in STEP_FULL)
        if self.step_full:
            self.step_of = itemgetter(*(sat[n] for n in STEP_FULL))
        elif all(n in sat for n in STEP_SHORT) and not any(n in sat for n in STEP_FULL[len(STEP_SHORT) :]):
            self.step_of = itemgetter(*(sat[n] for n in STEP_SHORT))  # an older agent's: no finer split
        # For ``plain``: the whole report at once.
        self.whole = self.fast and self.coll_of is not None
        self.coll_at = itemgetter(self.coll_i)
        self.steps_at = itemgetter(self.steps_i) if self.steps_i >= 0 else None
        self.colls_at = itemgetter(self.colls_i) if self.colls_i >= 0 else None
        self.gpu_at = itemgetter(self.gpu_i) if self.gpu_i >= 0 else None
        self.death_at = itemgetter(self.death_i) if self.death_i >= 0 else None
        self.summary_at = itemgetter(self.summary_i) if self.summary_i >= 0 else None
        self.step_types = list(STEP_FULL_TYPES if self.step_full else STEP_SHORT_TYPES)
        self.step_cols = plain.full_cols if self.step_full else plain.short_cols
        # An agent's lists name the fields in the dataclasses' order: a row is then its values as read.
        self.coll_as_is = coll_fields == COLL_NAMES
        self.steps_as_is = step_fields == (STEP_FULL if self.step_full else STEP_SHORT)

    def named(self, row: Any) -> Any:
        """A row's "rank" as sent, to name it when it is dropped."""
        return row[self.rank_i] if type(row) is list and len(row) == self.width and self.rank_i >= 0 else None

    def rank(self, row: Any, i: int) -> RankState:
        return self.checked_rank(row, i)[0]

    def checked_rank(self, row: Any, i: int) -> tuple[RankState, bool]:
        """(the rank, True if its values are known to be in range: ``rank_problem``
        would find nothing)."""
        fast = self.fast_rank(row) if self.fast and type(row) is list and len(row) == self.width else None
        return fast if fast is not None else (v1.rank_from_dict(self.as_object(row, f"ranks[{i}]"), i), False)

    def fast_rank(self, row: list) -> tuple[RankState, bool] | None:
        """A row whose every field has exactly its JSON type, by position:
        (the rank, whether its values are in range); None for anything else."""
        return plain.fast_row(self, row)

    def as_object(self, row: Any, where: str) -> dict[str, Any]:
        """The version-1 rank object of ``row``, its errors naming the field lists."""
        if type(row) is not list:
            raise ReportError(f"{where} must be an array of the {self.width} values rank_fields names")
        if len(row) != self.width:
            raise ReportError(f"{where} has {len(row)} values; rank_fields names {self.width}")
        obj = dict(zip(self.rank_fields, row))
        if "coll" in obj:
            obj["coll"] = self._sub(obj["coll"], self.coll_fields, "coll_fields", f"{where}.coll")
        steps = obj.get("recent_steps")
        if type(steps) is list and len(steps) <= MAX_STEPS_PER_RANK:  # else the version-1 message
            obj["recent_steps"] = [
                self._sub(x, self.step_fields, "step_fields", f"{where}.recent_steps[{j}]") for j, x in enumerate(steps)
            ]
        return obj

    @staticmethod
    def _sub(row: Any, names: tuple[str, ...], listed: str, where: str) -> dict[str, Any]:
        if type(row) is not list or len(row) != len(names):
            raise ReportError(f"{where} must be an array of the {len(names)} values {listed} names")
        return dict(zip(names, row))

    def plain(self, rows: list) -> tuple[RankState, ...] | None:
        """Every row of a report at once, when each is plainly fine: exactly of its
        JSON types (as ``plain.fast_row`` takes them: no int where a float goes), in range
        (``checks.in_range``), of a rank no other row has; then the RankStates the
        per-row path gives, value for value and dict for dict. None for anything
        else or any doubt: the per-row path decides, with its drops and messages.

        The checks go a column at a time (a field's values over the ~8 rows, all
        the step samples together) through C (map, zip, min, max, sum): the
        per-row path's Python work per rank, per check, is done once a report."""
        n = len(rows)
        if not n or not self.whole:
            return None
        try:
            return plain.plain_ranks(self, rows, n)
        except (TypeError, ValueError, OverflowError):  # pragma: no cover - not expected: the per-row path decides
            return None
