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

from typing import Any

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


# The real-job modules: their tests take 10-70 s each on two cores.
LONG_PREFIX = "tests/test_e2e_"
# The other modules whose tests take 15-25 s, most of it waiting on a real Prometheus or server.
LONG_MODULES = frozenset(
    {
        "tests/test_scale_benchmark.py",
        "tests/test_prom_panels.py",
        "tests/test_two_jobs.py",
        "tests/test_deploy_slurm.py",
        "tests/test_demo_wheel.py",
    }
)


def priority(scope: str) -> int:
    """The order units go out in (lower first, collection order within): the listed modules,
    then the long tests, then the rest, longest first as far as it is known. The run ends
    on short tests, not on a 60 s one that started last, and the long waits on a real
    Prometheus or server (a tenth of their time is CPU) overlap the jobs that need the CPU
    instead of ending the run alone: fresh-clone run 11 ended on 45 s of them at a load of 3-5."""
    if scope in SEQUENCES:
        return 0
    module = scope.split("::", 1)[0]
    return 1 if module.startswith(LONG_PREFIX) or module in LONG_MODULES else 2


class SharedJobScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with a listed module as the scope and a test elsewhere:
    units go out as workers run low, in ``priority`` order, and a worker holds one test
    besides the one it runs (xdist's holds two: at the end of a run a worker idled while
    another still had 20 s tests waiting behind the one it ran)."""

    _ordered = False

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if module in SEQUENCES else nodeid

    def _assign_work_unit(self, node: Any) -> None:
        if not self._ordered:  # the queue is whole by the first assignment (LoadScopeScheduling.schedule)
            self._ordered = True
            units = sorted(self.workqueue.items(), key=lambda kv: priority(kv[0]))  # stable
            self.workqueue.clear()
            self.workqueue.update(units)
        super()._assign_work_unit(node)

    def _reschedule(self, node: Any) -> None:
        # LoadScopeScheduling._reschedule with one held test instead of two. A worker runs a
        # test only once it holds the next (pytest tears fixtures down knowing what follows),
        # so one pending besides the running one is the least that keeps it busy.
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 1:
            return
        self._assign_work_unit(node)
