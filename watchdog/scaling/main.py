"""``watchdog scaling JOURNAL...``: the measured scaling curve of one job from
the coordinator journals of its runs at 1, 2, 4, ... workers.

    watchdog scaling run1.jsonl run2.jsonl run4.jsonl                  # table
    watchdog scaling *.jsonl --html scaling.html --png scaling.png      # and the plot
    watchdog scaling *.jsonl --strong --threshold 0.8                   # fixed global batch
    watchdog scaling --prometheus http://prom:9090 run1 run2 run4       # training jobs, from Prometheus

Each run's step split comes from its journal's last goodput record, or with
``--prometheus`` from the series the agents export for each training job over
``--window-seconds`` (ending at ``--at``, default now; watchdog/scaling/prom.py);
runs at the same world size are combined by median.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import promquery
from ..timeline.main import write_whole
from . import render
from .prom import read_prometheus
from .runs import RunError, read_run, table


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="watchdog scaling", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "journals",
        nargs="+",
        metavar="RUN",
        help="coordinator journals, one per run (with --prometheus: training jobs)",
    )
    p.add_argument("--prometheus", metavar="URL", help="read the runs from this Prometheus instead of journals")
    p.add_argument(
        "--window-seconds", type=float, default=3600.0, help="with --prometheus: the window read (default 3600)"
    )
    p.add_argument("--at", type=float, metavar="EPOCH_S", help="with --prometheus: the window's end (default now)")
    p.add_argument("--timeout-seconds", type=float, default=10.0, help="with --prometheus: HTTP timeout (default 10)")
    for f in promquery.FLAGS:  # the same flags as `watchdog hosts`
        p.add_argument(f"--{f.name}", dest=f.dest, default="", help=f"with --prometheus: {f.help}")
    p.add_argument("--threshold", type=float, default=0.8, help="efficiency below this is flagged (default 0.8)")
    p.add_argument("--strong", action="store_true", help="the runs kept the global batch (default: the per-rank batch)")
    p.add_argument("--html", metavar="OUT.html", help="write a self-contained HTML page with the plots")
    p.add_argument("--png", metavar="OUT.png", help="write the plots as PNG (needs matplotlib: rank-watchdog[plot])")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table instead of the text one")
    return p


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if not 0 < args.threshold <= 1:
        p.error("--threshold must be in (0, 1]")
    if not (args.window_seconds > 0 and args.timeout_seconds > 0):
        p.error("--window-seconds and --timeout-seconds must be > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    try:
        if args.prometheus:
            prom = promquery.endpoint(args.prometheus, vars(args))
            runs = [
                read_prometheus(prom, job, args.window_seconds, args.at, args.timeout_seconds) for job in args.journals
            ]
        else:
            runs = [read_run(p) for p in args.journals]
    except (RunError, promquery.PromError) as exc:
        print(f"watchdog scaling: {exc}", file=sys.stderr)
        return 2
    rows = table(runs, strong=args.strong)
    sys.stdout.write(
        render.markdown(rows, args.threshold) if args.markdown else render.text(rows, args.threshold, args.strong)
    )
    if args.html:
        write_whole(args.html, render.html_page(rows, args.threshold, args.strong, [r.path for r in runs]))
        print(f"wrote {args.html}", file=sys.stderr)
    if args.png:
        try:
            render.png(rows, args.threshold, args.png)
        except ImportError:
            print("watchdog scaling: --png needs matplotlib (pip install 'rank-watchdog[plot]')", file=sys.stderr)
            return 2
        print(f"wrote {args.png}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
