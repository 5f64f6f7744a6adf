"""Real CPU runs of the example (torchrun + gloo, monitored end to end by
``watchdog demo``), one per bottleneck, and what the coordinator concluded:
the verdicts it journaled, the final goodput, and whether the goodput counters
add up to the wall time the journal spans.

    python benchmarks/bottleneck.py [--steps 200] [--only healthy,data] [--work-dir DIR]

Prints a table; ``--scaling`` instead runs the same per-rank job at 1, 2 and 4
ranks and prints the journals to give ``watchdog scaling``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.coordinator.performance import goodput

SCENARIOS = {
    # name: (expected verdict, demo args, script args)
    "healthy": ("compute", ["--compute-ms", "50"], []),
    "data": ("data", ["--compute-ms", "50", "--fault", "starve:all"], []),
    "communication": ("communication", ["--compute-ms", "5"], ["--comm-mb", "16"]),
    "straggler": ("straggler", ["--compute-ms", "50", "--fault", "slow:2:1.5"], []),
}


def run(name: str, ranks: int, steps: int, demo_args: list[str], script_args: list[str], work: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "watchdog.cli",
        "demo",
        "--json",
        "--ranks",
        str(ranks),
        "--steps",
        str(steps),
        "--linger-seconds",
        "100000",
        "--timeout-seconds",
        "600",
        "--work-dir",
        str(work / name),
        *demo_args,
    ]
    if script_args:
        cmd += ["--", *script_args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    summary = next((x for x in lines if x.get("event") == "summary"), None)
    if summary is None:
        raise SystemExit(f"{name}: demo failed\n{out.stdout}\n{out.stderr[-2000:]}")
    return summary


def read(path: str) -> dict:
    recs = journal.read(path)
    verdicts = [r["verdict"] for r in recs if r["event"] == je.VERDICT]
    goodputs = [r for r in recs if r["event"] == je.GOODPUT]
    final = goodputs[-1] if goodputs else {}
    # The job's wall time: from the coordinator's start to the last rank's clean exit. The
    # ledger's clock starts at the first tick and stops at the first tick after that exit.
    span = goodput.job_span(recs) or 0.0
    accounted = final.get("total_s", 0.0) + final.get("pending_s", 0.0)
    return {"verdicts": verdicts, "final": final, "span_s": span, "accounted_s": accounted}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--only", default=",".join(SCENARIOS))
    p.add_argument("--work-dir", default=None)
    p.add_argument("--scaling", action="store_true", help="run the same job at 1, 2, 4 ranks for watchdog scaling")
    p.add_argument(
        "--scaling-args",
        default="--compute-ms 40 -- --comm-mb 4",
        help="demo args (and, after --, script args) for --scaling",
    )
    args = p.parse_args(argv)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="watchdog-bottleneck-")).resolve()
    if args.scaling:
        demo, _, script = args.scaling_args.partition(" -- ")
        paths = []
        for n in (1, 2, 4):
            s = run(f"scale{n}", n, args.steps, demo.split(), script.split(), work)
            paths.append(s["journal"])
            print(f"{n} rank(s): {s['journal']}", flush=True)
        print("watchdog scaling " + " ".join(paths))
        return 0
    print("| run | expected | verdicts journaled | goodput (final record) | counters vs job wall time (journal) |")
    print("|---|---|---|---|---|")
    for name in args.only.split(","):
        want, demo, script = SCENARIOS[name]
        s = run(name, args.ranks, args.steps, demo, script, work)
        r = read(s["journal"])
        f = r["final"]
        gap = (r["accounted_s"] - r["span_s"]) / r["span_s"] if r["span_s"] else float("nan")
        print(
            f"| {name} | {want} | {' -> '.join(r['verdicts']) or '-'} | {f.get('summary', '-')} | "
            f"{r['accounted_s']:.2f} s vs {r['span_s']:.2f} s ({gap:+.1%}) |",
            flush=True,
        )
    print(f"\njournals under {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
