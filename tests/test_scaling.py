"""``watchdog scaling`` over small recorded journals: efficiency per world size,
where it drops below the threshold and why, the HTML and PNG outputs, and a
clear error for a journal it cannot use."""

from __future__ import annotations

import importlib.util

import pytest

from watchdog import cli
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.scaling import runs

# (world size, step, compute, communication): compute stays, communication grows.
MEASURED = [(1, 0.050, 0.048, 0.002), (2, 0.056, 0.048, 0.008), (4, 0.070, 0.048, 0.022)]


def _journal(path, world, step, compute, coll, sizes=None):
    j = Journal(str(path), lambda: (1.7e9, 0.0))
    j.write(je.START, {"pid": 1, "address": "x", "job": "j", "world_size": world})
    rec = {
        "seconds": {},
        "total_s": 60.0,
        "pending_s": 0.0,
        "goodput": 0.8,
        "steps": 500,
        "world_sizes": sizes or [world],
        "world_size": world,
        "final": True,
        "profile": {"step_s": step, "compute_s": compute, "coll_s": coll, "data_s": 0.0},
    }
    j.write(je.GOODPUT, {**rec, "final": False, "profile": {**rec["profile"], "step_s": 9.9}})  # superseded
    j.write(je.GOODPUT, rec)
    j.close()
    return str(path)


@pytest.fixture
def journals(tmp_path):
    return [_journal(tmp_path / f"run{m[0]}.jsonl", *m) for m in MEASURED]


def test_table_efficiency_and_where_it_drops(journals):
    rows = runs.table([runs.read_run(p) for p in journals])
    assert [r.world_size for r in rows] == [1, 2, 4]
    assert [round(r.efficiency, 3) for r in rows] == [1.0, round(0.050 / 0.056, 3), round(0.050 / 0.070, 3)]
    assert rows[2].throughput == pytest.approx(4 * 0.050 / 0.070)
    text = runs.explain(rows, 0.8)
    assert "below 80% at 4 ranks (71%)" in text and "communication grew from 2.0 ms" in text
    assert "stays at or above" in runs.explain(rows, 0.7)


def test_strong_scaling(journals):
    rows = runs.table([runs.read_run(p) for p in journals], strong=True)
    assert rows[1].efficiency == pytest.approx(0.050 / (0.056 * 2))


def test_runs_at_one_size_are_combined_by_median(tmp_path):
    paths = [_journal(tmp_path / f"a{i}.jsonl", 2, s, 0.04, 0.01) for i, s in enumerate((0.05, 0.06, 0.20))]
    [row] = runs.table([runs.read_run(p) for p in paths])
    assert row.runs == 3 and row.step_s == pytest.approx(0.06)


def test_command_writes_table_html_and_png(journals, tmp_path, capsys):
    out_html = tmp_path / "s.html"
    argv = ["scaling", *journals, "--html", str(out_html)]
    has_mpl = importlib.util.find_spec("matplotlib") is not None
    if has_mpl:
        argv += ["--png", str(tmp_path / "s.png")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "EFFICIENCY" in out and "71%  <" in out
    page = out_html.read_text()
    assert page.count("<svg") == 2 and "drops below 80% at 4 ranks" in page
    if has_mpl:
        assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unusable_journals_are_named(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    Journal(str(empty), lambda: (1.7e9, 0.0)).close()
    assert cli.main(["scaling", str(empty)]) == 2
    assert "no goodput record" in capsys.readouterr().err
    changed = _journal(tmp_path / "c.jsonl", 2, 0.05, 0.04, 0.01, sizes=[2, 4])
    assert cli.main(["scaling", changed]) == 2
    assert "changed world size" in capsys.readouterr().err
    assert cli.main(["scaling", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
