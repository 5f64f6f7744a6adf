"""The reference pages: each file's name, what it holds, and its renderer; the
index (README.md) is rendered from this table too."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from . import flagpage, journalpage, metricpage, reportpage, slotpage

DIRECTORY = Path("docs") / "reference"  # from the repository's root
COMMAND = "python -m watchdog.dev.reference"

# name -> (what it holds, renderer)
CONTENT: dict[str, tuple[str, Callable[[], str]]] = {
    "flags.md": ("every command's flags and environment variables, and the hook's settings", flagpage.render),
    "metrics.md": (
        "every series the agent and the coordinator export, with its type, labels and help",
        metricpage.render,
    ),
    "journal.md": ("every event of the coordinator's journal and its fields", journalpage.render),
    "slot.md": ("the slot file a rank's hook writes and its agent reads: layout, words, records", slotpage.render),
    "report.md": (
        "the report an agent sends its coordinator: every field, its type, range and default",
        reportpage.render,
    ),
}


def index() -> str:
    out = [
        "# Reference",
        "",
        "Generated from the code; do not edit by hand. After changing a flag, a metric, a journal event, the "
        f"slot layout or the report, regenerate them from the repository's root with `{COMMAND}` (a test fails "
        "while they differ from the code).",
        "",
    ]
    out += [f"- [{name}]({name}): {what}" for name, (what, _) in CONTENT.items()]
    out.append("")
    return "\n".join(out)


PAGES: dict[str, Callable[[], str]] = {"README.md": index, **{name: render for name, (_, render) in CONTENT.items()}}


@functools.cache
def render(name: str) -> str:
    """A page's text (kept: the code it is rendered from does not change in a process)."""
    return PAGES[name]()


def write(root: Path) -> list[Path]:
    """Write every page under ``root``/docs/reference; returns the files written."""
    directory = root / DIRECTORY
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in PAGES:
        path = directory / name
        path.write_text(render(name))
        written.append(path)
    return written


def drifted(root: Path) -> list[str]:
    """The pages under ``root``/docs/reference that differ from what the code renders
    (a missing page counts), and files there that are no page."""
    directory = root / DIRECTORY
    out = [name for name in PAGES if not (directory / name).is_file() or (directory / name).read_text() != render(name)]
    stray = sorted(p.name for p in directory.iterdir() if p.name not in PAGES) if directory.is_dir() else []
    return out + stray
