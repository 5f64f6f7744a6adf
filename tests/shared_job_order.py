"""Which tests one xdist worker runs together, in order.

A few integration modules drive one real job through a sequence with a module-scoped
fixture, and a later test reads what an earlier one left: test_e2e_monitor_faults' last
test tears down with the rank an earlier one left stopped. Split across workers, each
worker starts its own copy of the job and the sequence breaks (a fresh-clone run at -n 3).
xdist's ``--dist loadgroup`` with ``xdist_group`` marks is meant for this, but on pytest
9.2 it silently groups nothing (pytest-xdist#1386: the group rides in a node id that
pytest no longer lets a plugin change). This scheduler gives each listed module to one
worker as one unit, and every other test is a unit of its own, as under ``--dist load``.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

# Modules whose tests share one job, in order (a module-scoped fixture they all read).
SEQUENCES = frozenset(
    {
        "tests/test_e2e_monitor_faults.py",
        "tests/test_alert_live.py",
        "tests/test_e2e_spine.py",
        "tests/test_hook_ddp_integration.py",
    }
)


# Modules with a module-scoped fixture whose tests only read what it made (kept session runs,
# tests/conftest.py's ``_kept``): any worker may run any of them.
READ_ONLY = frozenset({"tests/test_timeline_real.py"})


class SharedJobScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with a listed module as the scope and a test elsewhere:
    units go out as workers run low, the largest first (a module before single tests)."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if module in SEQUENCES else nodeid
