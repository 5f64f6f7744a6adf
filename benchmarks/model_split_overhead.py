"""What the opt-in forward/backward/optimizer split (``mon.watch_model``) costs
a training step. Run: python benchmarks/model_split_overhead.py [--repeats 7]

The same training step (forward, loss, backward, SGD step) on a small MLP with
and without the split's four hooks, interleaved repeats; prints the per-step
time of each, the difference in microseconds and the ratio. A small model is
the worst case: the hooks' fixed cost is compared with very little compute.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch

from watchdog.hook.model_split import ModelSplit


def step_ns(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return (time.perf_counter_ns() - t0) / n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--dim", type=int, default=64)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(32, args.dim)
    rows = {"bare": [], "split": []}
    for _ in range(args.repeats):
        for name in rows:
            model = torch.nn.Sequential(torch.nn.Linear(args.dim, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            split = ModelSplit().watch(model, opt) if name == "split" else None
            step_ns(model, opt, x, 20)  # warm up
            rows[name].append(step_ns(model, opt, x, args.steps))
            if split is not None:
                split.close()
    bare, split = statistics.median(rows["bare"]), statistics.median(rows["split"])
    print(f"| variant | step (median of {args.repeats}) |\n|---|---|")
    print(f"| bare step | {bare / 1000:.1f} us |")
    print(f"| with watch_model | {split / 1000:.1f} us |")
    # The hooks' own Python cost, without torch's dispatch: the four calls of one step.
    hooks = ModelSplit()
    t0 = time.perf_counter_ns()
    for _ in range(100_000):
        hooks._fwd_pre()
        hooks._fwd_post()
        hooks._opt_pre()
        hooks._opt_post()
    own = (time.perf_counter_ns() - t0) / 100_000
    print(f"| the four hook calls alone | {own / 1000:.2f} us |")
    print(
        f"\nsplit costs {(split - bare) / 1000:+.2f} us per step ({split / bare:.3f}x) on a "
        f"{args.dim}-128-1 MLP, batch 32, one thread"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
