"""Every rank's stack on a real job: 4 gloo ranks under torchrun, a real agent and
coordinator (``watchdog demo``), two culprits of different kinds at step 30 —
rank 1 blocked in its data loader, rank 2 asleep before the all-reduce — and
ranks 0 and 3 waiting in that all-reduce under ``backward``. The coordinator
asks every rank's stack, the agent dumps them in parallel, and the journal's
``stack_groups`` record has exactly three groups with the right members; the
timeline and the folded export show the same."""

from __future__ import annotations

import pytest

from watchdog.agent.command_channel.stacks import find_py_spy
from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.dev import localjob, scenario
from watchdog.timeline import load, main, text

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(find_py_spy() is None, reason="py-spy not installed (pip install py-spy)"),
]


def line_of(after: str, text_: str) -> int:
    lines = localjob.EXAMPLE_SCRIPT.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if after in ln)
    return next(i for i in range(start, len(lines)) if text_ in lines[i]) + 1


def test_two_culprit_kinds_and_the_waiters_make_three_groups(tmp_path):
    res = scenario.run(["loader-hang:1@30", "hang:2@30"], steps=400, timeout_s=150, linger_s=6, work_dir=str(tmp_path))
    recs = journal.read(res.summary["journal"])
    finding = next(r for r in recs if r["event"] == je.FINDING and r["kind"] == "collective_hang")
    assert finding["ranks"] == [1, 2]
    [rec] = [r for r in recs if r["event"] == je.STACK_GROUPS]
    assert rec["trigger"] == {"kind": "collective_hang", "ranks": [1, 2]} and rec["hosts_missing"] == []
    groups = [(g["ranks"], g["brief"]) for g in rec["groups"]]
    loader_line = line_of("class BlockingAt", "time.sleep(3600)")
    sleep_line = line_of('announce("hang"', "time.sleep(3600)")
    assert [g[0] for g in groups] == [[[1, 1]], [[2, 2]], [[0, 0], [3, 3]]], groups
    assert groups[0][1] == f"BlockingAt.__getitem__ (train_ddp.py:{loader_line})", groups
    assert groups[1][1] == f"main (train_ddp.py:{sleep_line})", groups
    assert groups[2][1].startswith("_engine_run_backward <- backward <- "), groups
    frames1 = [f[0] for f in rec["groups"][0]["frames"]]
    assert any(f.endswith("_next_data") for f in frames1), frames1  # called from inside the data loader
    assert rec["summary"].startswith("odd ones out: rank 1 in BlockingAt.__getitem__"), rec["summary"]
    [ev] = [r for r in recs if r["event"] == je.EVIDENCE and r["type"] == "dump_stacks"]
    assert ev["bound"]["late"] == [] and ev["bound"]["duration_s"] < ev["bound"]["deadline_s"]
    print(f"\n{rec['summary']}\nbound: {ev['bound']}, stack_groups record {len(str(rec))} chars")

    out = text.render(load.load(res.summary["journal"]))
    assert "stacks of every rank (collective_hang ranks 1-2" in out and "4 ranks in 3 group(s)" in out
    assert main.main([res.summary["journal"], "--stacks", str(tmp_path / "folded")]) == 0
    [folded] = (tmp_path / "folded").iterdir()
    counts = sorted(int(x.rsplit(" ", 1)[1]) for x in folded.read_text().splitlines())
    assert counts == [1, 1, 2]
