"""What the hook costs a training step, in nanoseconds. Run: python benchmarks/hook_overhead.py

Every variant runs the same loop body: fetch a batch from an iterator and call
one collective, N times; the hook's cost is the difference from the bare loop.

* "fake collective": a no-op Python function with all_reduce's signature, called
  on a 16-float tensor. Hooked, it is wrapped by the very wrapper that
  install() puts on torch.distributed.all_reduce (collectives.make_wrapper), so
  the wrapper's argument parsing, tensor sizing and enter/exit marks are all
  measured, without the noise of a real collective.
* "gloo all_reduce": a real single-process gloo group (world size 1,
  127.0.0.1), install()'s real patch. Shows the overhead next to the cheapest
  real collective there is.

Several repeats, median reported. Budget: step mark + loader wrap + one
collective <= 3 us per step on the project's CPUs (CPython 3.11).
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

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from watchdog.hook import install  # noqa: E402
from watchdog.hook.collectives import Sink, make_wrapper  # noqa: E402
from watchdog.wire import CollOp  # noqa: E402

BUDGET_NS = 3000


def fake_all_reduce(tensor, op=None, group=None, async_op=False):
    return None


def run(n: int, step, wrap, coll, tensor) -> float:
    """ns per step of: for batch in wrap(data): coll(tensor); step()"""
    data = [tensor] * n
    t0 = time.perf_counter_ns()
    for batch in wrap(data):
        coll(batch)
        step()
    return (time.perf_counter_ns() - t0) / n


def measure(n: int, repeats: int, step, wrap, coll, tensor) -> float:
    run(min(n, 2000), step, wrap, coll, tensor)  # warm up
    return statistics.median(run(n, step, wrap, coll, tensor) for _ in range(repeats))


def nothing() -> None:
    pass


def same(it):
    return it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--no-gloo", action="store_true", help="skip the real gloo rows")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    tensor = torch.ones(16)
    run_dir = tempfile.mkdtemp(prefix="rwd-bench-")
    rows: list[tuple[str, float, float]] = []

    def bench(label, step, wrap, coll, base):
        ns = measure(args.steps, args.repeats, step, wrap, coll, tensor)
        rows.append((label, ns, ns - base if base is not None else 0.0))
        return ns

    # -- fake collective: the hook's own cost --------------------------------
    mon = install(run_dir=run_dir, job="bench", patch_collectives=False, rank=0, world_size=1)
    sink = Sink()
    sink.monitor = mon
    from torch._C._distributed_c10d import Work

    hooked_coll = make_wrapper(fake_all_reduce, CollOp.ALL_REDUCE, "tensor", False, sink, Work)
    base = bench("bare loop (fake collective)", nothing, same, fake_all_reduce, None)
    bench("+ step mark", mon.step, same, fake_all_reduce, base)
    bench("+ loader wrap", nothing, mon.wrap_loader, fake_all_reduce, base)
    bench("+ patched collective", nothing, same, hooked_coll, base)
    total = bench("all three", mon.step, mon.wrap_loader, hooked_coll, base)
    errors = mon.errors
    mon.close()

    # -- real gloo, world size 1 ----------------------------------------------
    if not args.no_gloo:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
        gbase = bench("bare loop (gloo all_reduce, ws=1)", nothing, same, dist.all_reduce, None)
        mon = install(run_dir=run_dir, job="bench-gloo", rank=0, world_size=1)  # patches dist.all_reduce
        bench("all three (gloo)", mon.step, mon.wrap_loader, lambda t: dist.all_reduce(t), gbase)
        errors += mon.errors
        mon.close()
        dist.destroy_process_group()

    print(f"hook overhead, median of {args.repeats} x {args.steps} steps, CPython {sys.version.split()[0]}, torch {torch.__version__}")
    print(f"{'variant':40s} {'ns/step':>9s} {'overhead ns':>12s} {'ratio':>7s}")
    bare = {}
    for label, ns, over in rows:
        if label.startswith("bare"):
            bare_ns = ns
            bare[label] = ns
        print(f"{label:40s} {ns:9.0f} {over:12.0f} {ns / bare_ns:7.2f}")
    hook_ns = total - base
    verdict = "OK" if hook_ns <= BUDGET_NS else "OVER BUDGET"
    print(f"hook cost per step (step + loader + 1 collective): {hook_ns:.0f} ns, budget {BUDGET_NS} ns: {verdict}")
    print(f"hook errors during the run: {errors}")
    return 0 if hook_ns <= BUDGET_NS else 1


if __name__ == "__main__":
    sys.exit(main())
