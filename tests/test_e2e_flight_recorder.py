"""Flight Recorder evidence end to end: a real 4-rank gloo job where rank 2 hangs
in its own code at step 30 (the conftest's fault_run, the run test_e2e_faults.py,
test_e2e_evidence.py and test_timeline_real.py read too). On the hang finding the coordinator asks every live
rank's Flight Recorder through its agent and slot control word; each hook dumps
from its background thread; the journal keeps the entries, ``watchdog timeline``
shows them and writes the per-rank files PyTorch's analyzer reads, and the
analyzer, on those files, names the same rank we do."""

from __future__ import annotations

import logging

import pytest

from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.timeline import main as timeline

pytestmark = pytest.mark.integration


def test_hang_evidence_includes_every_ranks_flight_recorder(fault_run, tmp_path, capsys, caplog):
    fr_trace = pytest.importorskip("torch.distributed.flight_recorder.fr_trace")
    res = fault_run("hang:2@30")
    first = res.first()
    assert first is not None and (first["kind"], first["ranks"]) == ("collective_hang", [2]), res.findings
    path = res.summary["journal"]
    dumps = [d for r in journal.read(path) if r["event"] == je.EVIDENCE for d in r.get("flight_recorder") or ()]
    assert sorted(d["rank"] for d in dumps if d["ok"]) == [0, 1, 2, 3], dumps
    last = {d["rank"]: d["entries"][-1]["collective_seq_id"] for d in dumps}
    assert last[0] == last[1] == last[3] == last[2] + 1  # rank 2 never issued the collective the others wait in

    assert timeline.main([path]) == 0
    assert "<- differs" in [ln for ln in capsys.readouterr().out.splitlines() if "rank 2 (host" in ln][-1]
    assert timeline.main([path, "--fr-dump", str(tmp_path / "fr")]) == 0
    (d,) = list((tmp_path / "fr").iterdir())
    with caplog.at_level(logging.INFO, logger="Flight Recorder"):
        fr_trace.main([str(d), "-p", "rank_"])
    assert f"Not all ranks joining collective, sequence number: {last[0]}" in caplog.text
    assert "missing ranks: {2}" in caplog.text
