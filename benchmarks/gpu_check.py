"""The one prepared GPU check (issue 10). Run once on a machine with a GPU:

    python benchmarks/gpu_check.py [--out benchmarks/gpu_check.out]

Without a usable CUDA device it prints why and exits 0 (nothing to prove here).
Every check runs in this one process or its own children, each bounded in time,
and prints one line of a table; the whole lot takes well under a minute:

1. NCCL, world size 1, one GPU: ``torch.cuda._sleep`` queues a long kernel, then
   an all-reduce is queued behind it. The hook's CPU-side "exit" is the enqueue
   (microseconds); the completion seam (CUDA events polled off the training
   thread) must report the GPU-side completion after the sleep, and the Flight
   Recorder must move the entry to "completed" with its own times.
2. gloo on CUDA tensors, 2 ranks (spawned): the patched collectives, the Flight
   Recorder signatures, the right sums.
3. NVML for real: devices, this process among the GPU's compute processes, the
   XID counter supported or not, the rank -> GPU info series.
4. Hook overhead on a real GPU step (a small MLP, forward + backward + NCCL
   all-reduce + optimizer), installed vs not, interleaved rounds: a ratio.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ROWS: list[tuple[str, str, str]] = []


def row(check: str, result: str, detail: str) -> None:
    ROWS.append((check, result, detail))
    print(f"{check:<34} {result:<6} {detail}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def records(mon, kind):
    from watchdog.contracts import slot as wire
    from watchdog.hook.testing import read_monitor, records_of

    return records_of(read_monitor(mon), getattr(wire.RecordKind, kind))


def check_nccl_completion(run_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from watchdog.contracts import slot as wire
    from watchdog.hook import install

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    mon = install(run_dir=run_dir, job="gpu-check", rank=0, world_size=1, heartbeat_interval_s=3600)
    try:
        if mon.completions is None:
            row("nccl: completion source", "FAIL", "no CUDA event source chosen at install")
            return
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1)
        t = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(t)  # warm up NCCL
        torch.cuda.synchronize()
        mon._poll_background()
        # ~0.2 s of GPU time at ~1.4 GHz; measured below, not assumed
        cycles = int(os.environ.get("GPU_CHECK_SLEEP_CYCLES", 300_000_000))
        t0 = time.monotonic_ns()
        torch.cuda._sleep(cycles)
        dist.all_reduce(t)
        enq = time.monotonic_ns()
        # While the GPU still sleeps, the Flight Recorder must show this all-reduce entered on the
        # CPU and not started: the state the hang analysis names as "not started on GPU" (frblame).
        mon.flight.poll(force=True)
        queued = [r.payload for r in records(mon, "COLL_SIG") if r.t_ns >= enq]
        state = wire.CollState(queued[-1][5]).label if queued else "no new signature"
        read_ms = (time.monotonic_ns() - t0) / 1e6
        row(
            "nccl: queued behind a kernel = not started",
            "ok" if state == "scheduled" else "FAIL",
            f"newest all-reduce read as {state!r} at +{read_ms:.1f} ms, while the GPU sleeps",
        )
        h = wire.read_slot(mon.slot_path, 1 << 62).header
        cpu_exit_ms = (h[wire.H_COLL_EXIT_NS] - h[wire.H_COLL_ENTER_NS]) / 1e6
        deadline = time.monotonic() + 30
        done = []
        while time.monotonic() < deadline and not done:
            time.sleep(0.02)
            mon._poll_background()  # what the heartbeat thread does; never a sync
            done = [r for r in records(mon, "COMPLETION") if r.payload[0] == 1 and r.payload[3] >= t0]
        torch.cuda.synchronize()
        synced = time.monotonic_ns()
        if not done:
            row("nccl: GPU-side completion", "FAIL", "no COMPLETION record within 30 s")
        else:
            p = done[0].payload
            gpu_ms = (p[4] - t0) / 1e6
            ok = gpu_ms > 5 * max(cpu_exit_ms, 0.1) and p[4] <= synced + 5_000_000
            row(
                "nccl: enqueue vs GPU completion",
                "ok" if ok else "FAIL",
                f"CPU-side exit after {cpu_exit_ms:.3f} ms (enqueue, returned at +{(enq - t0) / 1e6:.1f} ms); "
                f"GPU completion at +{gpu_ms:.1f} ms on clock {wire.Clock(p[5]).label}; "
                f"synchronize() returned at +{(synced - t0) / 1e6:.1f} ms",
            )
            # The marker queued before the call: reached when the sleep kernel ended,
            # so the collective's GPU-side time is completed - started, not the sleep.
            started_ms = (p[6] - t0) / 1e6 if p[6] > 0 else 0.0
            row(
                "nccl: GPU-side collective start",
                "ok" if p[6] > 0 and started_ms > 0.5 * gpu_ms and p[6] <= p[4] else "FAIL",
                f"started at +{started_ms:.1f} ms, GPU-side collective time {(p[4] - p[6]) / 1e6:.3f} ms"
                if p[6] > 0
                else "no start marker (COMPLETION word G is 0)",
            )
        mon._poll_background()
        sigs = [r.payload for r in records(mon, "COLL_SIG")]
        states = sorted({wire.CollState(p[5]).label for p in sigs})
        completed = [p for p in sigs if p[5] == wire.CollState.COMPLETED and p[9] > 0]
        row(
            "nccl: flight recorder states",
            "ok" if completed else "FAIL",
            f"{len(sigs)} signatures, states {states}; "
            + (
                f"last completed: started->completed {(completed[-1][9] - completed[-1][8]) / 1e6:.1f} ms (FR clock)"
                if completed
                else "no entry reached 'completed' (FR times not recorded on this build?)"
            ),
        )
        dist.destroy_process_group()
    finally:
        mon.close()


def _gloo_cuda_worker(rank: int, world: int, port: int, run_dir: str, q) -> None:
    try:
        import torch
        import torch.distributed as dist

        from watchdog.hook import install

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        mon = install(run_dir=run_dir, job="gpu-check-gloo", rank=rank, world_size=world, heartbeat_interval_s=3600)
        torch.cuda.set_device(0)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        t = torch.full((1000,), float(rank + 1), device="cuda")
        dist.all_reduce(t)
        dist.broadcast(t, 0)
        torch.cuda.synchronize()
        mon._poll_background()
        sigs = len(records(mon, "COLL_SIG"))
        ok = bool((t == sum(range(1, world + 1))).all())
        dist.destroy_process_group()
        mon.close()
        q.put((rank, ok, sigs, ""))
    except Exception:
        q.put((rank, False, 0, traceback.format_exc()[-800:]))


def check_gloo_cuda(run_dir: str) -> None:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port, world = free_port(), 2
    procs = [ctx.Process(target=_gloo_cuda_worker, args=(r, world, port, run_dir, q)) for r in range(world)]
    for p in procs:
        p.start()
    got = []
    deadline = time.monotonic() + 120
    while len(got) < world and time.monotonic() < deadline:
        try:
            got.append(q.get(timeout=1))
        except Exception:
            if not any(p.is_alive() for p in procs):
                break
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)
    ok = len(got) == world and all(g[1] for g in got)
    detail = "; ".join(f"rank {g[0]}: sums {'right' if g[1] else 'WRONG'}, {g[2]} FR signatures" for g in sorted(got))
    errors = " ".join(g[3] for g in got if g[3])
    row(
        "gloo on CUDA tensors, 2 ranks",
        "ok" if ok else "FAIL",
        (detail or "no rank answered") + (f" {errors}" if errors else ""),
    )


def check_nvml() -> None:
    import torch

    from watchdog.agent.export.accelmetrics import accelerator_families
    from watchdog.agent.export.nvml import Accelerators

    class Log:
        def __getattr__(self, level):
            return lambda event, **kw: print(f"  nvml {level}: {event} {kw}")

    torch.ones(1, device="cuda")  # this process becomes a compute process on GPU 0
    acc = Accelerators(log=Log())
    snap = acc.sample(time.monotonic())
    if not snap.available:
        row("nvml", "FAIL", f"unavailable: {snap.reason}")
        return
    mine = [d.index for d in snap.devices if os.getpid() in d.pids]
    d = snap.devices[0]
    fams = {f.name: f for f in accelerator_families(snap, "h")}
    xid = fams["watchdog_accelerator_xid_errors"].samples
    row(
        "nvml: devices and processes",
        "ok" if mine else "FAIL",
        f"{len(snap.devices)} x {d.name}; util {d.util_ratio}, {d.temperature_c} C, {d.power_w} W, "
        f"SM {d.sm_clock_hz}, throttle {d.throttle_reasons}; this pid on GPU {mine or 'none (pid namespace?)'}; "
        f"XID {'supported' if d.xid_errors is not None else 'unsupported'} ({len(xid)} series)",
    )
    acc.close()


def _gpu_step(model, opt, x, dist):
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()


def check_overhead(run_dir: str, steps: int, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    from watchdog.hook import install

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 1024, device="cuda")
    for _ in range(20):
        _gpu_step(model, opt, x, dist)
    torch.cuda.synchronize()
    bare, hooked = [], []
    for _ in range(rounds):
        for variant in ("bare", "hooked"):
            mon = (
                install(run_dir=run_dir, job="gpu-check-overhead", rank=0, world_size=1)
                if variant == "hooked"
                else None
            )
            step = mon.step if mon is not None else (lambda: None)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                _gpu_step(model, opt, x, dist)
                step()
            torch.cuda.synchronize()
            (hooked if mon else bare).append((time.perf_counter() - t0) / steps)
            if mon is not None:
                mon.close()
    b, h = statistics.median(bare), statistics.median(hooked)
    row(
        "hook overhead on a GPU step",
        "ok" if h / b < 1.02 else "WARN",
        f"bare {b * 1e3:.3f} ms, hooked {h * 1e3:.3f} ms per step: ratio {h / b:.4f} "
        f"(median of {rounds} interleaved rounds of {steps} steps; 4 NCCL all-reduces per step)",
    )
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="also write the table here")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_check: torch is not installed: skipped")
        return 0
    if not torch.cuda.is_available():
        print(f"gpu_check: no usable CUDA device (torch {torch.__version__}): skipped, nothing to prove here")
        return 0
    print(f"gpu_check: torch {torch.__version__}, {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}")
    run_dir = tempfile.mkdtemp(prefix="watchdog-gpu-check-")
    checks = (
        ("nccl completion", lambda: check_nccl_completion(run_dir)),
        ("gloo cuda", lambda: check_gloo_cuda(run_dir)),
        ("nvml", check_nvml),
        ("overhead", lambda: check_overhead(run_dir, args.steps, args.rounds)),
    )
    for name, fn in checks:
        t0 = time.monotonic()
        try:
            fn()
        except Exception as exc:
            row(name, "ERROR", f"{type(exc).__name__}: {exc}"[:500])
            traceback.print_exc()
        print(f"  ({name}: {time.monotonic() - t0:.1f} s)", flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}\n")
            for r in ROWS:
                fh.write(" | ".join(r) + "\n")
    return 0 if all(r[1] in ("ok", "WARN") for r in ROWS) else 1


if __name__ == "__main__":
    sys.exit(main())
