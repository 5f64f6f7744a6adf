"""Reading a coordinator journal: its records in order, a line torn by a kill
skipped, and with the job token a line whose MAC is wrong (or an unsigned line
after the first signed one) left out (``line.verify``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from . import line as journal_line


def iter_records(path: str, key: str = "", ignored: list[int] | None = None) -> Iterator[dict]:
    """The records, in order; a line torn by a kill is skipped. With ``key`` (the job
    token) a line whose MAC is wrong, and an unsigned line after the first signed one,
    are skipped too, their line numbers appended to ``ignored``."""
    k = key.encode()
    signed_seen = False
    with open(path, "rb") as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            if k:
                ok = journal_line.verify(raw, k)
                if ok is False or (ok is None and signed_seen):
                    if ignored is not None:
                        ignored.append(n)
                    continue
                signed_seen = signed_seen or bool(ok)
            try:
                obj = json.loads(raw)
            except ValueError:
                continue  # torn by a kill mid-write
            if isinstance(obj, dict) and "event" in obj:
                obj.pop("mac", None)
                yield obj


def read(path: str, key: str = "") -> list[dict]:
    """All intact records, in order; torn lines skipped (and with ``key``, untrusted ones)."""
    return list(iter_records(path, key))
