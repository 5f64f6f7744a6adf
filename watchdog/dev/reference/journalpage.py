"""docs/reference/journal.md: every journal event and its fields, from the
journal's record classes (one frozen dataclass per event)."""

from __future__ import annotations

import dataclasses
import sys

from watchdog.contracts.journal import RECORDS, Record
from watchdog.contracts.journal.record import ABSENT, layout

from .text import code, comments, first_paragraph, own_doc, shown, table


def _written(omit: bool, default: object) -> str:
    if not omit:
        return "always"
    if default is ABSENT:
        return "when set (`null` included)"
    return f"when not {shown(default)}"


def record_rows(cls: type[Record]) -> list[tuple[str, str, str, str]]:
    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    notes = {}
    for klass in reversed(cls.__mro__):  # a field's comment where it is declared
        if dataclasses.is_dataclass(klass) and klass is not Record and issubclass(klass, Record):
            notes.update(comments(klass))
    return [
        (code(key), code(types[attr]), _written(omit, default), notes.get(attr, ""))
        for attr, key, omit, default in layout(cls)
    ]


def render() -> str:
    stamps = [f.name for f in dataclasses.fields(Record) if f.name != "extra"]
    out = [
        "# Journal events",
        "",
        "The coordinator's journal is JSON Lines, one event a line. Every line holds `event` (the names below), "
        f"the stamps {', '.join(code(s) for s in stamps)} (epoch and monotonic seconds when written), the event's "
        "fields in the order listed, and with a job token a last field `mac`. A reader takes an unknown event or "
        "field as it is: newer coordinators add them.",
        "",
    ]
    subject = None
    for name, cls in RECORDS.items():
        module = sys.modules[cls.__module__]
        if module is not subject:
            subject = module
            out += [f"## {first_paragraph(module.__doc__).split(':')[0].rstrip('.')}", ""]
        out += [f"### `{name}`", ""]
        doc = own_doc(cls)
        if doc:
            out += [" ".join(doc.split()), ""]
        rows = record_rows(cls)
        out += (
            table(("Field", "Type", "Written", "Meaning"), rows)
            if rows
            else ["No declared fields: what the line holds besides the stamps is read as it is."]
        )
        out.append("")
    return "\n".join(out)
