"""The package's import graph keeps the layout's promises.

Read from the source with ``ast``, nothing imported: every ``import`` statement
counts, at module level or inside a function or ``if TYPE_CHECKING:`` (deferring
an import does not take the dependency away). A failure names the file, the line
and the edge that broke the rule.

- The coordinator's rooms (its subpackages, one node each) and its root modules
  (one node each) form no import cycle, and import each other only along the
  edges ``ROOM_EDGES`` lists: the table is the rooms' layering, written down.
- ``watchdog.contracts`` (the formats) imports nothing else of the package;
  ``watchdog.stepstats`` only the contracts.
- The agent never imports the coordinator; the hook (it runs in every rank)
  never imports the agent or the coordinator. By top-level package, so that
  moving modules into subfolders keeps the rules.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from collections.abc import Iterable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple

PACKAGE = Path(__file__).resolve().parent.parent / "watchdog"
COORDINATOR = "watchdog.coordinator"

# Who may import whom inside the coordinator. A room (a subpackage) is one node,
# a root module is its own node. Each row: the rooms it imports | the root modules
# it imports. Rooms in the order a report goes through them, then the root: the
# service wiring them, the process around it, and the leaves below everything
# (settings, the value sets the rooms share, the metrics).
ROOM_EDGES: dict[str, frozenset[str]] = {
    name: frozenset(targets.replace("|", " ").split())
    for name, targets in {
        # rooms
        "intake": "view analysis detectors | config event_loops metrics",
        "view": "| config",
        "analysis": "view | config",
        "detectors": "view analysis | config metrics",
        "performance": "view analysis control intake journal | config metrics subsystem vocabularies",
        "control": "view detectors evidence recovery journal | metrics policy_file subsystem vocabularies",
        "recovery": "view evidence",
        "evidence": "view detectors journal | config metrics subsystem",
        "journal": "",
        "cli": "intake performance | config daemon metrics",
        # root: the wiring and the process
        "service": "intake view analysis detectors performance control evidence journal | "
        "config exports metrics own_stall subsystem",
        "daemon": "intake journal | config gcpolicy own_stall service",
        "subsystem": "view detectors journal",
        "exports": "analysis journal | config metrics subsystem",
        "own_stall": "view | config",
        "testing": "view | config",
        # root: leaves
        "config": "| event_loops policy_file vocabularies",
        "policy_file": "| vocabularies",
        "metrics": "| host_culprits vocabularies",
        "event_loops": "",
        "gcpolicy": "",
        "host_culprits": "",
        "vocabularies": "",
        "__init__": "",
    }.items()
}

# Top-level packages that must not import others: (importer, imported, why).
FORBIDDEN = (
    ("watchdog.agent", "watchdog.coordinator", "the agent talks to the coordinator over HTTP only"),
    ("watchdog.hook", "watchdog.agent", "the hook runs in every rank: it reads no monitor code"),
    ("watchdog.hook", "watchdog.coordinator", "the hook runs in every rank: it reads no monitor code"),
)
# Packages that may import, of the rest of watchdog, only these.
ONLY = {
    "watchdog.contracts": (),
    "watchdog.stepstats": ("watchdog.contracts",),
}
# Known breaks of ONLY, each with why it is still there (a fixed one must leave the list).
EXCEPTIONS = {
    ("watchdog.contracts.commands", "watchdog.jobtoken"): "the command signature's key derivation "
    "(jobtoken.signing_key) lives beside the token flags; it belongs in contracts",
    ("watchdog.contracts.crash_record", "watchdog.sharedfile"): "the record's readers open a rank's "
    "file past planted links and other users' files through sharedfile (a stdlib-only leaf); "
    "the readers belong beside the agent's other shared-file readers",
}


class Edge(NamedTuple):
    source: str  # importing module, dotted
    target: str  # imported module (the most specific one that is a file of the package)
    where: str  # path:line of the import

    def __str__(self) -> str:
        return f"{self.where}: {self.source} imports {self.target}"


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


@functools.cache
def modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package: dotted name -> (file, is a package's __init__)."""
    return {name: (p, pkg) for p in sorted(PACKAGE.rglob("*.py")) for name, pkg in [_module_name(p)]}


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    known = modules()
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name not in known and "." in name:  # ``import a.b.c`` of a name that is no module
                name = name.rsplit(".", 1)[0]
            yield name
        return
    if node.level:  # relative: from the importing package, one level up per extra dot
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    for alias in node.names:  # ``from pkg import x``: x is a module of pkg, or a name defined in pkg
        sub = f"{prefix}.{alias.name}"
        yield sub if sub in known else prefix


def _imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, however deeply nested in functions, classes and blocks
    (statements only: an import is never inside an expression)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, name, ()):
                if isinstance(child, (ast.ExceptHandler, ast.match_case)):
                    yield from _imports(child.body)
                elif isinstance(child, ast.stmt):
                    yield from _imports([child])


@functools.cache
def edges() -> tuple[Edge, ...]:
    """Every import of a watchdog module by a watchdog module."""
    out = []
    for module, (path, is_package) in modules().items():
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path)).body):
            for target in _targets(node, module, is_package):
                if target == "watchdog" or target.startswith("watchdog."):
                    where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
                    out.append(Edge(module, target, where))
    return tuple(dict.fromkeys(out))  # ``from m import a, b``: one edge


def inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def room(module: str) -> str | None:
    """The coordinator's node a module belongs to: its room, or itself at the root."""
    if not inside(module, COORDINATOR):
        return None
    rest = module[len(COORDINATOR) + 1 :]
    return rest.split(".")[0] if rest else "__init__"


def room_edges() -> dict[tuple[str, str], list[Edge]]:
    """(room, room) -> the imports that make the edge, for imports between two nodes."""
    out: dict[tuple[str, str], list[Edge]] = defaultdict(list)
    for e in edges():
        a, b = room(e.source), room(e.target)
        if a is not None and b is not None and a != b:
            out[(a, b)].append(e)
    return out


def strongly_connected(nodes: Iterable[str], succ: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively; only those of two nodes or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(succ.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(succ.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def shortest_cycle(comp: list[str], succ: dict[str, set[str]]) -> list[str]:
    """The shortest path from a node of ``comp`` back to itself, as its nodes (first == last)."""
    best: list[str] = []
    for start in comp:
        paths = {start: [start]}
        frontier = [start]
        while frontier and not (best and len(paths[frontier[0]]) >= len(best)):
            nxt = []
            for v in frontier:
                for w in sorted(succ[v] & set(comp)):
                    if w == start and (not best or len(paths[v]) + 1 < len(best)):
                        best = [*paths[v], start]
                    elif w not in paths:
                        paths[w] = [*paths[v], w]
                        nxt.append(w)
            frontier = nxt
    return best


def test_the_graph_is_read():
    # The rules below mean something only if the reader sees the imports it should.
    e = set(edges())
    assert len(modules()) > 200
    assert any(x.source == "watchdog.coordinator.service" and x.target == "watchdog.coordinator.config" for x in e)
    assert any(  # a relative ``from .. import module`` resolves to the module
        x.source == "watchdog.coordinator.intake.httpio" and x.target == "watchdog.coordinator.event_loops" for x in e
    )


def test_no_cycle_among_the_coordinators_rooms():
    by_edge = room_edges()
    succ: dict[str, set[str]] = defaultdict(set)
    for a, b in by_edge:
        succ[a].add(b)
    cycles = strongly_connected(sorted(succ), succ)
    lines = []
    for comp in cycles:
        loop = shortest_cycle(comp, succ)
        lines.append(f"import cycle among {', '.join(comp)}; the shortest: {' -> '.join(loop)}")
        for a, b in pairwise(loop):
            lines += [f"  {a} -> {b}"] + [f"    {e}" for e in by_edge[(a, b)]]
    assert not cycles, "\n".join(lines)


def test_rooms_import_along_the_table_only():
    nodes = {room(m) for m in modules() if inside(m, COORDINATOR)}
    unlisted = sorted(n for n in nodes if n is not None and n not in ROOM_EDGES)
    assert not unlisted, f"coordinator rooms or root modules missing from ROOM_EDGES: {unlisted}; add their rows"
    broken = [
        f"{a} -> {b} is not in ROOM_EDGES[{a!r}]:\n" + "\n".join(f"    {e}" for e in imports)
        for (a, b), imports in sorted(room_edges().items())
        if b not in ROOM_EDGES[a]
    ]
    assert not broken, "\n".join(broken)


def test_the_table_lists_only_edges_that_exist():
    # The table is documentation: an edge nobody uses any more is a lie in it.
    real = room_edges()
    stale = sorted(f"{a} -> {b}" for a, targets in ROOM_EDGES.items() for b in targets if (a, b) not in real)
    assert not stale, f"ROOM_EDGES lists edges no import makes (remove them): {stale}"


def test_forbidden_packages():
    broken = [
        f"{e}\n    ({importer} must not import {imported}: {why})"
        for importer, imported, why in FORBIDDEN
        for e in edges()
        if inside(e.source, importer) and inside(e.target, imported)
    ]
    assert not broken, "\n".join(broken)


def test_contracts_and_stepstats_import_only_what_they_may():
    broken, excused = [], set()
    for package, allowed in ONLY.items():
        for e in edges():
            if not inside(e.source, package) or inside(e.target, package):
                continue
            if any(inside(e.target, a) for a in allowed):
                continue
            if (e.source, e.target) in EXCEPTIONS:
                excused.add((e.source, e.target))
                continue
            may = ", ".join(allowed) or "nothing else of watchdog"
            broken.append(f"{e}\n    ({package} may import {may})")
    assert not broken, "\n".join(broken)
    assert excused == set(EXCEPTIONS), f"EXCEPTIONS no longer needed (remove them): {set(EXCEPTIONS) - excused}"
