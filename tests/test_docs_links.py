"""The prose docs a newcomer reads in order (README.md, docs/*.md) stay true to the code.

What a reader follows must exist: every relative link and its anchor, every finding kind
the coordinator can emit (one section in docs/findings.md, one row in the README's table),
every fault form the demo documents (the example script must accept it), and a README
short enough to read first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from watchdog.contracts.finding import ADVISORY_KINDS, KINDS
from watchdog.coordinator.detectors import DETECTORS

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README = REPO / "README.md"
README_MAX_LINES = 250


def _prose_files() -> list[Path]:
    return [README, REPO / "CHANGELOG.md", *sorted(DOCS.glob("*.md")), *sorted((DOCS / "runbooks").glob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)}


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code is not a link
    return [link for link in re.findall(r"\]\(([^)\s]+)\)", text) if not link.startswith(("http://", "https://"))]


def test_the_readme_is_short_and_opens_with_the_demo_and_the_tests():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    opening = "\n".join(lines[:30])
    assert "watchdog demo" in opening and "<!-- test-command -->" in opening


@pytest.mark.parametrize("path", _prose_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_exists(path: Path):
    reference_made = (DOCS / "reference").is_dir()  # generated from the code (its own drift tests)
    broken = []
    for link in _links(path):
        target, _, anchor = link.partition("#")
        dest = (path.parent / target).resolve() if target else path
        if not reference_made and (DOCS / "reference") in dest.parents:
            continue
        if not dest.exists():
            broken.append(f"{link} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{link} (no heading #{anchor} in {dest.relative_to(REPO)})")
    assert not broken, f"{path.relative_to(REPO)}: {broken}"


def test_every_finding_kind_is_documented_where_a_reader_looks():
    assert len(DETECTORS) == len(KINDS), "one detector per finding kind"
    sections = {h.split()[0] for h in re.findall(r"^## (.*)$", (DOCS / "findings.md").read_text(), re.M)}
    rows = dict(re.findall(r"^\| `(\w+)`( \(advisory\))? \|", README.read_text(), re.M))
    assert set(KINDS) <= sections, f"docs/findings.md lacks {set(KINDS) - sections}"
    assert set(rows) == set(KINDS), f"README's findings table: {set(rows) ^ set(KINDS)}"
    assert {k for k, advisory in rows.items() if advisory} == ADVISORY_KINDS
    assert f"{len(DETECTORS)} pure detectors" in README.read_text()


def test_every_documented_demo_fault_is_one_the_example_accepts():
    from watchdog.dev.examples.train_ddp import parse_faults

    table = (DOCS / "quickstart.md").read_text()
    forms = re.findall(r"^\| `([a-z-]+:[^`|]+)`(?:, `([a-z-]+:[^`|]+)`)? \|", table, re.M)
    documented = [f for pair in forms for f in pair if f]
    concrete = [f.replace("R", "1").replace("S", "20").replace("[:N]", ":6").replace("F", "1.5") for f in documented]
    assert len(concrete) >= 13, documented
    for spec in concrete:
        parse_faults([spec])  # SystemExit names the form it cannot read
    with pytest.raises(SystemExit):
        parse_faults(["bogus:1@2"])
