"""A report body as JSON decoded it (either version) into its HostReport:
what ``HostReport.from_dict`` does."""

from __future__ import annotations

from typing import Any

from . import v1
from .fields import HostReport
from .parse import get, list_of_dicts, summary_config
from .ranges import MAX_RANKS_PER_REPORT, REPORT_VERSION, ROWS_VERSION, VERSIONS_TEXT, ReportError
from .rows import layout
from .table import REPORT_SIMPLE


def host_report(obj: Any, dropped: list[tuple[int, Any, str]] | None = None) -> HostReport:
    """``HostReport.from_dict``. ``dropped``: when given, a rank entry that cannot be
    accepted is left out and noted there as (index, its "rank" field as sent, why)
    instead of failing the whole report: one bad rank must not make its host look lost."""
    if not isinstance(obj, dict):
        raise ReportError("report must be a JSON object")
    v = obj.get("v")
    if v != REPORT_VERSION and v != ROWS_VERSION:
        raise ReportError(f"unsupported report version {v!r}; this coordinator reads {VERSIONS_TEXT}")
    ranks_raw = get(obj, "ranks", list, "report")
    if len(ranks_raw) > MAX_RANKS_PER_REPORT:
        raise ReportError(f"report has {len(ranks_raw)} ranks, limit {MAX_RANKS_PER_REPORT}")
    lay = layout(obj) if v == ROWS_VERSION else None
    plain = lay.plain(ranks_raw) if lay is not None else None
    if plain is not None:  # every row plainly fine: what the per-row path below gives, in one go
        ranks = plain
    elif dropped is None:
        parse = v1.rank_from_dict if lay is None else lay.rank
        ranks = tuple(parse(r, i) for i, r in enumerate(ranks_raw))
    elif lay is None:
        ranks = tuple(v1.tolerant_ranks(ranks_raw, dropped))
    else:
        ranks = tuple(v1.tolerant_ranks(ranks_raw, dropped, lay.checked_rank, lay.named))
    kw: dict[str, Any] = {}
    for f in REPORT_SIMPLE:
        val = get(obj, f.name, f.json, "report")
        kw[f.name] = float(val) if f.type is float else val
    return HostReport(
        **kw,
        ranks=ranks,
        accelerators=tuple(list_of_dicts(obj, "accelerators")),
        acks=tuple(list_of_dicts(obj, "acks")),
        step_summary_config=summary_config(obj),
    )
