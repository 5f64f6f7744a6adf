"""The coordinator journal's format: event names (``names``), one frozen dataclass per
event (``record`` and the modules by subject), the line codec with its MAC (``line``)
and the reader (``reader``).

``parse`` turns a line's object into its typed record (``Unknown`` for an event this
version does not know); ``RECORDS`` maps each event name to its record class, the
table the journal's readers key their reducers by.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import actions, commands, findings, lifecycle, names, performance, ranks
from .record import Record, Unknown

RECORDS: dict[str, type[Record]] = {
    cls.EVENT: cls
    for cls in (
        *lifecycle.RECORDS,
        *findings.RECORDS,
        *ranks.RECORDS,
        *actions.RECORDS,
        *commands.RECORDS,
        *performance.RECORDS,
    )
}
assert sorted(RECORDS) == sorted(names.ALL), "one record class per event name"


def parse(d: Mapping[str, Any]) -> Record:
    """The typed record of one journal object; never raises on what a line holds."""
    name = d.get("event")
    return (RECORDS.get(name, Unknown) if isinstance(name, str) else Unknown).from_dict(d)


__all__ = ["RECORDS", "Record", "Unknown", "parse"]
