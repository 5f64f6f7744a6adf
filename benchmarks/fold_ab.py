"""The fold alone, a baseline's against this tree's, in one run on the same
reports: thread CPU per report of ``view.Folder.fold`` (the coordinator's fold
of one host report, its column writes included), each report folded by both,
in alternating order, then every rank of both views compared (every FoldedRank
field, the StepStats' derived fields too, and the columns).

    git worktree add --detach /tmp/base <commit>
    PYTHONPATH=$PWD python benchmarks/fold_ab.py --baseline /tmp/base [--ranks 16384] [--seconds 20] [--warm 64]

The reports are the scale benchmark's simulated hosts (``scalesim``), decoded
before timing (the decode is not the fold). The baseline is loaded as the
package ``baseline_watchdog`` (``baseline_tree``, as ``scale_profile.py --compare-with`` does); its
modules read the wire types (``watchdog.report``) from this tree.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baseline_tree
import scalesim

from watchdog.coordinator.view import cluster as view
from watchdog.coordinator.view import columns
from watchdog.report import HostReport


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="a checkout of the baseline (DIR/watchdog)")
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--seconds", type=int, default=20, help="virtual seconds timed: one report per host each")
    ap.add_argument(
        "--warm",
        type=int,
        default=0,
        help="virtual seconds folded first, untimed (at ~4 steps a second, 64 fill a rank's 256-step history)",
    )
    args = ap.parse_args()
    bview = baseline_tree.module(args.baseline, "coordinator.view")
    t0 = 1_800_000_000.0
    job = scalesim.Job(world_size=args.ranks, t0=t0, straggler=args.ranks // 3)
    hosts = [scalesim.Host(job, i, f"agent{i}") for i in range((args.ranks + 7) // 8)]
    old = bview.Folder(bview.empty(job.job, args.ranks))
    new = view.Folder(view.empty(job.job, args.ranks))
    spent = {"baseline": 0.0, "this tree": 0.0}
    clock = time.thread_time
    n = 0
    gc.disable()  # collections charged to whoever triggers them would blur the split: collected per second
    for sec in range(args.warm + args.seconds):
        if sec == args.warm:
            spent, n = dict.fromkeys(spent, 0.0), 0
        for i, h in enumerate(hosts):
            wall = t0 + sec + i / len(hosts)
            raw = h.report(wall, 1.0)
            report = HostReport.from_dict(raw, [])
            now = wall - t0
            order = ((old, "baseline"), (new, "this tree"))
            for folder, name in order if n % 2 else order[::-1]:
                c0 = clock()
                folder.fold(report, now)
                spent[name] += clock() - c0
            n += 1
            h.delivered(raw)
        gc.collect()
        gc.freeze()
    a, b = old.snapshot(), new.snapshot()
    check(a, b)
    us = {k: v / n * 1e6 for k, v in spent.items()}
    print(
        f"ranks {args.ranks}  reports {n}  fold us/report: baseline {us['baseline']:.1f}  "
        f"this tree {us['this tree']:.1f}  ({us['this tree'] / us['baseline'] - 1:+.1%})  views equal"
    )


def check(a, b) -> None:
    """Every field of every rank, the StepStats' uncompared ones too, and the columns."""
    assert list(a.ranks) == list(b.ranks)
    for r, x in a.ranks.items():
        y = b.ranks[r]
        for f in view._FOLDED_FIELDS:
            assert repr(getattr(x, f)) == repr(getattr(y, f)), (r, f)
        for st_x, st_y in ((x.step_stats, y.step_stats), (x.gpu_stats, y.gpu_stats)):
            assert st_x.windows_scanned == st_y.windows_scanned, r
            assert st_x.flat == st_y.flat and (st_x.flat_of is st_x.history) == (st_y.flat_of is st_y.history), r
    ca, cb = sys.modules["baseline_watchdog.coordinator.columns"].cached(a), columns.cached(b)
    assert ca is not None and cb is not None  # each Folder's own, written as it folded
    for name in columns.NAMES:
        assert repr(list(getattr(ca, name))) == repr(list(getattr(cb, name))), name
    assert {h: repr(v) for h, v in a.hosts.items()} == {h: repr(v) for h, v in b.hosts.items()}


if __name__ == "__main__":
    main()
