"""Grouping every rank's stack: pure, table-driven, py-spy-shaped text."""

from __future__ import annotations

import pytest

from watchdog import stackgroups as sg

DUMP = """Process {pid}: /venv/bin/python -u train.py
Thread {pid} (idle): "not the main one"
Python v3.11.7 (/usr/bin/python3.11)

Thread {pid} ({state}): "MainThread"
{frames}
    <module> (train.py:246)
Thread 99 (idle): "watchdog-heartbeat"
    wait (/usr/lib/python3.11/threading.py:331)
    _bootstrap (/usr/lib/python3.11/threading.py:1002)
"""
WAIT = (
    "    backward (/venv{n}/lib/python3.11/site-packages/torch/autograd/__init__.py:395)\n"
    "    backward (/venv{n}/lib/python3.11/site-packages/torch/_tensor.py:626)\n"
    "    main (train.py:212)"
)
LOADER = (
    "    _next_data (/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:757)\n"
    "    __next__ (/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:733)\n"
    "    main (train.py:190)"
)
SLEEP = "    main (train.py:220)"


def dump(frames: str, pid: int = 7, state: str = "idle", n: int = 0) -> str:
    return DUMP.format(pid=pid, state=state, frames=frames.format(n=n))


def test_main_thread_frames_innermost_first_with_library_paths_normalised():
    frames = sg.main_frames(dump(WAIT))
    assert frames == [
        ("backward", "torch/autograd/__init__.py", 395),
        ("backward", "torch/_tensor.py", 626),
        ("main", "train.py", 212),
        ("<module>", "train.py", 246),
    ]
    assert sg.normalise_file("/usr/lib/python3.11/threading.py") == "threading.py"
    assert sg.normalise_file("/home/u/proj/train.py") == "/home/u/proj/train.py"


def test_no_main_thread_takes_the_first_thread_and_garbage_gives_no_frames():
    text = 'Thread 5 (active): "worker"\n    f (a.py:1)\n'
    assert sg.main_frames(text) == [("f", "a.py", 1)]
    assert sg.main_frames("py-spy said something odd\n\x00\x01") == []


def test_the_same_stack_in_two_virtualenvs_and_idle_or_active_is_one_group():
    g = sg.group([(0, True, dump(WAIT, n=1), ""), (1, True, dump(WAIT, n=2, state="active"), "")])
    assert len(g.groups) == 1 and g.groups[0].ranks == (0, 1)


def test_three_places_three_groups_odd_ones_first_with_counts_and_ranges():
    stacks = [(r, True, dump(WAIT, pid=100 + r), "") for r in range(8) if r not in (3, 6)]
    stacks += [(3, True, dump(LOADER), ""), (6, True, dump(SLEEP), "")]
    g = sg.group(stacks, culprits=[6])
    assert [x.ranks for x in g.groups] == [(6,), (3,), (0, 1, 2, 4, 5, 7)]
    assert g.groups[0].culprit and not g.groups[1].culprit
    assert [x.ranks for x in g.odd_ones_out()] == [(6,), (3,)]
    assert g.groups[2].brief() == "backward <- backward <- main (train.py:212)"
    assert g.groups[1].brief() == "_next_data <- __next__ <- main (train.py:190)"
    s = g.summary()
    assert s.startswith("odd ones out: rank 6 in main (train.py:220); rank 3 in _next_data <- __next__ <- main"), s
    assert "the other 6 in" in s
    assert g.to_dict()["groups"][2]["ranks"] == [[0, 2], [4, 5], [7, 7]]


def test_no_clear_odd_one_out_when_the_split_is_even():
    g = sg.group([(r, True, dump(WAIT if r < 2 else LOADER), "") for r in range(4)])
    assert g.odd_ones_out() == () and "no clear odd one out" in g.summary()


def test_failed_dumps_are_counted_as_their_own_group_by_reason():
    g = sg.group(
        [
            (0, True, dump(WAIT), ""),
            (1, True, dump(WAIT), ""),
            (2, True, dump(WAIT), ""),
            (3, False, "", "process gone: pid 4242 is gone"),
            (4, False, "", "process gone: pid 4243 is gone"),
        ]
    )
    gone = g.groups[0]
    assert gone.ranks == (3, 4) and gone.frames == () and gone.brief().startswith("no stack: process gone")


def test_an_ok_dump_replaces_an_earlier_failure_of_the_same_rank_but_not_the_reverse():
    g = sg.group([(0, False, "", "timed out"), (0, True, dump(WAIT), ""), (0, False, "", "gone")])
    assert [x.ranks for x in g.groups] == [(0,)] and g.groups[0].frames and g.ranks == 1


def test_hostile_input_is_capped():
    deep = "\n".join(f"    f{i} (x.py:{i})" for i in range(5000))
    assert len(sg.main_frames(dump(deep))) == sg.MAX_FRAMES
    many = sg.group([(r, True, dump(f"    f (x.py:{r + 1})"), "") for r in range(1000)], max_groups=50)
    assert len(many.groups) == 50 and many.dropped_groups == 950 and many.dropped_ranks == 950
    assert many.odd_ones_out() == ()


def test_record_round_trip_and_malformed_groups_raise_value_error():
    g = sg.group([(r, True, dump(WAIT if r else SLEEP), "") for r in range(16)], culprits=[0])
    back = sg.Grouping.from_dict(g.to_dict())
    assert back.groups == g.groups and back.ranks == 16
    for bad in (
        {"ranks": "x"},
        {"ranks": [[0]]},
        {"ranks": [[0, 1]], "frames": [["f"]]},
        {"ranks": [[0, 10**12]]},
        {"ranks": [[5, 1]]},
        {"ranks": [[-3, 1]]},
    ):
        with pytest.raises(ValueError):
            sg.Group.from_dict(bad)


def test_folded_lines_root_first_with_counts():
    g = sg.group([(r, True, dump(WAIT if r else SLEEP), "") for r in range(4)] + [(9, False, "", "x;y")])
    lines = sg.folded(g).splitlines()
    assert "<module> (train.py:246);main (train.py:220) 1" in lines
    assert (
        "<module> (train.py:246);main (train.py:212);backward (torch/_tensor.py:626);"
        "backward (torch/autograd/__init__.py:395) 3"
    ) in lines
    assert "no stack: x 1" in lines  # split at ';' by failure_key, never a frame separator


def test_a_long_scattered_rank_list_is_cut_in_a_line_of_text():
    g = sg.group(
        [(r, True, dump(SLEEP if r % 2 else WAIT), "") for r in range(0, 4000)]
        + [(r, True, dump(LOADER), "") for r in range(4000, 4003)]
    )
    assert len(g.summary()) < 1000 and sg.short_phrase(tuple(range(0, 8000, 2))).endswith(",… (4000 ranks)")
