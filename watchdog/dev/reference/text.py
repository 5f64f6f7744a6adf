"""Markdown helpers for the reference pages: a table, a value shown in a cell,
and the comments the source keeps beside its declarations (read with ``ast`` and
``tokenize``: for a layout word or a field, its comment is its documentation)."""

from __future__ import annotations

import ast
import inspect
import io
import re
import textwrap
import tokenize
import types
from collections.abc import Iterable, Sequence
from typing import Any

# Comment lines that are directives or section rulers, not documentation.
_NOT_NOTES = ("ruff:", "noqa", "type:", "--", "pragma:")


# A reference to one of the package's modules inside a comment: "(watchdog.hook.marks.frames)",
# "(control/replay.py)", "See agent/steadystart.py." The pages name what a user sees,
# not where it is implemented (modules move; the format does not).
_MODULE = r"(?:watchdog(?:\.\w+)+|(?:\w+/)*\w+\.py)"
_MODULE_NOTES = (
    (re.compile(rf"\s*\((?:see )?{_MODULE}\)"), ""),
    (re.compile(rf"\s*See {_MODULE}\."), ""),
    (re.compile(rf"\s*\({_MODULE}: "), " ("),
    (re.compile(rf" \({_MODULE}, "), " ("),
)


def without_modules(text: str) -> str:
    """``text`` less its references to the package's modules."""
    for pattern, replacement in _MODULE_NOTES:
        text = pattern.sub(replacement, text)
    return text


def cell(text: object) -> str:
    """One table cell: a single line, pipes escaped, reStructuredText's literals as Markdown's."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("``", "`")


def code(value: object) -> str:
    """A literal in backticks (empty for an empty string)."""
    text = str(value)
    return f"`{text}`" if text else ""


def shown(value: Any) -> str:
    """A default or a constant as a reader types it."""
    if isinstance(value, str):
        return code(repr(value)) if value == "" else code(value)
    if isinstance(value, bool):
        return code(str(value).lower())
    if isinstance(value, (tuple, list, frozenset, set)):
        items = sorted(value) if isinstance(value, (frozenset, set)) else value
        return code(", ".join(map(str, items))) if items else code("(none)")
    return code(repr(value))


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


def first_paragraph(doc: str | None) -> str:
    """A docstring's first paragraph on one line ("" when there is none)."""
    return without_modules(" ".join(inspect.cleandoc(doc or "").split("\n\n", 1)[0].split()))


def own_doc(cls: type) -> str:
    """A class's own docstring: a dataclass without one gets its signature, which says nothing."""
    doc = cls.__doc__ or ""
    return "" if doc.startswith(cls.__name__ + "(") else without_modules(inspect.cleandoc(doc))


def _names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    if not isinstance(stmt, ast.Assign):
        return []
    out: list[str] = []
    for target in stmt.targets:
        elts = target.elts if isinstance(target, ast.Tuple) else [target]
        out += [e.id for e in elts if isinstance(e, ast.Name)]
    return out


_COMMENTS: dict[str, dict[str, str]] = {}  # by the module's or class's full name: read once


def comments(obj: types.ModuleType | type) -> dict[str, str]:
    """Name -> the comment beside its assignment in ``obj``'s body (a module's top
    level or a class's), else the comment lines right above it; for a class
    statement, the comment lines above it under the class's name."""
    key = obj.__name__ if isinstance(obj, types.ModuleType) else f"{obj.__module__}.{obj.__qualname__}"
    if key not in _COMMENTS:
        _COMMENTS[key] = _comments(obj)
    return _COMMENTS[key]


def _comments(obj: types.ModuleType | type) -> dict[str, str]:
    src = textwrap.dedent(inspect.getsource(obj))
    tree = ast.parse(src)
    first = tree.body[0]
    body = first.body if not isinstance(obj, types.ModuleType) and isinstance(first, ast.ClassDef) else tree.body
    notes: dict[int, tuple[str, bool]] = {}  # line -> (text, a line of its own)
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if not text.startswith(_NOT_NOTES):
                notes[tok.start[0]] = (text, tok.line.strip().startswith("#"))
    out: dict[str, str] = {}
    for stmt in body:
        names = [stmt.name] if isinstance(stmt, ast.ClassDef) else _names(stmt)
        if not names:
            continue
        # A statement's own lines (a class's are its body's, not its own).
        lines = () if isinstance(stmt, ast.ClassDef) else range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
        note = " ".join(notes[n][0] for n in lines if n in notes and not notes[n][1])
        if not note:
            top = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", []))])
            above: list[str] = []
            line = top - 1
            while line in notes and notes[line][1]:
                above.insert(0, notes[line][0])
                line -= 1
            note = " ".join(above)
        for name in names:
            out[name] = without_modules(note)
    return out


def lines_after(module: types.ModuleType, name: str) -> list[str]:
    """The comment lines right below the assignment of ``name`` in ``module``, as
    written (a block that documents what precedes it, such as a record's payloads)."""
    src = inspect.getsource(module)
    stmt = next(s for s in ast.parse(src).body if name in _names(s))
    out: list[str] = []
    for line in src.splitlines()[stmt.end_lineno or stmt.lineno :]:
        if not line.startswith("#"):
            break
        out.append(line[2:] if line.startswith("# ") else line[1:])
    return out
