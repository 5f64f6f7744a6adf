"""The per-host report an agent sends the coordinator (public API).

Its home is ``watchdog.contracts.report`` (the schema, both encodings, the
checks and the readers, from one field table); this module re-exports that
package's public API under the name the README documents. The public names:
the records ``HostReport``, ``RankState``, ``CollectiveState``, ``StepSample``,
``GpuStep``, ``CollSig``; ``ReportError``; the versions ``REPORT_VERSION``,
``ROWS_VERSION``, ``REPORT_VERSIONS``; the limits ``MAX_*`` and
``MIN_INTERVAL_S``; version 2's ``as_rows`` and field lists ``RANK_FIELDS``,
``COLL_FIELDS``, ``STEP_FIELDS``; ``GPU_FIELDS``; the checks ``rank_problem``
and ``split_valid``; the typed reader ``read_typed``; and the fast builders
``made``, ``built``, ``twinned``, ``step_sample``, ``step_samples``,
``samples_of``, ``ranks_of``.
"""

from watchdog.contracts.report import *  # noqa: F403 (the re-export is the point)
from watchdog.contracts.report import __all__ as __all__
