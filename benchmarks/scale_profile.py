"""In-process profile of the coordinator at N ranks: the same simulated hosts as
``scale.py`` (``scalesim``), but folded straight into a ``Coordinator`` on a
virtual clock (no HTTP), so the report path and the tick can be timed and
profiled without the generator or the network in the numbers. Each report goes
through the request handler's steps (JSON decode, schema, validate, fold), each
timed on its own; times are the thread's CPU (``time.thread_time``), so other
processes on the machine do not count.

    python benchmarks/scale_profile.py --ranks 16384 --seconds 40 [--profile tick|accept] [--top 25]

Prints the CPU per accepted report and its split, tick duration p50/max over
the last half of the run, the findings opened (there must be none but the
straggler), and with ``--profile`` the top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scalesim

from watchdog.coordinator.api import decode, validate
from watchdog.coordinator.config import Config
from watchdog.coordinator.gcpolicy import GcPolicy
from watchdog.coordinator.journal import Journal
from watchdog.coordinator.service import Coordinator
from watchdog.report import HostReport


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--seconds", type=int, default=40, help="virtual seconds: one report per host and one tick each")
    ap.add_argument("--profile", choices=("tick", "accept"), default=None)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()

    t0 = 1_800_000_000.0
    job = scalesim.Job(world_size=args.ranks, t0=t0, straggler=args.ranks // 3)
    hosts = [scalesim.Host(job, i, f"agent{i}") for i in range((args.ranks + 7) // 8)]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "journal.jsonl")
        journal = Journal(path, lambda: (time.time(), time.monotonic()))
        coord = Coordinator(Config(job=job.job, world_size=args.ranks, journal=path), journal)
        prof = cProfile.Profile() if args.profile else None
        gc_policy = GcPolicy(0.0)  # as in the coordinator's own process (daemon.py)
        parts = dict.fromkeys(("JSON decode", "schema", "validate", "fold"), 0.0)
        accepted, ticks, opened = 0, [], []
        clock = time.thread_time
        for sec in range(args.seconds):
            profiling = prof is not None and sec >= args.seconds // 2
            for i, h in enumerate(hosts):
                wall = t0 + sec + i / len(hosts)
                raw = h.report(wall, 1.0)
                body = json.dumps(raw).encode()
                if profiling and args.profile == "accept":
                    prof.enable()
                c0 = clock()
                obj = decode(body)  # the request handler's steps, in its order (api.ReportHandler.handle)
                c1 = clock()
                dropped: list = []
                report = HostReport.from_dict(obj, dropped)
                c2 = clock()
                validate(report, ranks_checked=True)
                c3 = clock()
                coord.accept(report, wall - t0)
                c4 = clock()
                if profiling and args.profile == "accept":
                    prof.disable()
                for key, dt in zip(parts, (c1 - c0, c2 - c1, c3 - c2, c4 - c3)):
                    parts[key] += dt
                accepted += 1
                h.delivered(raw)
            now = float(sec + 1)
            c0 = clock()
            if profiling and args.profile == "tick":
                prof.enable()
            res = coord.tick(now, t0 + now)
            if profiling and args.profile == "tick":
                prof.disable()
            if sec >= args.seconds // 2:
                ticks.append(clock() - c0)
            gc_policy.after_tick(now)
            opened += [(f.kind, f.ranks) for f in res.opened]
        journal.close()
    ticks.sort()
    print(f"ranks {args.ranks}  hosts {len(hosts)}  virtual seconds {args.seconds}")
    total = sum(parts.values())
    split = "  ".join(f"{k} {v / accepted * 1e6:.0f}" for k, v in parts.items())
    print(f"accept: {total / accepted * 1e6:.0f} us CPU per report ({split}; {accepted} reports)")
    print(f"core share at one report per host per second: {total / accepted * len(hosts):.2f}")
    print(f"tick CPU (last half): p50 {ticks[len(ticks) // 2] * 1e3:.1f} ms  max {ticks[-1] * 1e3:.1f} ms")
    print(f"findings opened: {opened}  (straggler is rank {job.straggler})")
    print(f"max RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
