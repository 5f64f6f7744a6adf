"""tests/shared_job_order.py's list is kept by hand: an integration module that drives one job
through its tests with a module-scoped fixture and is not listed is split across xdist workers,
each starting its own job, and its order-dependent tests break only at -n 3 and above."""

from __future__ import annotations

import re
from pathlib import Path

from shared_job_order import LONG_MODULES, READ_ONLY, SEQUENCES, SharedJobScheduling, priority

ROOT = Path(__file__).resolve().parent.parent


def _module_scoped_integration_modules() -> set[str]:
    found = set()
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        text = path.read_text()
        if "pytest.mark.integration" in text and re.search(r"fixture\(\s*scope=\"module\"", text):
            found.add(f"tests/{path.name}")
    return found


def test_every_module_the_lists_name_exists():
    listed = SEQUENCES | READ_ONLY | LONG_MODULES  # a renamed module would fall out of them silently
    assert sorted(m for m in listed if not (ROOT / m).is_file()) == []


def test_every_integration_module_with_a_module_scoped_fixture_is_kept_on_one_worker_or_read_only():
    listed = SEQUENCES | READ_ONLY
    assert _module_scoped_integration_modules() <= listed, sorted(_module_scoped_integration_modules() - listed)


def test_a_listed_module_is_one_unit_and_any_other_test_is_its_own():
    split = SharedJobScheduling.__new__(SharedJobScheduling)._split_scope  # reads no state
    seq = sorted(SEQUENCES)[0]
    assert split(f"{seq}::test_a") == split(f"{seq}::test_b[x]") == seq
    assert split("tests/test_e2e_faults.py::test_a") != split("tests/test_e2e_faults.py::test_b")


def test_units_go_out_listed_modules_first_then_the_real_jobs_then_the_rest():
    scopes = [
        "tests/test_timeline_real.py::test_a",
        "tests/test_e2e_blind.py::test_b",
        "tests/test_prom_panels.py::test_c",
        sorted(SEQUENCES)[0],
    ]
    assert sorted(scopes, key=priority) == [scopes[3], scopes[1], scopes[2], scopes[0]]
