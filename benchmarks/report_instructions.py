"""Instructions the coordinator executes per accepted report and per tick,
counted by valgrind (cachegrind), so that a change of a few percent can be
seen on a machine whose timings swing by more than that between two runs.

    python benchmarks/report_instructions.py [--ranks 256] [--seconds 10] [--compute-s 0.2] [--compare-with DIR]

The simulated hosts of ``scale.py`` (``scalesim``) report once a second into a
``Coordinator`` in process, as ``scale_profile.py`` drives it: each body read as
the request handler reads it (the typed reader, else JSON and the schema),
folded, and a tick each second under the daemon's collector policy. Every body
is made before the first is read, the same ones in every run, so the generator's
instructions cancel out: a run that folds ``--seconds`` more seconds than
another differs from it by exactly those reports (and a run with ticks from one
without by the ticks). Three runs per tree; ``--compare-with`` times another
checkout's package the same way (its ``watchdog`` first on the path).

Instructions are not time: a report's cost at 16,384 ranks is also its cache
misses (cold objects, ``scale_profile.py`` measures that), which a small job
here does not have. They are the part of it a code change controls, measured
the same every time. Needs ``valgrind`` on the PATH (about a minute a run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WARM_S = 20  # seconds folded before any counted: every rank joined, histories filling


def child(ranks: int, seconds: int, counted: int, compute_s: float, ticks: bool) -> None:
    """Fold ``WARM_S + counted`` of the ``WARM_S + seconds`` seconds made."""
    sys.path.insert(0, HERE)
    import logging

    import scalesim

    from watchdog.coordinator.config import Config
    from watchdog.coordinator.gcpolicy import GcPolicy
    from watchdog.coordinator.intake.api import decode
    from watchdog.coordinator.journal.jsonl import Journal
    from watchdog.coordinator.service import Coordinator
    from watchdog.report import HostReport, as_rows
    from watchdog.stepstats.steps import summary_config

    try:
        from watchdog.contracts.report.typed import read as read_typed
    except ImportError:  # a checkout from before watchdog/contracts (--compare-with)
        from watchdog.coordinator.typedbody import read as read_typed

    t0 = 1_800_000_000.0
    job = scalesim.Job(world_size=ranks, t0=t0, straggler=ranks // 3, compute_s=compute_s)
    hosts = [scalesim.Host(job, i, f"agent{i}") for i in range((ranks + 7) // 8)]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "journal.jsonl")
        coord = Coordinator(
            Config(job=job.job, world_size=ranks, journal=path), Journal(path, lambda: (time.time(), time.monotonic()))
        )
        settings = list(summary_config(coord.cfg.detectors))
        bodies = []
        for sec in range(WARM_S + seconds):
            for i, h in enumerate(hosts):
                wall = t0 + sec + i / len(hosts)
                raw = h.report(wall, 1.0)
                bodies.append((sec, wall, json.dumps(as_rows(raw)).encode()))
                h.delivered(raw, {"ok": True, "commands": [], "step_summary_config": settings})
        logging.disable(logging.CRITICAL)
        gc_policy = GcPolicy(0.0)
        last = 0
        for sec, wall, body in bodies:
            if sec >= WARM_S + counted:
                break
            if sec != last:
                gc_policy.before_tick()
                if ticks:
                    coord.tick(float(sec), wall)
                gc_policy.after_tick(float(sec))
                last = sec
            report = read_typed(body) or HostReport.from_dict(decode(body), [])
            coord.accept(report, wall - t0)
            gc_policy.after_report()


def count(tree: str | None, args: argparse.Namespace, counted: int, ticks: bool) -> int:
    """Instructions of one child run (the package of ``tree`` first on the path)."""
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        str(counted),
        "--ranks",
        str(args.ranks),
        "--seconds",
        str(args.seconds),
        "--compute-s",
        str(args.compute_s),
        *(["--ticks"] if ticks else []),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    got = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if out.returncode != 0 or got is None:
        sys.exit(f"valgrind run failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return int(got.group(1).replace(",", ""))


def measure(tree: str | None, args: argparse.Namespace) -> tuple[float, float]:
    """(instructions per report, per tick)."""
    base = count(tree, args, 0, ticks=False)
    folded = count(tree, args, args.seconds, ticks=False)
    ticked = count(tree, args, args.seconds, ticks=True)
    reports = args.seconds * ((args.ranks + 7) // 8)
    return (folded - base) / reports, (ticked - folded) / args.seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--seconds", type=int, default=10, help="seconds counted (after 20 warm ones)")
    ap.add_argument("--compute-s", type=float, default=0.2, help="each rank's compute per step (scalesim)")
    ap.add_argument("--compare-with", metavar="DIR", help="another checkout, counted the same way first")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ticks", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.ranks, args.seconds, args.child, args.compute_s, args.ticks)
        return
    if shutil.which("valgrind") is None:
        sys.exit("report_instructions: needs valgrind on the PATH (apt install valgrind)")
    trees = [("baseline", args.compare_with)] if args.compare_with else []
    trees.append(("this tree", None))
    rows = [(name, *measure(tree, args)) for name, tree in trees]
    print(f"{args.ranks} ranks, {args.seconds} s counted, compute {args.compute_s} s a step")
    print(f"{'tree':<12}{'instructions / report':>24}{'/ rank':>10}{'/ tick':>16}")
    for name, per_report, per_tick in rows:
        print(f"{name:<12}{per_report:>24,.0f}{per_report / 8:>10,.0f}{per_tick:>16,.0f}")
    if len(rows) == 2:
        (_, r0, t0), (_, r1, t1) = rows
        print(f"{'ratio':<12}{r1 / r0:>24.3f}{'':>10}{t1 / t0:>16.3f}")


if __name__ == "__main__":
    main()
