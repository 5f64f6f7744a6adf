"""Recovery benchmark: real 4-rank torchrun jobs (gloo, CPU, --max-restarts 3)
with an injected fault and an action policy, through ``watchdog demo --json``.

    python benchmarks/recovery.py [--repeats 1]

For each scenario, seconds from the fault's true injection (the example
announces it) to: detection (the finding), the action, the restart (the old
workers gone), and the first step of the restarted group (``resumed``: every
rank completed a step); plus the steps redone (the furthest step the old
incarnation reached, minus the step it resumed from). After a restart that is
the work since the last periodic checkpoint; after checkpoint_restart, only the
steps the ranks ran past S while the restart was under way: no step after S is
lost, the job resumes from exactly S.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.dev import scenario

SCENARIOS = [
    # label, fault, action, steps
    # Periodic checkpoints every 10 steps: a fault at step 25/35 redoes 5 steps.
    ("dead rank, restart", "kill:1@25", "restart", 80),
    ("collective hang, restart", "hang:2@35", "restart", 80),
    ("straggler 1.3x, checkpoint_restart", "slow:2:1.3", "checkpoint_restart", 300),
]


def measure(fault: str, action: str, steps: int) -> dict | None:
    with tempfile.TemporaryDirectory() as tmp:
        res = scenario.run([fault], steps=steps, timeout_s=240, work_dir=tmp, action=action)
        recs = journal.read(res.summary["journal"])
    if not res.faults:
        return None
    t0 = min(f["t_wall"] for f in res.faults)
    at = {}
    for r in recs:
        ev = r["event"]
        if ev in (je.FINDING, je.ACTION, je.RESTART, je.RESUMED) and ev not in at:
            at[ev] = r["t_wall"] - t0
    resumed = next((r for r in recs if r["event"] == je.RESUMED), None)
    old = [r["old_step"] for r in recs if r["event"] == je.RANK_RESTARTED]
    if resumed is None or len(at) < 4:
        print(f"  {fault}: incomplete {sorted(at)}", file=sys.stderr)
        return None
    # The hang/kill ranks' counters stop at the fault; the others may be one step on.
    at["redone"] = max(old, default=resumed["step"]) - resumed["step"]
    at["exit"] = res.summary["job_exit_code"]
    return at


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    t0 = time.monotonic()
    rows = []
    for label, fault, action, steps in SCENARIOS:
        runs = [m for m in (measure(fault, action, steps) for _ in range(args.repeats)) if m]
        print(f"  {label}: {runs}", file=sys.stderr, flush=True)
        if not runs:
            rows.append((label, fault, "-", "-", "-", "-", "-", "failed"))
            continue
        med = lambda k, runs=runs: f"{statistics.median(r[k] for r in runs):.2f}"  # noqa: E731
        rows.append(
            (
                label,
                fault,
                med(je.FINDING),
                med(je.ACTION),
                med(je.RESTART),
                med(je.RESUMED),
                str(max(r["redone"] for r in runs)),
                "/".join(str(r["exit"]) for r in runs),
            )
        )
    print("\nRecovery: seconds after the fault's injection (median), 4 gloo ranks on CPU, ~0.06 s steps\n")
    headers = ("scenario", "fault", "detected", "action", "restart", "first step after", "steps redone", "exit")
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    print("\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]))
    print(f"\n(total {time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
