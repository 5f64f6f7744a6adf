"""Packaging promises that need no install (tests/test_coexistence.py installs the wheel):

- the plain package has no dependency; each role's extra brings what its modules
  import, and `watchdog <command>` names an extra that exists;
- CI installs `.[test]` alone (.ci/setup), so `test` brings every role;
- the classifiers name only the Python versions CI runs.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

from watchdog import cli

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
# distribution -> the module it provides, for those whose names differ
MODULE_OF = {"prometheus-client": "prometheus_client", "nvidia-ml-py": "pynvml"}


def dist_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower()


def modules_of(extra: str) -> set[str]:
    out = set()
    for req in EXTRAS[extra]:
        name = dist_name(req)
        if name == "rank-watchdog":
            inner = req[req.index("[") + 1 : req.index("]")]
            for sub in inner.split(","):
                out |= modules_of(sub.strip())
        else:
            out.add(MODULE_OF.get(name, name.replace("-", "_")))
    return out


def third_party_imports(package: Path) -> set[str]:
    """Top-level modules a package's files import, outside the standard library and ours."""
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found |= {n.split(".")[0] for n in names}
    return {m for m in found if m not in sys.stdlib_module_names and m != "watchdog"}


def test_the_plain_package_is_the_hook_alone():
    assert PROJECT["dependencies"] == []
    # the hook imports nothing outside the standard library but torch (already in the
    # training image) and psutil, which it uses only when present
    assert third_party_imports(REPO / "watchdog" / "hook") - {"lightning", "transformers", "accelerate"} <= {
        "torch",
        "psutil",
    }


def test_each_role_extra_brings_what_its_modules_import():
    optional = {"torch", "tomli"}  # torch: the hook's; tomli: only below 3.11, in the coordinator extra with a marker
    assert third_party_imports(REPO / "watchdog" / "agent") - optional <= modules_of("agent")
    assert third_party_imports(REPO / "watchdog" / "coordinator") - optional <= modules_of("coordinator")
    assert modules_of("all") == modules_of("agent") | modules_of("coordinator")


def test_commands_name_extras_that_exist():
    assert set(cli.EXTRA_OF) <= set(cli.SUBCOMMANDS)
    assert set(cli.EXTRA_OF.values()) <= set(EXTRAS)
    assert cli.EXTRA_OF["agent"] == "agent" and cli.EXTRA_OF["coordinator"] == "coordinator"
    # a command that starts others as children names an extra that brings each of theirs
    for name, children in cli.STARTS.items():
        assert children and set(children) <= set(cli.SUBCOMMANDS)
        assert all(modules_of(cli.EXTRA_OF[c]) <= modules_of(cli.EXTRA_OF[name]) for c in children), name


def test_ci_installs_every_role():
    assert "rank-watchdog[all]" in EXTRAS["test"]
    setup = (REPO / ".ci" / "setup").read_text()
    assert '-e ".[test]"' in setup


def test_classifiers_name_only_the_python_ci_runs():
    """CI runs this suite on one interpreter (.ci/setup's python3): the classifiers claim it and no other."""
    claimed = {
        c.rsplit(" :: ", 1)[1]
        for c in PROJECT["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    assert claimed == {f"{sys.version_info.major}.{sys.version_info.minor}"}, claimed
