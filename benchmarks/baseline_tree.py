"""Another checkout's ``watchdog`` package, imported beside this tree's as the
package ``baseline_watchdog``: what the A/B benchmarks (``scale_profile.py
--compare-with``, ``fold_ab.py``) run the same inputs through in one process, so
their ratios are not at the mercy of a noisy machine between two runs."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

NAME = "baseline_watchdog"


def module(root: str, name: str) -> ModuleType:
    """``watchdog.<name>`` of the checkout at ``root`` (``name`` e.g. "coordinator.view")."""
    if NAME not in sys.modules:
        pkg = os.path.join(os.path.abspath(root), "watchdog")
        spec = importlib.util.spec_from_file_location(
            NAME, os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg]
        )
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[NAME] = mod
        spec.loader.exec_module(mod)
    return importlib.import_module(f"{NAME}.{name}")
