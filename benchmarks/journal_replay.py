"""Journal reading speed: replay at a coordinator's start, and every record parsed
(the timeline's load), in microseconds a record.

    python benchmarks/journal_replay.py [--tree DIR ...] JOURNAL...

Each ``--tree`` is a checkout of the package, measured in a process of its own and
in turns within one run (so a before/after comparison shares the machine's load);
without one, the installed package. The journals are read once per process; the
JSON decoding is not timed, only what replay and the parser do with the records.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

_CHILD = "--child"


def _measure(paths: list[str], rounds: int) -> dict[str, float]:
    from watchdog.contracts import journal as cj  # imported here: from the tree under test
    from watchdog.contracts.journal import reader
    from watchdog.coordinator import policy_file
    from watchdog.coordinator.control import replay as recover

    journals = [reader.read(p) for p in paths]
    n = sum(len(j) for j in journals)
    pol = policy_file.Policy()
    best_replay = best_parse = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for recs in journals:
            recover.replay(recs, 1e9, 2e9, "", pol)
        best_replay = min(best_replay, time.process_time() - t0)
        t0 = time.process_time()
        for recs in journals:
            for d in recs:
                cj.parse(d)
        best_parse = min(best_parse, time.process_time() - t0)
    return {"records": n, "replay_us": best_replay / n * 1e6, "parse_us": best_parse / n * 1e6}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("journals", nargs="+")
    ap.add_argument("--tree", action="append", default=[], help="a checkout to measure (repeatable)")
    ap.add_argument("--rounds", type=int, default=5, help="best of this many passes")
    ap.add_argument("--turns", type=int, default=3, help="alternations between the trees")
    ap.add_argument(_CHILD, action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child or not args.tree:
        print(json.dumps(_measure(args.journals, args.rounds)))
        return 0
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.turns):
        for tree in args.tree:
            env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
            out = subprocess.run(
                [sys.executable, __file__, _CHILD, "--rounds", str(args.rounds), *args.journals],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            got = json.loads(out)
            prev = best.get(tree)
            best[tree] = got if prev is None else {k: min(v, got[k]) for k, v in prev.items()}
    for tree, got in best.items():
        print(
            f"{tree}: {int(got['records'])} records, replay {got['replay_us']:.2f} us/record, "
            f"parse {got['parse_us']:.2f} us/record"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
