"""``watchdog timeline JOURNAL``: the post-mortem of a job from its coordinator journal.

    watchdog timeline journal.jsonl                  # text: root cause first (default)
    watchdog timeline journal.jsonl --html out.html  # self-contained swim-lane report
    watchdog timeline journal.jsonl --perfetto out.json   # ui.perfetto.dev / chrome://tracing
    watchdog timeline journal.jsonl --stacks DIR     # every rank's stacks per hang, collapsed (flame graphs)
    watchdog timeline journal.jsonl --fr-dump DIR    # Flight Recorder files for PyTorch's analyzer (fr_trace)

The journal may end in a line torn by a kill, and may hold several coordinator
runs and worker restarts: each is its own section.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from watchdog.contracts.journal import parse, reader

from . import flight_recorder, html, load, perfetto, stacksets, text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="watchdog timeline", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("journal", help="the coordinator's JSONL journal")
    p.add_argument("--html", metavar="OUT.html", help="write the self-contained HTML report here")
    p.add_argument("--perfetto", metavar="OUT.json", help="write Chrome trace event JSON here")
    p.add_argument(
        "--stacks",
        metavar="DIR",
        help="write every rank's stacks, one collapsed-stack file per hang "
        "('frame;frame;frame count': speedscope, flamegraph.pl, inferno) into this directory",
    )
    p.add_argument(
        "--fr-dump",
        metavar="DIR",
        help="write the ranks' Flight Recorder dumps, one directory per fault, as the per-rank files PyTorch's "
        f"analyzer reads (python -m torch.distributed.flight_recorder.fr_trace DIR/01-... -p {flight_recorder.PREFIX})",
    )
    p.add_argument(
        "--text",
        action="store_true",
        help="print the text report (the default without --html/--perfetto/--stacks/--fr-dump)",
    )
    p.add_argument("--steps", type=int, default=20, help="steps per rank shown in the HTML lanes (default 20)")
    p.add_argument("--text-steps", type=int, default=5, help="steps averaged per rank in the text table (default 5)")
    p.add_argument("--max-ranks", type=int, default=64, help="ranks drawn as lanes / listed in full (default 64)")
    return p


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.steps < 1 or args.text_steps < 1 or args.max_ranks < 1:
        p.error("--steps, --text-steps and --max-ranks must be >= 1")
    return args


def write_whole(path: str, data: str) -> None:
    """Whole or nothing: a report half-written over an older one misleads."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(data)
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    try:
        tl = load.load(args.journal)
    except OSError as exc:
        print(f"watchdog timeline: cannot read {args.journal}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if args.html:
        write_whole(args.html, html.render(tl, steps=args.steps, max_lanes=args.max_ranks))
        print(f"wrote {args.html}", file=sys.stderr)
    if args.perfetto:
        write_whole(args.perfetto, json.dumps(perfetto.render(tl), separators=(",", ":")))
        print(f"wrote {args.perfetto} (open it in https://ui.perfetto.dev or chrome://tracing)", file=sys.stderr)
    if args.stacks:
        files = stacksets.folded_files(tl.sections)
        try:
            os.makedirs(args.stacks, exist_ok=True)
            for name, data in files:
                write_whole(os.path.join(args.stacks, name), data)
                print(f"wrote {os.path.join(args.stacks, name)}", file=sys.stderr)
        except OSError as exc:
            print(f"watchdog timeline: cannot write {args.stacks}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        if not files:
            print("no stacks in the journal: nothing written", file=sys.stderr)
    fr_sets = flight_recorder.collect(parse(d) for d in reader.read(args.journal))
    if args.fr_dump:
        try:
            dirs = flight_recorder.write_dirs(fr_sets, args.fr_dump)
        except OSError as exc:
            print(f"watchdog timeline: cannot write {args.fr_dump}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        for d in dirs:
            print(
                f"wrote {d} (python -m torch.distributed.flight_recorder.fr_trace {d} -p {flight_recorder.PREFIX})",
                file=sys.stderr,
            )
        if not dirs:
            print("no Flight Recorder dumps in the journal: nothing written", file=sys.stderr)
    if args.text or not (args.html or args.perfetto or args.stacks or args.fr_dump):
        sys.stdout.write(text.render(tl, steps=args.text_steps, max_ranks=args.max_ranks))
        if fr_sets:
            sys.stdout.write("\n" + "\n".join(flight_recorder.lines(fr_sets)) + "\n")
    return 0 if tl.sections else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
