"""docs/reference/slot.md: the slot file's layout, from the slot module itself
(public as ``watchdog.wire``): its constants, header, progress and ring-record
words with the comments beside them, and its enumerations."""

from __future__ import annotations

import ast
import enum
import inspect

from watchdog.contracts import slot

from .text import code, comments, lines_after, shown, table, without_modules


def _assigned() -> list[str]:
    """The module's public names assigned at its top level, in source order."""
    out: list[str] = []
    for stmt in ast.parse(inspect.getsource(slot)).body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        for t in targets:
            elts = t.elts if isinstance(t, ast.Tuple) else [t]
            out += [e.id for e in elts if isinstance(e, ast.Name) and not e.id.startswith("_")]
    return out


def _words(prefix: str) -> list[tuple[int, str]]:
    """(index, name) of the words named ``prefix*``, one per index: of the names one
    index has, the first with a comment, else the first (the others, such as
    P_FIRST or H_LAST_DYNAMIC, mark where a range starts or ends)."""
    notes = comments(slot)
    seen: dict[int, str] = {}
    for name in _assigned():
        value = getattr(slot, name)
        if not name.startswith(prefix) or not isinstance(value, int):
            continue
        if value not in seen or (notes.get(name) and not notes.get(seen[value])):
            seen[value] = name
    return sorted(seen.items())


def _constant(name: str) -> str:
    value = getattr(slot, name)
    if name == "MAGIC":
        return f"{code(hex(value))} ({code(value.to_bytes(slot.WORD, 'little'))}, little-endian)"
    return shown(value)


def _enums() -> list[type[enum.IntEnum]]:
    found = [getattr(slot, s.name) for s in ast.parse(inspect.getsource(slot)).body if isinstance(s, ast.ClassDef)]
    return [c for c in found if isinstance(c, type) and issubclass(c, enum.IntEnum)]


def _doc() -> list[str]:
    """The module's docstring as Markdown: its indented layout block is a code block."""
    text = without_modules(inspect.cleandoc(slot.__doc__ or "")).replace("::\n", ":\n").replace("``", "`")
    return [*text.splitlines(), ""]


def render() -> str:
    notes = comments(slot)
    words = ("Word", "Bytes", "Name", "Meaning")
    out = ["# Slot file", "", "Python: `watchdog.wire` (every name below).", "", *_doc()]
    size = slot.slot_size(slot.DEFAULT_RING_CAPACITY)
    example = slot.slot_filename("job", 0, 4242)
    out += [
        f"A slot is named `<job>.rank<R>.pid<P>{slot.SLOT_SUFFIX}` in the run directory (e.g. `{example}`); "
        f"at the default ring capacity it is {size:,} bytes.",
        "",
        "## Constants",
        "",
    ]
    constants = [n for n in _assigned() if n.isupper() and not n.startswith(("H_", "P_", "R_"))]
    out += table(("Name", "Value", "Meaning"), [(code(n), _constant(n), notes.get(n, "")) for n in constants])
    out += ["", "## Header words", "", "Words marked seqlocked change only inside the seqlock bracket.", ""]
    rows = [
        (
            str(i),
            f"{i * slot.WORD}..{i * slot.WORD + slot.WORD - 1}",
            code(n),
            notes[n],
            "yes" if slot.seqlocked(i) else "",
        )
        for i, n in _words("H_")
    ]
    out += table(("Word", "Bytes", "Name", "Meaning", "Seqlocked"), rows)
    out += ["", "## Progress words", "", notes["PROGRESS_OFFSET"], ""]
    out += table(
        words,
        [(str(i), f"{i * slot.WORD}..{i * slot.WORD + slot.WORD - 1}", code(n), notes[n]) for i, n in _words("P_")],
    )
    out += ["", "## Ring records", "", f"Each record is {slot.RECORD_WORDS} words.", ""]
    out += table(("Word", "Name", "Meaning"), [(str(i), code(n), notes[n]) for i, n in _words("R_")])
    last = _words("R_")[-1][1]
    out += [
        "",
        "Payloads by record kind:",
        "",
        "```",
        *map(without_modules, lines_after(slot, last)),
        "```",
        "",
        "## Enumerations",
        "",
    ]
    for cls in _enums():
        members = comments(cls)
        out += [f"### {cls.__name__}", ""]
        doc = inspect.getdoc(cls)
        if cls.__doc__ and doc:
            out += [" ".join(doc.split()), ""]
        out += table(("Value", "Name", "Meaning"), [(str(m.value), code(m.name), members.get(m.name, "")) for m in cls])
        out.append("")
    return "\n".join(out)
