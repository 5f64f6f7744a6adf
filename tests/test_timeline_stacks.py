"""Every rank's stack in ``watchdog timeline``: grouped in the text, a stack tree
in the HTML, one collapsed-stack file per hang, on simulated journals built the
way the coordinator journals them (``watchdog.timeline.testing``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import headless
import pytest
from timeline_support import hang_records, write_journal

from watchdog.coordinator.journal import event_names as je
from watchdog.timeline import html, load, main, testing, text


@pytest.fixture
def big(tmp_path):
    # 64 ranks on 8 hosts: rank 5 in its data loader (the culprit), rank 33 in a checkpoint write.
    return testing.hang_journal(tmp_path / "j.jsonl", 64, culprit=5)


def test_text_lists_the_groups_odd_ones_first_and_names_them_in_the_root_cause(big):
    out = text.render(load.load(str(big)))
    assert (
        "  stacks: odd ones out: rank 5 in _recv_bytes <- _try_get_data <- … <- main (train.py:190); "
        "rank 33 in _save <- save <- save_checkpoint (train.py:150) (the other 62 in " in out
    )
    groups = out[out.index("stacks of every rank") :].splitlines()
    assert "64 ranks in 3 group(s), smallest first" in groups[0]
    assert re.match(r" +1  rank 5 \(culprit\): _recv_bytes", groups[1]), groups[1]
    assert re.match(r" +1  rank 33: _save", groups[2]), groups[2]
    assert re.match(
        r" +62  ranks 0-4,6-32,34-63: _engine_run_backward <- backward <- backward <- main "
        r"\(train.py:212\)",
        groups[3],
    ), groups[3]


def test_html_has_a_stack_tree_with_counts_the_odd_branches_open_the_crowd_folded(big):
    page = html.render(load.load(str(big)))
    assert "Stacks of every rank · collective_hang rank 5" in page
    tree = page[page.index('<div class="stree">') :]
    assert tree.startswith('<div class="stree"><details open><summary><span class="n">64</span>&lt;module&gt;'), tree[
        :300
    ]
    # The odd ones' branches are open and marked; the 62 waiting are folded.
    assert re.search(r"<details open class='odd'><summary><span class=\"n\">1</span>_recv_bytes", page)
    assert re.search(r"<details open class='odd'><summary><span class=\"n\">1</span>save_checkpoint", page)
    assert re.search(r"<details class='crowd'><summary><span class=\"n\">62</span>backward", page)
    assert '<div class="leaf">ranks 0-4,6-32,34-63</div>' in page
    assert page.count("<script>") == 1  # the tree is plain <details>: no script needed


def test_stacks_flag_writes_one_collapsed_file_per_hang(big, tmp_path, capsys):
    out_dir = tmp_path / "folded"
    assert main.main([str(big), "--stacks", str(out_dir)]) == 0
    [f] = sorted(out_dir.iterdir())
    assert f.name == "section1-1-collective_hang-rank5.folded"
    lines = f.read_text().splitlines()
    assert lines[0].startswith("<module> (train.py:246);main (train.py:190);__next__ (torch/utils/data/")
    assert lines[0].endswith(";_recv_bytes (multiprocessing/connection.py:430) 1")
    assert lines[2].endswith(";_engine_run_backward (torch/autograd/graph.py:825) 62")
    assert sum(int(x.rsplit(" ", 1)[1]) for x in lines) == 64
    assert capsys.readouterr().out == ""  # --stacks alone prints no report


def test_without_the_stacks_the_coordinators_record_is_shown(big, tmp_path):
    recs = [json.loads(x) for x in big.read_text().splitlines()]
    stripped = write_journal(
        tmp_path / "s.jsonl", [{**r, "stacks": []} if r["event"] == je.EVIDENCE else r for r in recs]
    )
    [s] = load.load(str(stripped)).sections[0].stack_sets
    assert s.source == "record" and [g.ranks[:1] for g in s.grouping.groups] == [(5,), (33,), (0,)]
    assert "odd ones out: rank 5" in text.render(load.load(str(stripped)))


def test_a_malformed_record_is_a_note_not_a_crash(tmp_path):
    recs = hang_records(tmp_path)
    recs.insert(
        -1,
        {
            "event": je.STACK_GROUPS,
            "t_wall": 1.0,
            "trigger": {"kind": "x", "ranks": [1]},
            "groups": [{"ranks": "everything"}],
        },
    )
    recs.insert(-1, {"event": je.STACK_GROUPS, "t_wall": 1.0, "trigger": "junk", "groups": 7})
    tl = load.load(str(write_journal(tmp_path / "j.jsonl", recs)))
    assert any("stack_groups record" in n and "unreadable" in n for n in tl.sections[0].notes)
    text.render(tl)
    html.render(tl)


def test_a_journal_with_the_culprit_and_one_waiter_only_reads_as_before(tmp_path):
    tl = load.load(str(write_journal(tmp_path / "j.jsonl", hang_records(tmp_path))))
    out = text.render(tl)
    assert "stacks of every rank" not in out and "stack of rank 2 (culprit" in out
    assert "Stacks of every rank" not in html.render(tl)


@pytest.mark.skipif(headless.chromium() is None, reason="chromium not installed (.ci/setup installs it)")
def test_the_1024_rank_report_renders_in_chromium_with_the_tree_and_no_errors(tmp_path):
    path = testing.hang_journal(tmp_path / "j.jsonl", 1024)
    page = tmp_path / "r.html"
    assert main.main([str(path), "--html", str(page)]) == 0
    dom, log = headless.dump_dom(Path(page))
    assert 'class="stree"' in dom and "ranks 0,2-512,514-1023" in dom
    assert headless.console_messages(log) == []


def test_at_16384_ranks_the_record_and_the_report_stay_small(tmp_path):
    """Sizes, not times (the render time is measured in benchmarks/stacks_scale.py)."""
    path = testing.hang_journal(tmp_path / "j.jsonl", 16384)
    rec = next(x for x in path.read_text().splitlines() if '"event":"stack_groups"' in x)
    assert len(rec) < 4096  # groups with rank ranges, not 16,384 copies
    tl = load.load(str(path))
    [s] = tl.sections[0].stack_sets
    assert [g.count for g in s.grouping.groups] == [1, 1, 16382]
    assert len(html.render(tl)) < 1_000_000


def test_what_is_missing_is_said_under_the_groups(tmp_path):
    path = testing.hang_journal(tmp_path / "j.jsonl", 64, culprit=5)
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    trigger = {"kind": "collective_hang", "ranks": [5]}
    recs.insert(
        -1,
        {
            "event": "stacks_capped",
            "t_wall": 1.7e9 + 61,
            "trigger": trigger,
            "max_per_host": 6,
            "ranks_left_out": 16,
            "hosts": {},
            "hosts_capped": 8,
        },
    )
    groups = next(r for r in recs if r["event"] == je.STACK_GROUPS)
    groups.update(hosts_missing=["node-00007"], late_ranks=2)
    out = text.render(load.load(str(write_journal(tmp_path / "k.jsonl", recs))))
    assert "    note: 16 rank(s) on 8 host(s) not asked: at most 6 per host" in out
    assert "    note: no stacks from host(s) node-00007 (refused or no answer in time)" in out
    assert "    note: 2 rank(s) not dumped within their host's deadline" in out
