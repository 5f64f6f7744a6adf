"""The per-host report: what an agent tells the coordinator about once a second.

The agent builds it from its slot snapshots (``watchdog.agent.reporting.build.build_report``);
the coordinator validates it with ``HostReport.from_dict`` and folds it into its
cluster view. Ages are computed by the agent against its own monotonic clock at
send time (monotonic clocks are not comparable across hosts); the coordinator adds
the time since it received the report.

JSON over HTTP, one object, ``"v": REPORT_VERSION``. Unknown keys are ignored (a
newer agent can add fields); missing or mistyped required keys are a ReportError
with a message naming the field.

Version 2 (``"v": 2``, ``as_rows``) is the same content with each rank, its
collective and each step sample as a JSON array under a field list sent once
per report (``rank_fields``, ``coll_fields``, ``step_fields``): JSON decoding
then builds lists, not one dict per rank and per step (half the bytes, ~0.6x
the decode time), and the schema reads values by position. It decodes to
exactly the ``HostReport`` of the version-1 body. An agent sends it only once
a coordinator's reply listed 2 in ``"report_versions"`` (``REPORT_VERSIONS``);
the coordinator reads both.

One field table drives it all: the dataclasses of ``fields.py``, a line a
field (name, type with its range, default). The modules, by job:

- ``ranges``: the limits, and the ranges a field's type carries
- ``fields``: the field table (the records), ``table``: it as the others read it
- ``checks``: whether a rank's values are in range (``rank_problem``)
- ``parse``: a value against its type; the nested values
- ``v1`` and ``fast``: version 1's checking path and its fast path
- ``rows`` and ``plain``: version 2 (``as_rows``, field lists) and its whole-report path
- ``typed``: a version-2 body read straight into its report by msgspec
- ``reader``: either version's body into its ``HostReport`` (``HostReport.from_dict``)
- ``build``: frozen slots dataclasses built fast (``made``)

The public API is the names this module exports (``__all__``), also
importable as ``watchdog.report``; the modules above are the package's own.
"""

from __future__ import annotations

from .build import built, made, twinned
from .checks import rank_problem, split_valid
from .fields import CollectiveState, CollSig, GpuStep, HostReport, RankState, StepSample, step_sample, step_samples
from .plain import ranks_of, samples_of
from .ranges import (
    MAX_ACKS_PER_REPORT,
    MAX_COLLS_PER_RANK,
    MAX_COUNT,
    MAX_FIELD_NAME,
    MAX_FIELDS,
    MAX_INTERVAL_S,
    MAX_RANKS_PER_REPORT,
    MAX_SECONDS,
    MAX_STEPS_PER_RANK,
    MAX_WORLD_SIZE,
    MIN_INTERVAL_S,
    REPORT_VERSION,
    REPORT_VERSIONS,
    ROWS_VERSION,
    ReportError,
)
from .rows import COLL_FIELDS, RANK_FIELDS, STEP_FIELDS, as_rows
from .table import GPU_FIELDS
from .typed import read as read_typed

__all__ = [
    "COLL_FIELDS",
    "GPU_FIELDS",
    "MAX_ACKS_PER_REPORT",
    "MAX_COLLS_PER_RANK",
    "MAX_COUNT",
    "MAX_FIELDS",
    "MAX_FIELD_NAME",
    "MAX_INTERVAL_S",
    "MAX_RANKS_PER_REPORT",
    "MAX_SECONDS",
    "MAX_STEPS_PER_RANK",
    "MAX_WORLD_SIZE",
    "MIN_INTERVAL_S",
    "RANK_FIELDS",
    "REPORT_VERSION",
    "REPORT_VERSIONS",
    "ROWS_VERSION",
    "STEP_FIELDS",
    "CollSig",
    "CollectiveState",
    "GpuStep",
    "HostReport",
    "RankState",
    "ReportError",
    "StepSample",
    "as_rows",
    "built",
    "made",
    "rank_problem",
    "ranks_of",
    "read_typed",
    "samples_of",
    "split_valid",
    "step_sample",
    "step_samples",
    "twinned",
]
