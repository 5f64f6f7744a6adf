"""What the opt-in finer split costs a training step: ``mon.watch_model``
(forward/backward/optimizer, written through the slot) and
``mon.wrap_loader(loader, device=...)`` (the timed copy to the device).
Run: python benchmarks/model_split_overhead.py [--repeats 7]

The same training step (fetch a batch, forward, loss, backward, SGD step,
``mon.step()``) on a small MLP under a live monitor, interleaved repeats:

- "monitor": the plain hook (wrapped loader, step mark), the baseline;
- "+ watch_model": the four model/optimizer hooks, their sums written into the
  step's record and the slot's running totals;
- "+ device copy": also ``wrap_loader(..., device="cpu")``: every batch's
  ``.to("cpu")`` timed as host-to-device time. On CPU nothing moves: this is the
  cost of the timing and the call, the copy itself is ~0.

Prints the per-step time of each, the difference in microseconds and the ratio.
A small model is the worst case: the fixed cost is compared with little compute.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch

from watchdog.hook.marks.model_split import ModelSplit
from watchdog.hook.testing import installed

VARIANTS = ("monitor", "+ watch_model", "+ device copy")


def step_ns(mon, model, opt, batches, device) -> float:
    loader = mon.wrap_loader(batches, device=device) if device else mon.wrap_loader(batches)
    t0 = time.perf_counter_ns()
    for x in loader:
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mon.step()
    return (time.perf_counter_ns() - t0) / len(batches)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--dim", type=int, default=64)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    batches = [torch.randn(32, args.dim) for _ in range(args.steps)]
    rows: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="model_split_bench") as run_dir:
        for _ in range(args.repeats):
            for name in VARIANTS:
                with installed(run_dir, patch_collectives=False, heartbeat_interval_s=3600) as mon:
                    model = torch.nn.Sequential(
                        torch.nn.Linear(args.dim, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)
                    )
                    opt = torch.optim.SGD(model.parameters(), lr=0.01)
                    if name != "monitor":
                        mon.watch_model(model, opt)
                    device = "cpu" if name == "+ device copy" else None
                    step_ns(mon, model, opt, batches[:20], device)  # warm up
                    rows[name].append(step_ns(mon, model, opt, batches, device))
    med = {k: statistics.median(v) for k, v in rows.items()}
    base = med["monitor"]
    print(f"| variant | step (median of {args.repeats}) | vs monitor |\n|---|---|---|")
    for name in VARIANTS:
        print(f"| {name} | {med[name] / 1000:.1f} us | {(med[name] - base) / 1000:+.2f} us ({med[name] / base:.3f}x) |")
    # The hooks' own Python cost, without torch's dispatch: the four calls of one step.
    hooks = ModelSplit()
    t0 = time.perf_counter_ns()
    for _ in range(100_000):
        hooks._fwd_pre()
        hooks._fwd_post()
        hooks._opt_pre()
        hooks._opt_post()
    own = (time.perf_counter_ns() - t0) / 100_000
    print(f"| the four hook calls alone | {own / 1000:.2f} us | |")
    print(f"\non a {args.dim}-128-1 MLP, batch 32, one thread, {args.steps} steps per run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
