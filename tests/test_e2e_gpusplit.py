"""GPU-side step times end to end, on CPU: a real 2-rank torchrun job on gloo
whose hooks have a simulated accelerator stream (tests/fixtures/gpu), a real
agent and a real coordinator. The coordinator's status shows, per rank, the
step split on the GPU clock next to the CPU side's, each saying its clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_for

from watchdog.dev import localjob

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parent / "fixtures" / "gpu" / "fake_stream_loop.py"
KERNEL_S = 0.06


def test_gpu_side_step_times_arrive_in_the_coordinator(tmp_path):
    run_dir, job = tmp_path / "run", "gpusplit"
    run_dir.mkdir()
    procs: list[localjob.Process] = []
    torchrun = localjob.TorchrunJob(
        nproc=2,
        run_dir=run_dir,
        job=job,
        work_dir=tmp_path,
        script=SCRIPT,
        script_args=["--steps", "30", "--kernel-ms", str(KERNEL_S * 1e3)],
    )
    try:
        coord = localjob.start_coordinator(
            tmp_path, job, 2, tmp_path / "journal.jsonl", extra=["--tick.interval-seconds", "0.25"]
        )
        procs.append(coord)
        agent = localjob.start_agent(
            tmp_path,
            run_dir,
            job,
            extra=["--coordinator.url", coord.url, "--report.interval-seconds", "0.25"],
        )
        procs.append(agent)
        torchrun.start()
        assert torchrun.wait(120) == 0, torchrun.proc.log() if torchrun.proc else ""

        def gpu_rows():
            rows = json.loads(localjob.http_get(coord.url + "/api/v1/status"))["ranks"]
            done = [r for r in rows if r.get("gpu", {}).get("step", 0) >= 25]
            return rows if len(done) == 2 else None

        rows = wait_for(gpu_rows, timeout_s=30, what="both ranks' GPU-side steps in the coordinator")
        metrics = localjob.http_get(agent.url + "/metrics")
    finally:
        torchrun.stop()
        for p in reversed(procs):
            p.stop(grace_s=3.0)
    for row in rows:
        gpu = row["gpu"]
        assert row["clock"] == "cpu" and gpu["clock"] == "gpu"
        # The simulated stream runs one 60 ms kernel a step: its steps end no
        # closer together than that, whatever the CPU's pace.
        assert gpu["step_s"] >= KERNEL_S * 0.9, gpu
        assert gpu["step_s"] == pytest.approx(gpu["data_s"] + gpu["coll_s"] + gpu["compute_s"]), gpu
    # The agent's own export of the same split, labelled with its clock.
    gpu_series = [
        s
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
        if s.name == "watchdog_rank_gpu_step_part_seconds_total"
    ]
    assert {(s.labels["rank"], s.labels["clock"]) for s in gpu_series} == {("0", "gpu"), ("1", "gpu")}
    for r in ("0", "1"):
        total = sum(s.value for s in gpu_series if s.labels["rank"] == r)
        assert total >= 20 * KERNEL_S * 0.9, gpu_series  # 20+ steps of at least a kernel each
