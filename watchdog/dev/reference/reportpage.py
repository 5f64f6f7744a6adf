"""docs/reference/report.md: the agent -> coordinator report, from its field
table (the report's dataclasses as ``contracts/report/table.py`` reads them) and
its limits."""

from __future__ import annotations

import dataclasses
from typing import Any

from watchdog.contracts.report import fields, ranges
from watchdog.contracts.report import table as field_table
from watchdog.contracts.report.ranges import Range

from .text import code, comments, own_doc, shown, table

# (heading, record): the report, then what it nests, outermost first.
RECORDS: tuple[tuple[str, type], ...] = (
    ("The report", fields.HostReport),
    ("A rank (`ranks`)", fields.RankState),
    ("A rank's collective (`coll`)", fields.CollectiveState),
    ("A step sample (`recent_steps`)", fields.StepSample),
    ("A step on the accelerator's clock (`recent_gpu`)", fields.GpuStep),
    ("A collective as the Flight Recorder saw it (`recent_colls`)", fields.CollSig),
)
_JSON = {int: "integer", float: "number", bool: "boolean", str: "string"}


def _num(x: float) -> str:
    """A bound as written: 2^62 rather than its 19 digits."""
    if float(x).is_integer() and abs(x) >= 1 << 20:
        for k in range(20, 64):
            for value, text in ((1 << k, f"2^{k}"), ((1 << k) - 1, f"2^{k}-1")):
                if abs(x) == value:
                    return "-" + text if x < 0 else text
        return str(int(x))
    return str(int(x)) if float(x).is_integer() else repr(x)


def _range(rng: Range | None) -> str:
    if rng is None:
        return ""
    if rng.max_length is not None:
        return f"at most {rng.max_length} characters"
    if rng.kind == "finite":
        return "finite"
    low = f"[{_num(rng.ge)}" if rng.ge is not None else f"({_num(rng.gt)}" if rng.gt is not None else "(-inf"
    high = f"{_num(rng.le)}]" if rng.le is not None else f"{_num(rng.lt)})" if rng.lt is not None else "inf)"
    return f"{rng.kind} in {low}, {high}"


def _default(f: dataclasses.Field) -> str:
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if value is dataclasses.MISSING:
        return "required"
    if isinstance(value, (tuple, list, dict)) and not value:
        return code("{}" if isinstance(value, dict) else "[]")  # as JSON holds it
    return shown(value)


def record_rows(cls: type) -> list[tuple[str, str, str, str, str]]:
    declared = {f.name: f for f in dataclasses.fields(cls)}
    notes = comments(cls)
    rows = []
    for row in field_table.table(cls):
        kind = _JSON.get(row.type, "") if row.type is not None else code(declared[row.name].type)
        rows.append((code(row.name), kind, _range(row.range), _default(declared[row.name]), notes.get(row.name, "")))
    return rows


def _limits() -> list[tuple[str, str, str]]:
    notes = comments(ranges)
    names = [n for n in notes if n.isupper() and isinstance(getattr(ranges, n), (int, float, tuple))]
    return [(code(n), _limit(getattr(ranges, n)), notes[n]) for n in names]


def _limit(value: Any) -> str:
    return code(_num(value)) if isinstance(value, (int, float)) and not isinstance(value, bool) else shown(value)


def _check_field_lists() -> None:
    """The version-2 field lists are the tables' field orders (what the page says)."""
    pairs: tuple[tuple[tuple[str, ...], Any], ...] = (
        (field_table.COLL_NAMES, fields.CollectiveState),
        (field_table.STEP_FULL, fields.StepSample),
    )
    for names, cls in pairs:
        if names != tuple(f.name for f in dataclasses.fields(cls)):
            raise ValueError(
                f"{cls.__name__}: its version-2 field list is not its field order; say so in reportpage.py"
            )


def render() -> str:
    _check_field_lists()
    versions = ", ".join(map(str, ranges.REPORT_VERSIONS))
    out = [
        "# Report",
        "",
        "What an agent sends its coordinator once a report interval: one JSON object by HTTP POST, with the job "
        f"token as `Authorization: Bearer`. Versions {versions}: version {ranges.REPORT_VERSION} holds an object "
        f"per rank, per collective and per step sample; version {ranges.ROWS_VERSION} holds the same content as "
        "arrays under field lists sent once per report (`rank_fields`, `coll_fields`, `step_fields`: the field "
        "names of the tables below, in their order). An agent sends version "
        f"{ranges.ROWS_VERSION} once a coordinator's reply listed it in `report_versions`. Unknown fields are "
        "ignored; a field with a default may be left out (an older agent); a missing or mistyped required field, "
        "or a value out of its range, refuses the report (or drops that rank), naming the field.",
        "",
        "Python: `watchdog.report` (`HostReport.from_dict`, `as_rows`).",
        "",
    ]
    for heading, cls in RECORDS:
        out += [f"## {heading}", ""]
        doc = own_doc(cls)
        if doc:
            out += [" ".join(doc.split()), ""]
        out += table(("Field", "Type", "Range", "Default", "Meaning"), record_rows(cls))
        out.append("")
    out += ["## Limits", ""]
    out += table(("Name", "Value", "Meaning"), _limits())
    out.append("")
    return "\n".join(out)
