"""What the framework callbacks' marks cost a step, beside the explicit API.
Run: python benchmarks/callback_overhead.py [--steps N] [--repeats R]

The same loop body three ways: bare (fetch from a list iterator), explicit
(``wrap_loader`` + ``mon.step()``), and the callbacks' path
(``CallbackMarks.batch_start`` / ``batch_end``: ``data_wait_end``, ``mon.step()``,
``data_wait_begin``, which is what ``watchdog.hook.lightning`` / ``.hf`` call per
batch, without the framework's own dispatch). "hook ns" is a variant's cost over
the bare loop; interleaved repeats, median and min. The framework's own callback
dispatch (Lightning calls every callback's hook through a loop) is not counted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from watchdog.hook.marks.callback_marks import CallbackMarks
from watchdog.hook.testing import installed


def bare(mon, items):
    for _ in iter(items):
        pass


def explicit(mon, items):
    step = mon.step
    for _ in mon.wrap_loader(items):
        step()


def callback(mon, items):
    marks = CallbackMarks(mon)
    marks.resume()
    for _ in iter(items):
        marks.batch_start()
        marks.batch_end(True)
    marks.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    items = list(range(args.steps))
    variants = {"bare": bare, "explicit": explicit, "callback": callback}
    per: dict[str, list[float]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory() as tmp, installed(tmp, patch_collectives=False, ring_capacity=4096) as mon:
        for r in range(args.repeats):
            order = list(variants)[r % 3 :] + list(variants)[: r % 3]  # no variant always first
            for name in order:
                t0 = time.perf_counter_ns()
                variants[name](mon, items)
                per[name].append((time.perf_counter_ns() - t0) / args.steps)
    base_med, base_min = statistics.median(per["bare"]), min(per["bare"])
    print(f"{'variant':<10} {'ns/step med':>12} {'min':>8} {'hook ns med':>12} {'min':>8}")
    hook = {}
    for name, vals in per.items():
        hook[name] = (statistics.median(vals) - base_med, min(vals) - base_min)
        print(
            f"{name:<10} {statistics.median(vals):>12.0f} {min(vals):>8.0f} {hook[name][0]:>12.0f} {hook[name][1]:>8.0f}"
        )
    ratio = hook["callback"][0] / hook["explicit"][0] if hook["explicit"][0] > 0 else float("nan")
    ratio_min = hook["callback"][1] / hook["explicit"][1] if hook["explicit"][1] > 0 else float("nan")
    print(f"callback / explicit hook cost: {ratio:.2f}x (median), {ratio_min:.2f}x (min)")


if __name__ == "__main__":
    main()
