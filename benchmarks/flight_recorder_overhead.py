"""What reading PyTorch's Flight Recorder costs. Run: python benchmarks/flight_recorder_overhead.py

The hook reads FR from its heartbeat thread (every heartbeat, 0.5 s by default):
``_dump_fr_trace_json`` serialises the whole ring and the hook parses it, holding
the GIL part of the time, so the training thread can feel it. Two figures, on a
real single-process gloo group (world size 1, 127.0.0.1):

* one read (dump + parse + the slot records it writes), by ring fill, median;
* a training loop (an all-reduce and ~2 ms of Python compute per step) with the
  hook installed, FR reading on vs off, interleaved rounds in one process:
  the ratio of mean step times. The ring is full (2,000 entries, torch's default)
  when each round starts, so each round pays one unbudgeted first read: rounds
  of a few seconds make that an upper bound on the steady state.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch
import torch.distributed as dist

from watchdog.hook import install


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    x = 0
    while time.perf_counter() < end:
        x += 1


def read_cost(run_dir: str, fills: list[int], repeats: int) -> list[tuple[int, float]]:
    out = []
    t = torch.ones(16)
    done = 0
    mon = install(run_dir=run_dir, job="fr-bench", rank=0, world_size=1, heartbeat_interval_s=3600)
    try:
        for fill in fills:
            while done < fill:
                dist.all_reduce(t)
                done += 1
            samples = []
            for _ in range(repeats):
                mon.flight._seen.clear()  # the whole ring parsed: the first read's (worst) case
                t0 = time.perf_counter()
                mon.flight.poll(force=True)
                samples.append(time.perf_counter() - t0)
            out.append((fill, statistics.median(samples)))
    finally:
        mon.close()
    return out


def loop(run_dir: str, fr: bool, steps: int, heartbeat_s: float, compute_ms: float, duty: list) -> float:
    os.environ["WATCHDOG_FLIGHT_RECORDER"] = "1" if fr else "0"
    mon = install(run_dir=run_dir, job="fr-bench-loop", rank=0, world_size=1, heartbeat_interval_s=heartbeat_s)
    t = torch.ones(16)
    times = []
    w0 = time.monotonic_ns()
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            busy(compute_ms)
            dist.all_reduce(t)
            mon.step()
            times.append(time.perf_counter() - t0)
    finally:
        if fr:
            duty.append((mon.flight.reads, mon.flight.read_ns_total, time.monotonic_ns() - w0))
        mon.close()
        os.environ.pop("WATCHDOG_FLIGHT_RECORDER", None)
    return statistics.mean(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--heartbeat", type=float, default=0.5, help="heartbeat interval for the loop (s)")
    p.add_argument("--compute-ms", type=float, default=2.0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), TORCH_CPP_LOG_LEVEL="ERROR")
    dist.init_process_group("gloo", rank=0, world_size=1)
    run_dir = tempfile.mkdtemp(prefix="watchdog-fr-bench-")
    print(f"torch {torch.__version__}, TORCH_FR_BUFFER_SIZE={os.environ.get('TORCH_FR_BUFFER_SIZE', 'default')}")
    print(f"{'entries in the ring':>20} {'one read (ms)':>14}")
    for fill, s in read_cost(run_dir, [10, 100, 500, 2000, 4000], 20):
        print(f"{fill:>20} {s * 1e3:>14.3f}")
    on, off, duty = [], [], []
    for _ in range(args.rounds):
        off.append(loop(run_dir, False, args.steps, args.heartbeat, args.compute_ms, duty))
        on.append(loop(run_dir, True, args.steps, args.heartbeat, args.compute_ms, duty))
    reads, read_ns, wall_ns = (sum(x[i] for x in duty) for i in range(3))
    print(
        f"\nFR reads in the loop: {reads} reads, {read_ns / 1e6:.1f} ms of {wall_ns / 1e9:.1f} s wall = "
        f"{100 * read_ns / wall_ns:.2f}% (the first read of each round included)"
    )
    a, b = statistics.median(off), statistics.median(on)
    print(
        f"training loop, heartbeat every {args.heartbeat * 1e3:.0f} ms: FR off {a * 1e3:.3f} ms/step, "
        f"FR on {b * 1e3:.3f} ms/step, ratio {b / a:.4f} (median of {args.rounds} interleaved rounds "
        f"of {args.steps} steps)"
    )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
