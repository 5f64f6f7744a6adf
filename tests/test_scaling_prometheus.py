"""`watchdog scaling --prometheus`: the scaling table from the series the agents
export, read back from a real Prometheus that scraped a real agent exposition
(slot files written through the hook's SlotWriter for three runs of one job at
1, 2 and 4 ranks), with the same numbers a journal would give."""

from __future__ import annotations

import threading
import time
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from prometheus_client import make_wsgi_app
from promserver import Prometheus
from waiting import wait_for

from watchdog.agent import config, testing
from watchdog.agent.export.nvml import Accelerators
from watchdog.agent.main import Agent
from watchdog.scaling import main as scaling_main
from watchdog.scaling import runs
from watchdog.scaling.prom import read_prometheus

MS = 1_000_000
COLL_MS = {1: 1, 2: 17, 4: 36}  # communication grows with the world; compute (40 ms) and data (2 ms) do not


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_refuses_a_job_name_it_cannot_quote():
    with pytest.raises(runs.RunError, match="may be queried"):
        read_prometheus("http://127.0.0.1:1", 'x"} or vector(1) #', 60)


def test_an_unreachable_prometheus_is_a_clear_error(capsys):
    assert scaling_main.main(["--prometheus", "http://127.0.0.1:1", "job", "--timeout-seconds", "2"]) == 2
    assert "cannot query http://127.0.0.1:1" in capsys.readouterr().err


@pytest.mark.integration
def test_scaling_table_from_a_real_prometheus(tmp_path, capsys):
    if Prometheus.binary() is None:
        pytest.fail("Debian's prometheus is not installed (run .ci/setup)")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    slots = {
        (n, r): testing.RankSlot(str(run_dir), testing.identity(f"scale{n}", r, n), name=f"scale{n}.r{r}.slot")
        for n in COLL_MS
        for r in range(n)
    }
    agent = Agent(
        config.AgentConfig(run_dir=str(run_dir), listen=("127.0.0.1", 0), host="h1"),
        accelerators=Accelerators(testing.FakeNvml([])),
    )
    srv = make_server("127.0.0.1", 0, make_wsgi_app(agent.registry), handler_class=_Quiet)
    threading.Thread(target=srv.serve_forever, daemon=True, name="metrics").start()
    prom = Prometheus(tmp_path, [f"127.0.0.1:{srv.server_port}"], scrape_interval_s=0.5)
    try:
        prom.start()

        def train_a_step_and_look():
            for (n, _), slot in slots.items():
                slot.step((42 + COLL_MS[n]) * MS, 2 * MS, COLL_MS[n] * MS)
            agent.poll_once()
            time.sleep(0.1)
            seen = prom.query('count_over_time(watchdog_rank_steps_total{training_job="scale4"}[1m])')
            return len(seen) == 4 and min(float(s["value"][1]) for s in seen) >= 4

        wait_for(train_a_step_and_look, 60, what="4 scrapes of every rank", log=tmp_path / "prometheus.log")
        got = [read_prometheus(prom.url, f"scale{n}", 120) for n in COLL_MS]
        assert [r.world_size for r in got] == [1, 2, 4]
        for r, n in zip(got, COLL_MS):
            assert r.compute_s == pytest.approx(0.040, rel=1e-6)
            assert r.coll_s == pytest.approx(COLL_MS[n] / 1000, rel=1e-6)
            assert r.data_s == pytest.approx(0.002, rel=1e-6)
            assert r.steps >= 2 and r.path == f"prometheus:scale{n}"
        rows = runs.table(got)
        assert [round(row.efficiency, 3) for row in rows] == [1.0, round(43 / 59, 3), round(43 / 78, 3)]
        assert (
            scaling_main.main(["--prometheus", prom.url, "scale1", "scale2", "scale4", "--window-seconds", "120"]) == 0
        )
        out = capsys.readouterr().out
        assert "efficiency drops below 80% at 2 ranks (73%)" in out and "communication grew from 1.0 ms" in out
        assert scaling_main.main(["--prometheus", prom.url, "nosuchjob"]) == 2
        assert "no watchdog_job_world_size series" in capsys.readouterr().err
    finally:
        prom.stop()
        srv.shutdown()
        srv.server_close()
        for slot in slots.values():
            slot.close()
