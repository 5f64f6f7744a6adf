"""docs/reference/ is what the code renders: a flag, a metric, a journal event, a
slot word or a report field changed without regenerating the pages fails here,
naming the page and the command that rewrites it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from watchdog import cli
from watchdog.contracts.journal import names
from watchdog.dev.reference import flagpage, pages

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("name", sorted(pages.PAGES))
def test_committed_page_is_what_the_code_renders(name):
    path = ROOT / pages.DIRECTORY / name
    assert path.is_file(), f"{path} is missing: write it with `{pages.COMMAND}` from the repository's root"
    assert path.read_text() == pages.render(name), (
        f"{pages.DIRECTORY / name} has drifted from the code: regenerate with `{pages.COMMAND}` "
        "from the repository's root and commit the result"
    )


def test_no_file_in_the_directory_is_left_unchecked():
    present = sorted(p.name for p in (ROOT / pages.DIRECTORY).iterdir())
    assert present == sorted(pages.PAGES), f"files in {pages.DIRECTORY} that no renderer writes (or checks)"


def test_drift_is_found_and_named(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    pages.write(tmp_path)
    assert pages.drifted(tmp_path) == []
    page = tmp_path / pages.DIRECTORY / "metrics.md"
    page.write_text(page.read_text().replace("watchdog_rank_alive", "watchdog_rank_up"))
    (tmp_path / pages.DIRECTORY / "notes.md").write_text("hand-written\n")
    assert pages.drifted(tmp_path) == ["metrics.md", "notes.md"]


def _golden_names(filename: str) -> set[str]:
    return {line.split()[2] for line in (GOLDEN / filename).read_text().splitlines() if line.startswith("# TYPE")}


def test_metrics_page_lists_exactly_the_golden_series():
    listed = set(re.findall(r"^\| `(watchdog_[a-z_]+)` \|", pages.render("metrics.md"), re.M))
    assert listed == _golden_names("agent_metrics.txt") | _golden_names("coordinator_metrics.txt")


def test_journal_page_lists_exactly_the_golden_events():
    listed = re.findall(r"^### `([a-z_]+)`$", pages.render("journal.md"), re.M)
    assert sorted(listed) == sorted((GOLDEN / "journal_events.txt").read_text().split()) == sorted(names.ALL)


def test_flags_page_has_every_command_and_refuses_one_it_cannot_document(monkeypatch):
    text = pages.render("flags.md")
    assert re.findall(r"^## watchdog (\S+)$", text, re.M) == list(cli.SUBCOMMANDS)
    monkeypatch.setitem(cli.SUBCOMMANDS, "newcommand", ("watchdog.newcommand", "a command added later"))
    with pytest.raises(LookupError, match="newcommand"):
        flagpage.render()
