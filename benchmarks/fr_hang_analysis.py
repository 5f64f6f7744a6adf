"""What reading a hang from the Flight Recorder costs the coordinator, per tick.
Run: python benchmarks/fr_hang_analysis.py [--ranks 1024 4096]

``health.analyze`` runs once per tick (memoised for every detector). When no rank
is in a collective the hook sees, it now asks the Flight Recorder's view
(coordinator/analysis/flight_recorder_blame.py): every rank's newest (group, seq) out of its last 32
signatures. That is only done once no live rank has progressed for
health.FR_AFTER_S, so a running job never pays it. Three views per size, built
by the real fold, each analysed fresh (the per-tick memo cleared):

* running: every rank stepping (the gate is closed);
* hang, marks only: one rank in its data loader, the others waiting in a
  collective issued from C++, no Flight Recorder data (what main analysed);
* hang, Flight Recorder: the same with 32 signatures per rank and fresh reads.

The ratio is the hang's analysis with the Flight Recorder over marks only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from watchdog.coordinator import testing as t
from watchdog.coordinator.analysis.health import analyze
from watchdog.coordinator.config import DetectorConfig

CFG = DetectorConfig()
NOW = 100.0


def states(n: int, hung: bool, fr: bool):
    out = []
    for r in range(n):
        k = 40 if r == 1 else 41  # rank 1 never issued #41: it is in its data loader
        colls = tuple(t.sig(s, age_s=12.0 + (k - s) * 0.1) for s in range(k - 31, k + 1)) if fr else ()
        out.append(
            t.rank(
                r,
                world_size=n,
                step=9 if hung else 40,
                step_age_s=12.0 if hung else 0.05,
                collective=t.coll(seq=9, done_seq=9),
                in_data_wait=hung and r == 1,
                recent_colls=colls,
                fr_read_age_s=1.0 if fr else -1.0,
                recent_steps=t.steps(1, 8),
            )
        )
    return out


def timed(view, repeat: int) -> float:
    got = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        analyze(view, NOW, CFG)
        got.append(time.perf_counter() - t0)
        view = type(view)(**{f: getattr(view, f) for f in view.__dataclass_fields__})  # a new view: no memo hit
    return statistics.median(got) * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    print(f"{'ranks':>6} {'running ms':>11} {'hang marks ms':>14} {'hang FR ms':>11} {'FR/marks':>9}  culprits")
    for n in args.ranks:
        views = {k: t.view(states(n, hung, fr), now=NOW, cfg=CFG) for k, hung, fr in
                 (("run", False, True), ("marks", True, False), ("fr", True, True))}  # fmt: skip
        ms = {k: timed(v, args.repeat) for k, v in views.items()}
        b = analyze(views["fr"], NOW, CFG)
        print(
            f"{n:>6} {ms['run']:>11.2f} {ms['marks']:>14.2f} {ms['fr']:>11.2f} {ms['fr'] / ms['marks']:>8.1f}x"
            f"  {list(b.culprits) if b else None}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
