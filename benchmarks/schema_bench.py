"""The accept path's "schema" step alone: ``HostReport.from_dict(obj, [])`` on
the version-2 bodies ``scalesim`` hosts send, against another tree's
``watchdog/report.py`` in the same process, report by report in turn (the
machine's load then weighs on both alike; ``scale_profile.py`` runs one tree a
run, and its figures move by ±20% between runs on a shared machine).

    python benchmarks/schema_bench.py [--compare-with DIR] [--layout sim|agent] [--hosts 256] [--rounds 5]

Each body is decoded (as the request handler does) just before it is timed,
so its objects are as fresh in the cache as they are on the accept path; only
``from_dict`` is timed (thread CPU), with the cyclic collector off (the
daemon freezes it around reports). ``--layout agent``: the field lists of a
current agent (every field, the finer step split); ``sim``: scalesim's own
(older agents' fields left out, short steps). Prints us per report for this
tree and the other (min over rounds, and every round), and their ratio. The two
decode each report to the same values (checked on the first reports).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baseline_tree
import scalesim

from watchdog import report
from watchdog.coordinator.intake.api import decode


def bodies(layout: str, hosts: int, seconds: int = 8) -> list[bytes]:
    """Version-2 bodies from ``hosts`` hosts of a 16,384-rank job, after the first
    seconds (each then carries the ~4 steps per rank completed since the last)."""
    job = scalesim.Job(world_size=16384, t0=1000.0)
    sim = [scalesim.Host(job, i, f"agent{i}") for i in range(hosts)]
    out = []
    for sec in range(seconds):
        for i, h in enumerate(sim):
            raw = h.report(job.t0 + sec + i / hosts, 1.0)
            if layout == "agent":  # every field, as HostReport.to_dict() has them
                raw = json.loads(json.dumps(report.HostReport.from_dict(raw).to_dict()))
            if sec >= 3:
                out.append(json.dumps(report.as_rows(raw)).encode())
            h.delivered(raw)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare-with", metavar="DIR", help="another checkout, timed in turn with this one")
    ap.add_argument("--layout", choices=("sim", "agent"), default="agent")
    ap.add_argument("--hosts", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = bodies(args.layout, args.hosts)
    trees = {"this": report}
    if args.compare_with:
        # As its own package (baseline_tree), so its relative imports resolve within that checkout.
        trees["other"] = baseline_tree.module(args.compare_with, "report")
        for b in work[:50]:
            this, other = (asdict(m.HostReport.from_dict(decode(b), [])) for m in trees.values())
            if this != other:
                sys.exit("the two trees decode a report differently")
    gc.disable()
    clock = time.thread_time
    spent: dict[str, list[float]] = {k: [] for k in trees}
    for r in range(args.rounds):
        acc = dict.fromkeys(trees, 0.0)
        for k, b in enumerate(work):
            order = list(trees.items()) if (k + r) % 2 == 0 else list(trees.items())[::-1]  # neither always first
            for name, mod in order:
                obj = decode(b)
                c0 = clock()
                mod.HostReport.from_dict(obj, [])
                acc[name] += clock() - c0
        for name, total in acc.items():
            spent[name].append(total / len(work) * 1e6)
    for name, us in spent.items():
        print(f"{name}: {min(us):.1f} us per report (rounds: {' '.join(f'{x:.0f}' for x in us)})")
    if len(spent) == 2:
        print(
            f"this / other: {min(spent['this']) / min(spent['other']):.3f} ({len(work)} reports, {args.layout} layout)"
        )


if __name__ == "__main__":
    main()
