"""A finding that names every rank, at scale: what asking every host for its
evidence costs the coordinator (CPU on the request loop, journal bytes).

    python benchmarks/evidence_fanout.py [--ranks 16384] [--named all|one|each] [--compare-with DIR]

A job-wide stall (every rank frozen: a shared filesystem hangs, a switch
drops) is one finding naming all ranks. Its evidence plan asks each of the
2,048 hosts for stacks, Flight Recorder dumps and slot snapshots; every request
and every answer is one journal line. This drives a real ``Coordinator``: one
report per host to build the view, the finding's evidence collected as a tick
does (``Collector.collect``), then one report per host that picks up its commands and
one that answers them (stacks of its ranks), then the grouped ``stack_groups``
record. Prints the journal bytes by event and the CPU of each round next to a
round of plain reports. ``--named each``: a frozen_rank finding per rank, all
opened in one tick (a job suspended with SIGSTOP): only the plan's CPU and the
commands queued are measured (the rounds would take hours before). ``--compare-with DIR`` runs another checkout's
coordinator on the same inputs in the same process (``baseline_tree``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PER_HOST = 8
STACK = "Thread 0x7f (idle): MainThread\n    wait (torch/distributed/c10d.py:100)\n    train (train.py:42)\n"


def _modules(root: str | None) -> SimpleNamespace:
    if root is None:
        from watchdog.coordinator import config, service, testing
        from watchdog.coordinator.journal import jsonl as journal

        return SimpleNamespace(config=config, journal=journal, service=service, testing=testing)
    import baseline_tree

    return SimpleNamespace(
        **{n: baseline_tree.module(root, f"coordinator.{n}") for n in ("config", "journal", "service", "testing")}
    )


def run(m: SimpleNamespace, ranks: int, named: str, tmp: str) -> dict:
    path = os.path.join(tmp, "journal.jsonl")
    cfg = m.config.Config(journal=path, job="job", world_size=ranks, tick_s=1.0, token="secret")
    coord = m.service.Coordinator(cfg, m.journal.Journal(path, lambda: (1.7e9, 0.0)))
    states = {h: [m.testing.rank(r) for r in range(h * PER_HOST, (h + 1) * PER_HOST)] for h in range(ranks // PER_HOST)}
    seq = [0]

    def round_(now: float, acks: dict[str, list[dict]] | None = None) -> tuple[float, dict[str, list[dict]]]:
        seq[0] += 1
        replies: dict[str, list[dict]] = {}
        cpu = 0.0
        for h, st in states.items():
            host = f"host{h}"
            report = replace(m.testing.report(host, st, job="job", seq=seq[0]), acks=tuple((acks or {}).get(host, ())))
            t = time.thread_time()
            replies[host] = coord.accept(report, now)["commands"]
            cpu += time.thread_time() - t
        return cpu, replies

    round_(100.0)
    plain, _ = round_(101.0)
    view = coord.view_at(102.0)
    if named == "each":
        found = [m.testing.finding("frozen_rank", [r], wants=[r]) for r in sorted(view.ranks)]
    else:
        found = [m.testing.finding("frozen_rank", sorted(view.ranks) if named == "all" else [0])]
    t = time.thread_time()
    coord.evidence.collect(found, view, 102.0)
    plan = time.thread_time() - t
    if named == "each":
        return {"plain": plain, "plan": plan, "commands": len(coord.dispatch.pending()), "bytes": {}, "lines": {}}
    before = os.path.getsize(path)
    send, replies = round_(102.5)
    acks = {host: [_ack(c, host) for c in cmds] for host, cmds in replies.items()}
    answer, _ = round_(103.0, acks)
    t = time.thread_time()
    coord.commands.groups(103.5)
    gather = time.thread_time() - t
    coord.journal.close()
    by_event: Counter[str] = Counter()
    lines: Counter[str] = Counter()
    with open(path, "rb") as fh:
        fh.seek(before)
        for line in fh:
            ev = line[line.find(b'"event":') :][:60].split(b'"')[3].decode()
            by_event[ev] += len(line)
            lines[ev] += 1
    return {
        "plain": plain,
        "plan": plan,
        "send": send,
        "answer": answer,
        "gather": gather,
        "commands": sum(len(c) for c in replies.values()),
        "bytes": dict(by_event),
        "lines": dict(lines),
    }


def _ack(cmd: dict, host: str) -> dict:
    ranks = [t["rank"] for t in (cmd.get("args") or {}).get("ranks") or ()]
    out: dict = {"id": cmd["id"], "type": cmd["type"], "ok": True}
    if cmd["type"] == "dump_stacks":
        out["stacks"] = [
            {"host": host, "rank": r, "pid": 1000 + r, "ok": True, "text": STACK, "taken_wall": 1.7e9} for r in ranks
        ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument(
        "--named",
        choices=("all", "one", "each"),
        default="all",
        help="one finding naming every rank or rank 0, or one per rank",
    )
    ap.add_argument("--compare-with", metavar="DIR", help="another checkout, run on the same inputs first")
    args = ap.parse_args()
    trees = ([("baseline", args.compare_with)] if args.compare_with else []) + [("this tree", None)]
    print(f"ranks {args.ranks}  hosts {args.ranks // PER_HOST}  finding names {args.named}")
    print(
        f"{'tree':<10} {'plain s':>8} {'plan s':>7} {'send s':>7} {'answer s':>8} {'gather s':>8} {'cmds':>6}  journal MB by event"
    )
    for label, root in trees:
        with tempfile.TemporaryDirectory() as tmp:
            r = run(_modules(root), args.ranks, args.named, tmp)
        mb = "  ".join(
            f"{ev} {b / 1e6:.1f} ({r['lines'][ev]})" for ev, b in sorted(r["bytes"].items(), key=lambda x: -x[1])
        )
        print(
            f"{label:<10} {r['plain']:8.2f} {r['plan']:7.2f} {r.get('send', 0):7.2f} {r.get('answer', 0):8.2f} "
            f"{r.get('gather', 0):8.2f} "
            f"{r['commands']:6d}  {sum(r['bytes'].values()) / 1e6:.1f} MB: {mb}"
        )
    print("(CPU seconds on the calling thread for a round of one report per host; plain: no commands)")


if __name__ == "__main__":
    main()
