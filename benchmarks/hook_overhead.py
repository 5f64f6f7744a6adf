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

* "DataLoader + optimizer.step": a real torch DataLoader (batch of one item)
  and a real optimizer (a do-nothing step, so the global step hooks are the
  cost), instrumented three ways: not at all, with the explicit API
  (``wrap_loader`` + ``mon.step()``), and zero-code as ``watchdog run`` does it
  (``watchdog.hook.zero_code.auto``: DataLoader patched, optimizer-step hook). The
  zero-code row's "hook ns" over the explicit row's is the price of no edits.

* "forward": a small model's forward (8 Linear + ReLU pairs in a Sequential:
  17 module calls), bare, with install() in its steady state (progress on, the
  global forward hook not registered: what a job pays between evaluations) and
  with that hook registered, as the heartbeat does during a step much longer
  than the last (watchdog.hook.marks.progress): hook ns per forward of 17 module calls.

Several interleaved repeats; median and min reported. Budget: step mark + loader wrap + one
collective <= 3 us per step on the project's CPUs (CPython 3.11).

``--against OTHER_TREE`` compares two checkouts (before/after a change) on a
shared, noisy machine: it runs this benchmark from each tree in turn, in fresh
processes, ``--rounds`` times, and reports per variant the median of each
tree's "hook ns" and their ratio, so a slow spell hits both trees alike.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch
import torch.distributed as dist

from watchdog.contracts.slot import CollOp
from watchdog.hook import install
from watchdog.hook.zero_code.collectives import Sink, make_wrapper

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


def measure_all(variants, n: int, repeats: int, tensor) -> dict[str, list[float]]:
    """Interleaved: each repeat runs every variant once, so a slow spell of this
    (shared, noisy) machine hits all of them alike instead of one."""
    for _, step, wrap, coll in variants:
        run(min(n, 2000), step, wrap, coll, tensor)  # warm up
    out: dict[str, list[float]] = {label: [] for label, *_ in variants}
    for _ in range(repeats):
        for label, step, wrap, coll in variants:
            out[label].append(run(n, step, wrap, coll, tensor))
    return out


def nothing() -> None:
    pass


def same(it):
    return it


class NoopOptimizer(torch.optim.Optimizer):
    """A real Optimizer (torch wraps its step with the global hooks) that does nothing."""

    def __init__(self) -> None:
        super().__init__([torch.zeros(1, requires_grad=True)], {})

    def step(self, closure=None):
        return None


def run_loader(n: int, loader, opt, step) -> float:
    """ns per step of: for batch in loader: opt.step(); step()"""
    t0 = time.perf_counter_ns()
    count = 0
    for _ in loader:
        opt.step()
        step()
        count += 1
    return (time.perf_counter_ns() - t0) / count


def zero_code_rows(n: int, repeats: int, run_dir: str) -> tuple[dict[str, list[float]], int]:
    """Interleaved like measure_all; each instrumented run installs its own monitor
    (zero-code mode patches torch's classes, which must not leak into the bare run)."""
    from torch.utils.data import DataLoader

    from watchdog.hook.zero_code import auto

    loader = DataLoader(list(range(n)), batch_size=1, collate_fn=lambda b: b[0])
    opt = NoopOptimizer()
    errors = 0

    def bare() -> float:
        return run_loader(n, loader, opt, nothing)

    def explicit() -> float:
        mon = install(run_dir=run_dir, job="bench-explicit", patch_collectives=False, rank=0, world_size=1)
        try:
            return run_loader(n, mon.wrap_loader(loader), opt, mon.step)
        finally:
            nonlocal errors
            errors += mon.errors
            mon.close()

    def zero_code() -> float:
        mon = install(run_dir=run_dir, job="bench-zero-code", patch_collectives=False, rank=0, world_size=1)
        auto.enable(mon)
        try:
            return run_loader(n, loader, opt, nothing)
        finally:
            nonlocal errors
            errors += mon.errors
            mon.close()

    rows = {
        "bare loop (DataLoader + optimizer.step)": bare,
        "explicit API (wrap_loader + step)": explicit,
        "zero-code (watchdog run)": zero_code,
    }
    for fn in rows.values():
        fn()  # warm up
    out: dict[str, list[float]] = {label: [] for label in rows}
    labels = list(rows)
    for i in range(repeats):  # the order rotates: no variant always runs right after a close()
        for label in labels[i % 3 :] + labels[: i % 3]:
            out[label].append(rows[label]())
    return out, errors


def forward_rows(n: int, repeats: int, run_dir: str) -> tuple[dict[str, list[float]], int]:
    """A small model's forward, bare and with progress counted (interleaved like measure_all)."""
    model = torch.nn.Sequential(*[m for _ in range(8) for m in (torch.nn.Linear(16, 16), torch.nn.ReLU())])
    x = torch.ones(1, 16)
    errors = 0

    def forwards() -> float:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            model(x)
        return (time.perf_counter_ns() - t0) / n

    def installed(armed: bool) -> float:
        mon = install(run_dir=run_dir, job="bench-forward", patch_collectives=False, rank=0, world_size=1)
        try:
            if armed:
                mon.progress._arm()
            return forwards()
        finally:
            nonlocal errors
            errors += mon.errors
            mon.close()

    rows = {
        "bare forward (17 module calls)": forwards,
        "forward, progress on (steady)": lambda: installed(False),
        "forward, forward hook armed": lambda: installed(True),
    }
    for fn in rows.values():
        fn()
    out: dict[str, list[float]] = {label: [] for label in rows}
    for _ in range(repeats):
        for label, fn in rows.items():
            out[label].append(fn())
    return out, errors


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_ROW = re.compile(r"^(?P<label>.+?)\s+(?P<median>\d+)\s+(?P<min>\d+)\s+(?P<hook>-?\d+)\s+[\d.]+$")


def hook_ns_by_variant(output: str) -> dict[str, int]:
    """The "hook ns" column of a run's table, by variant label."""
    rows = (_ROW.match(line.rstrip()) for line in output.splitlines())
    return {m["label"].strip(): int(m["hook"]) for m in rows if m}


def imported_tree(script: str) -> str | None:
    """The checkout whose ``watchdog`` that benchmark script really imports (read
    from ``python -v``): an editable install of another checkout, or a script
    that does not put its own tree first on sys.path, must not stand in for it."""
    cmd = [sys.executable, "-v", script, "--no-gloo", "--steps", "10", "--repeats", "1"]
    err = subprocess.run(cmd, capture_output=True, text=True, check=False).stderr
    m = re.search(r"(\S+/watchdog/hook/__init__\.py)$", err, re.M)  # the same file in every layout
    return os.path.realpath(os.path.join(os.path.dirname(m[1]), "..", "..")) if m else None


def compare(other_tree: str, rounds: int, steps: int, repeats: int) -> int:
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    trees = {"before": os.path.realpath(other_tree), "after": os.path.realpath(here)}
    for name, tree in trees.items():
        found = imported_tree(os.path.join(tree, "benchmarks", "hook_overhead.py"))
        if found != tree:
            print(f"--against: the {name} tree's benchmark imports watchdog from {found}, not {tree}", file=sys.stderr)
            return 2
    runs: dict[str, dict[str, list[int]]] = {name: {} for name in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            script = os.path.join(tree, "benchmarks", "hook_overhead.py")
            cmd = [sys.executable, script, "--no-gloo", "--steps", str(steps), "--repeats", str(repeats)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            rows = hook_ns_by_variant(done.stdout)
            if not rows:  # a crashed run must not leave the other tree compared with nothing
                print(f"--against: no results from {script}:\n{done.stderr[-2000:]}", file=sys.stderr)
                return 2
            for label, ns in rows.items():
                runs[name].setdefault(label, []).append(ns)
    print(
        f"hook ns per step, median over {rounds} alternating runs (before: {trees['before']}, after: this tree), "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'variant':36s} {'before':>8s} {'after':>8s} {'ratio':>6s}")
    for label, before in runs["before"].items():
        if label.startswith("bare") or label not in runs["after"]:
            continue
        b, a = statistics.median(before), statistics.median(runs["after"][label])
        print(f"{label:36s} {b:8.0f} {a:8.0f} {a / b if b else float('nan'):6.2f}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--no-gloo", action="store_true", help="skip the real gloo rows")
    p.add_argument("--no-zero-code", action="store_true", help="skip the DataLoader + optimizer rows")
    p.add_argument("--no-forwards", action="store_true", help="skip the model forward rows")
    p.add_argument("--against", metavar="OTHER_TREE", help="compare with the same benchmark in another checkout")
    p.add_argument("--rounds", type=int, default=7, help="with --against: alternating runs per tree")
    args = p.parse_args(argv)
    if args.against:
        return compare(args.against, args.rounds, args.steps, args.repeats)
    torch.set_num_threads(1)
    tensor = torch.ones(16)
    run_dir = tempfile.mkdtemp(prefix="rwd-bench-")
    # -- fake collective: the hook's own cost --------------------------------
    mon = install(run_dir=run_dir, job="bench", patch_collectives=False, rank=0, world_size=1)
    sink = Sink()
    sink.marks = mon.recorder.collectives
    from torch._C._distributed_c10d import Work

    hooked_coll = make_wrapper(fake_all_reduce, CollOp.ALL_REDUCE, "tensor", False, sink, Work)
    variants = [
        ("bare loop (fake collective)", nothing, same, fake_all_reduce),
        ("+ step mark", mon.step, same, fake_all_reduce),
        ("+ loader wrap", nothing, mon.wrap_loader, fake_all_reduce),
        ("+ patched collective", nothing, same, hooked_coll),
        ("all three", mon.step, mon.wrap_loader, hooked_coll),
    ]
    results = measure_all(variants, args.steps, args.repeats, tensor)
    errors = mon.errors
    mon.close()

    # -- real gloo, world size 1 ----------------------------------------------
    if not args.no_gloo:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
        real_all_reduce = dist.all_reduce
        mon = install(run_dir=run_dir, job="bench-gloo", rank=0, world_size=1)  # patches dist.all_reduce
        variants = [
            ("bare loop (gloo all_reduce, ws=1)", nothing, same, real_all_reduce),
            ("all three (gloo)", mon.step, mon.wrap_loader, dist.all_reduce),
        ]
        results.update(measure_all(variants, args.steps // 4, args.repeats, tensor))
        errors += mon.errors
        mon.close()
        dist.destroy_process_group()

    if not args.no_zero_code:
        rows, zc_errors = zero_code_rows(args.steps // 4, args.repeats, run_dir)
        results.update(rows)
        errors += zc_errors
    if not args.no_forwards:
        rows, fwd_errors = forward_rows(args.steps // 10, args.repeats, run_dir)
        results.update(rows)
        errors += fwd_errors

    print(
        f"hook overhead, median of {args.repeats} interleaved runs of {args.steps} steps, "
        f"CPython {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f} (medians need a quiet machine; min is the noise floor)"
    )
    print(f"{'variant':36s} {'median ns':>10s} {'min ns':>8s} {'hook ns':>8s} {'ratio':>6s}")
    med = {label: statistics.median(v) for label, v in results.items()}
    base_ns = 0.0
    for label, values in results.items():
        if label.startswith("bare"):
            base_ns = med[label]
        over = med[label] - base_ns
        print(f"{label:36s} {med[label]:10.0f} {min(values):8.0f} {over:8.0f} {med[label] / base_ns:6.2f}")
    total, base = med["all three"], med["bare loop (fake collective)"]
    hook_ns = total - base
    verdict = "OK" if hook_ns <= BUDGET_NS else "OVER BUDGET"
    print(f"hook cost per step (step + loader + 1 collective): {hook_ns:.0f} ns, budget {BUDGET_NS} ns: {verdict}")
    if not args.no_zero_code:
        # A DataLoader's own per-batch cost (~20 us) swings by more than the hook costs on a
        # busy machine: the min (noise floor) is compared too.
        for name, pick in (("median", med), ("min", {k: min(v) for k, v in results.items()})):
            bare = pick["bare loop (DataLoader + optimizer.step)"]
            explicit_ns = pick["explicit API (wrap_loader + step)"] - bare
            zero_ns = pick["zero-code (watchdog run)"] - bare
            ratio = zero_ns / explicit_ns if explicit_ns > 0 else float("nan")
            print(
                f"zero-code vs explicit API per step (loader + step), {name}s: "
                f"{zero_ns:.0f} ns vs {explicit_ns:.0f} ns, ratio {ratio:.2f}"
            )
    print(f"hook errors during the run: {errors}")
    return 0 if hook_ns <= BUDGET_NS else 1


if __name__ == "__main__":
    sys.exit(main())
