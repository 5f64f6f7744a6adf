"""Every rank's stack at scale: what one host's dump costs, how big the grouped
journal record stays, how fast the report renders.

    python benchmarks/stacks_scale.py [--ranks 1024 16384] [--dump-ranks 8] [--no-browser]

1. Dump time per host: N real Python processes (one SIGSTOPped, dumped
   ``--nonblocking``) dumped by the agent's own code (``dumpall`` + ``StackDumper``,
   real py-spy), one at a time and ``--stacks.parallel`` at a time, against the
   host deadline.
2. Simulated hangs of 1,024 and 16,384 ranks (8 per host; one rank in its data
   loader, one in a checkpoint write, the rest in the all-reduce under backward):
   journal size, the ``stack_groups`` record's size, load / text / HTML / folded
   times, and the HTML's render time in headless Chromium, measured inside the
   page (navigation start -> load handler after a forced layout; the figure
   to compare with the 2 s bound) and as browser wall time next to an empty
   page's (start-up and exit included; noisy on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from watchdog import stackgroups  # noqa: E402
from watchdog.agent.command_channel import dumpall  # noqa: E402
from watchdog.agent.command_channel.stacks import StackDumper, find_py_spy, proc_state  # noqa: E402
from watchdog.timeline import html, load, stacksets, testing, text  # noqa: E402

# With torch imported, like a rank: py-spy's cost grows with the process's memory maps and threads.
SLEEPER = (
    "import sys, time\nif 'torch' in sys.argv: import torch\n"
    "def stuck_in_named_function():\n    time.sleep(600)\nstuck_in_named_function()\n"
)
TIMING = (
    "<script>addEventListener('load',()=>{document.body.offsetHeight;"
    "document.documentElement.setAttribute('data-rendered-ms',String(performance.now()))});</script>"
)


def dump_host(n: int, parallel: int, deadline_s: float, torch: bool) -> dict:
    py_spy = find_py_spy()
    if not py_spy:
        return {"error": "py-spy not installed"}
    procs = [subprocess.Popen([sys.executable, "-c", SLEEPER] + (["torch"] if torch else [])) for _ in range(n)]
    try:
        time.sleep(8.0 if torch else 1.0)  # let them reach the sleep
        os.kill(procs[0].pid, signal.SIGSTOP)
        while proc_state(procs[0].pid) not in ("T", "t"):
            time.sleep(0.01)
        dumper = StackDumper(py_spy)

        def job(pid: int):
            return lambda left: dumper.dump("h", pid, pid, timeout_s=left)

        out = dumpall.run([job(p.pid) for p in procs], lambda i, why: None, parallel=parallel, deadline_s=deadline_s)
        ok = sum(1 for d in out.results if d is not None and d.ok)
        per = [d.duration_s for d in out.results if d is not None]
        return {
            "ranks": n,
            "parallel": parallel,
            "deadline_s": deadline_s,
            "wall_s": out.duration_s,
            "ok": ok,
            "late": len(out.late),
            "per_dump_median_s": round(statistics.median(per), 3),
        }
    finally:
        for p in procs:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait()


def browser(page: Path) -> tuple[float | None, float]:
    """(in-page ms to load + layout, browser wall seconds)."""
    import headless

    t = time.perf_counter()
    dom, _ = headless.dump_dom(page)
    wall = time.perf_counter() - t
    m = re.search(r'data-rendered-ms="([0-9.]+)"', dom)
    return (float(m.group(1)) if m else None), wall


def scale(ranks: int, work: Path, use_browser: bool, empty_wall: float) -> dict:
    path = testing.hang_journal(work / f"hang-{ranks}.jsonl", ranks)
    rec = next(line for line in path.read_text().splitlines() if '"event":"stack_groups"' in line)
    t = time.perf_counter()
    tl = load.load(str(path))
    t_load = time.perf_counter() - t
    t = time.perf_counter()
    text.render(tl)
    t_text = time.perf_counter() - t
    t = time.perf_counter()
    page = html.render(tl)
    t_html = time.perf_counter() - t
    t = time.perf_counter()
    files = stacksets.folded_files(tl.sections)
    t_fold = time.perf_counter() - t
    sset = tl.sections[0].stack_sets[0]
    row = {
        "ranks": ranks,
        "hosts": ranks // 8,
        "journal_MB": round(path.stat().st_size / 1e6, 1),
        "stack_groups_record_B": len(rec),
        "groups": len(sset.grouping.groups),
        "odd_ones_out": stackgroups.Grouping.from_dict(json.loads(rec)).summary()[:60] + "...",
        "load_s": round(t_load, 2),
        "text_s": round(t_text, 3),
        "html_s": round(t_html, 3),
        "html_KB": len(page) // 1000,
        "folded_B": len(files[0][1]),
        "folded_s": round(t_fold, 4),
    }
    if use_browser:
        out = work / f"hang-{ranks}.html"
        out.write_text(page.replace("<head>", "<head>" + TIMING, 1))
        runs = [browser(out) for _ in range(3)]
        in_page = [r[0] for r in runs if r[0] is not None]
        row["chromium_in_page_ms"] = round(statistics.median(in_page)) if in_page else None
        row["chromium_wall_s"] = round(statistics.median(r[1] for r in runs), 2)
        row["empty_page_wall_s"] = round(empty_wall, 2)  # browser start-up and exit, for comparison
    return row


def table(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    widths = {k: max(len(k), *(len(str(r.get(k, ""))) for r in rows)) for k in keys}
    lines = ["  ".join(k.ljust(widths[k]) for k in keys)]
    lines += ["  ".join(str(r.get(k, "")).ljust(widths[k]) for k in keys) for r in rows]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[1024, 16384])
    p.add_argument("--dump-ranks", type=int, default=8, help="real processes dumped as one host")
    p.add_argument("--no-browser", action="store_true")
    p.add_argument("--no-torch", action="store_true", help="dump bare Python sleepers instead of torch processes")
    args = p.parse_args()
    print("dump time per host (real py-spy, one rank SIGSTOPped -> --nonblocking):")
    torch = not args.no_torch
    print(
        table(
            [
                dump_host(args.dump_ranks, par, dumpall.HOST_DEADLINE_S, torch)
                for par in (dumpall.PARALLEL, 1, dumpall.PARALLEL, 1)
            ]
        )
    )
    print("(each setting twice, alternating: the first dumps of a torch process also warm the page cache)")
    use_browser = not args.no_browser
    if use_browser:
        import headless

        use_browser = headless.chromium() is not None
    with tempfile.TemporaryDirectory(prefix="wd-stacks-") as tmp:
        work = Path(tmp)
        empty_wall = 0.0
        if use_browser:
            (work / "empty.html").write_text("<!doctype html><html><head>" + TIMING + "</head><body>x</body></html>")
            empty_wall = statistics.median(browser(work / "empty.html")[1] for _ in range(3))
        print("\nsimulated hangs (8 ranks per host):")
        print(table([scale(n, work, use_browser, empty_wall) for n in args.ranks]))
        if not use_browser:
            print("(no chromium: render times in the browser not measured)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
