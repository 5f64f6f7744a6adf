"""Scale benchmark: a real coordinator process on loopback under N simulated
agents (8 ranks each) that speak the real report protocol, one kept-alive
connection per agent, start-up jitter, and the reply's back-off honoured.

    python benchmarks/scale.py [--ranks 256,1024,4096,16384] [--procs 3] [--core 1] [--replay]

Per size: one straggler (1.1x compute from step 0) and, once the straggler had
time to show, one frozen rank (heartbeat stops, never enters the next
all-reduce, so all others wait in it). Prints one table: coordinator CPU
(share of one core over the steady window), RSS, report latency p50/p99 (as
the agents saw it), tick duration p50/p99, how many ticks took over 250 ms,
and the tick thread's own CPU p50/p99 (from the coordinator's histograms,
interpolated like Prometheus' histogram_quantile), hang and frozen-rank
detection latency, whether every finding after the freeze named only the
frozen rank, the straggler's detection (in steps from the job's start), any
false finding, /metrics size and scrape time, and the mean bytes per report.
The coordinator is pinned with ``taskset`` to ``--core`` when available; the
generator processes run on the other cores.

The simulated agents make each report when it is due, as agents do; at 16,384
ranks that takes a core of its own (~0.5 ms a report). ``--replay`` makes
every report first and sends each on time (``scalereplay.py``; its columns
``late p99 ms`` and ``unlike`` say whether the replay held), so the run
measures the coordinator where the generator could not keep up live.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import queue
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scalehttp
import scalereplay
import scalesim

# -- generator (runs in worker processes) ------------------------------------------


async def _agent(
    host: scalesim.Host,
    addr: tuple[str, int],
    interval: float,
    t_end: float,
    window: tuple[float, float],
    out: dict,
) -> None:
    await asyncio.sleep(random.uniform(0, interval))  # start-up jitter, as the real agent does
    link = scalehttp.Link(addr)
    await link.open()
    next_at = time.time()
    # The interval in effect, stated in each report as the real agent does (agent/reporting/sender.py:
    # its own, or the longer one the coordinator advised): stating its own while following
    # the advice made the hosts look short of reports, a deficit of the advice's own making
    # that the coordinator added to every silence limit and kept advising for.
    stated = interval
    try:
        while True:
            now = time.time()
            if now >= t_end:
                return
            rep = host.report(now, stated)
            body = scalehttp.dumps(rep)
            ok, reply, lat = await link.post(body)
            if not ok:
                out["errors"] += 1
            else:
                host.delivered(rep, reply)
            if window[0] <= now < window[1]:
                out["lat"].append(lat)
                out["bytes"].append(len(body))
            # Back-pressure: the coordinator may ask for a longer interval.
            step = scalehttp.asked_interval(reply, interval)
            if step > interval:
                out["slowed"] += 1
            stated = step
            next_at = max(next_at + step, time.time())
            await asyncio.sleep(next_at - time.time())
    finally:
        link.close()


def _worker(
    job: scalesim.Job,
    hosts: list[int],
    addr: tuple[str, int],
    interval: float,
    t_end: float,
    window: tuple[float, float],
    q: mp.Queue,
    wanted: int = 2,
    summaries: bool = True,
) -> None:
    out: dict = {"lat": [], "bytes": [], "errors": 0, "slowed": 0}

    async def main() -> None:
        sims = [scalesim.Host(job, i, f"agent-{i}-{os.getpid()}", summaries, wanted) for i in hosts]
        res = await asyncio.gather(
            *(_agent(h, addr, interval, t_end, window, out) for h in sims), return_exceptions=True
        )
        out["errors"] += sum(1 for r in res if isinstance(r, BaseException))

    asyncio.run(main())
    q.put(("done", out))


# -- measurement ---------------------------------------------------------------------


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _series(exposition: bytes) -> list[str]:
    """The metric name of each series (sample line) in a text exposition."""
    lines = exposition.decode().splitlines()
    return [line.split("{", 1)[0].split(" ", 1)[0] for line in lines if line and not line.startswith("#")]


def _scrape(url: str) -> tuple[bytes, float]:
    """(body, seconds); (b"", nan) when the coordinator did not answer in 30 s."""
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
            body = r.read()
    except OSError:
        return b"", float("nan")
    return body, time.perf_counter() - t


def _buckets(text: str, name: str) -> dict[float, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="')[1].split('"')[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def _hist_quantile(q: float, before: dict, after: dict) -> float:
    """Prometheus' histogram_quantile over the increase between two scrapes."""
    les = sorted(after)
    counts = [after[le] - before.get(le, 0.0) for le in les]
    total = counts[-1] if counts else 0
    if total <= 0:
        return float("nan")
    rank, prev_le, prev_c = q * total, 0.0, 0.0
    for le, c in zip(les, counts):
        if c >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_c) / max(c - prev_c, 1e-9)
        prev_le, prev_c = le, c
    return prev_le


def _over(le: float, before: dict, after: dict) -> str:
    """How many of the observations between two scrapes were above ``le`` (a bucket's
    bound), of how many: at 25 ticks a p99 interpolates near its bucket's top whenever
    any tick fell in that bucket, so the count says more."""
    total = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)
    return f"{total - (after.get(le, 0.0) - before.get(le, 0.0)):.0f}/{total:.0f}"


def _job(
    n_ranks: int, t_start: float, steady_s: float, after_s: float, compute_s: float
) -> tuple[scalesim.Job, float, tuple[float, float], float]:
    """The run's job from ``t_start``: one straggler from step 0, one rank frozen
    once the straggler had time to show; (job, freeze_at, steady window, end)."""
    straggler, frozen = n_ranks // 3, (2 * n_ranks) // 3 + 1
    probe = scalesim.Job(n_ranks, t_start, compute_s=compute_s, straggler=straggler)
    # Freeze at a step's start (+ its data wait): the rank never enters that step's all-reduce.
    k = int((steady_s + 5.0) / probe.wall_s)
    freeze_at = t_start + k * probe.wall_s + probe.data_s / 2
    job = scalesim.Job(n_ranks, t_start, compute_s=compute_s, straggler=straggler, frozen=frozen, freeze_at=freeze_at)
    window = (t_start + 5.0, t_start + 5.0 + steady_s)
    return job, freeze_at, window, freeze_at + after_s


def _ready(q: mp.Queue, workers: list[mp.Process]) -> tuple:
    """The next replay worker's word that its reports are made; raises if one died first."""
    while True:
        try:
            return q.get(timeout=1.0)
        except queue.Empty:
            if not all(w.is_alive() for w in workers):
                raise RuntimeError("a replay worker exited while making its reports") from None


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q * 100) - 1] if len(xs) > 1 else (xs[0] if xs else float("nan"))


def run_size(
    n_ranks: int,
    *,
    procs: int,
    core: int | None,
    interval: float,
    steady_s: float,
    after_s: float,
    python: str,
    extra_flags: list[str],
    report_version: int = 2,
    summaries: bool = True,
    compute_s: float = scalesim.Job.compute_s,
    replay: bool = False,
) -> dict:
    tmp = tempfile.mkdtemp(prefix=f"watchdog-scale-{n_ranks}-")
    journal, addr_file = os.path.join(tmp, "journal.jsonl"), os.path.join(tmp, "addr")
    cmd = [
        python,
        "-m",
        "watchdog.cli",
        "coordinator",
        "--web.listen-address",
        "127.0.0.1:0",
        "--web.address-file",
        addr_file,
        "--job.name",
        "scale",
        "--job.world-size",
        str(n_ranks),
        "--journal",
        journal,
        "--log.level",
        "warning",
        *extra_flags,
    ]
    if core is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", str(core), *cmd]
    n_hosts = (n_ranks + scalesim.RANKS_PER_HOST - 1) // scalesim.RANKS_PER_HOST
    n_procs = max(1, min(procs, n_hosts))
    others = [c for c in range(os.cpu_count() or 1) if c != core] or None
    q: mp.Queue = mp.Queue()
    workers: list[mp.Process] = []
    coord: subprocess.Popen | None = None
    # The job's frame: the live generator's is the wall clock from now on; a replay's
    # reports are made first, in the frame of when they were made, and sent ``offset`` later.
    offset, made = 0.0, None
    try:
        if replay:
            job, freeze_at, window, t_end = _job(n_ranks, time.time(), steady_s, after_s, compute_s)
            reply = scalereplay.assumed_reply(n_hosts, interval)
            gos = [mp.Queue() for _ in range(n_procs)]
            for p, go in enumerate(gos):
                hosts = list(range(p, n_hosts, n_procs))
                args = (job, hosts, interval, t_end, window, reply, report_version, summaries, q, go)
                workers.append(mp.Process(target=scalereplay.worker, args=args, daemon=True))
                workers[-1].start()
            t_made = time.time()
            ready = [_ready(q, workers) for _ in workers]
            made = (sum(r[1] for r in ready), sum(r[2] for r in ready), time.time() - t_made)
        with open(os.path.join(tmp, "coordinator.log"), "wb") as log:
            coord = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.time() + 30
        while not os.path.exists(addr_file):
            if time.time() > deadline or coord.poll() is not None:
                raise RuntimeError(f"coordinator did not start; see {tmp}/coordinator.log")
            time.sleep(0.05)
        with open(addr_file) as fh:
            host_s, port_s = fh.read().strip().rsplit(":", 1)
        addr, url = (host_s, int(port_s)), f"http://{host_s}:{port_s}"
        if replay:
            offset = time.time() + 0.5 - job.t0
            for go in gos:
                go.put((addr, offset, others))
        else:
            job, freeze_at, window, t_end = _job(n_ranks, time.time() + 0.5, steady_s, after_s, compute_s)
            for p in range(n_procs):
                hosts = list(range(p, n_hosts, n_procs))
                args = (job, hosts, addr, interval, t_end, window, q, report_version, summaries)
                workers.append(mp.Process(target=_worker, args=args, daemon=True))
                workers[-1].start()
                if others and hasattr(os, "sched_setaffinity"):
                    os.sched_setaffinity(workers[-1].pid, others)
        time.sleep(max(0.0, window[0] + offset - time.time()))
        cpu0, m0 = _cpu_s(coord.pid), _scrape(url)[0].decode()
        time.sleep(max(0.0, window[1] + offset - time.time()))
        cpu1, m1 = _cpu_s(coord.pid), _scrape(url)[0].decode()
        cpu = (cpu1 - cpu0) / (window[1] - window[0])
        rss = _rss_mb(coord.pid)
        scrapes = [_scrape(url) for _ in range(3)]
        results = [q.get(timeout=t_end + offset - time.time() + 120)[-1] for _ in workers]
        for w in workers:
            w.join(timeout=10)
    finally:
        for w in workers:
            if w.is_alive():
                w.terminate()
        if coord is not None:
            coord.terminate()
            try:
                coord.wait(timeout=15)
            except subprocess.TimeoutExpired:
                coord.kill()
                coord.wait()
    # From here on in the job's frame: the journal's times less the offset.
    freeze_at, t_start = freeze_at + offset, job.t0 + offset
    straggler, frozen = job.straggler, job.frozen
    lat = [x for r in results for x in r["lat"]]
    nbytes = [x for r in results for x in r["bytes"]]
    late = [x for r in results for x in r.get("late", ())]
    name = "watchdog_coordinator_tick_duration_seconds"
    b0, b1 = _buckets(m0, name), _buckets(m1, name)
    cpu_name = "watchdog_coordinator_tick_cpu_seconds"  # the tick's own work, without its waits for the GIL
    c0, c1 = _buckets(m0, cpu_name), _buckets(m1, cpu_name)
    findings = [r for r in _journal(journal) if r["event"] == "finding"]
    hang = next((f for f in findings if f["kind"] == "collective_hang" and f["t_wall"] >= freeze_at), None)
    froz = next((f for f in findings if f["kind"] == "frozen_rank" and f["t_wall"] >= freeze_at), None)
    strag = next((f for f in findings if f["kind"] == "straggler"), None)
    expected = {"straggler": [straggler], "collective_hang": [frozen], "frozen_rank": [frozen]}
    false = [f for f in findings if f["ranks"] != expected.get(f["kind"])]
    after = [f for f in findings if f["t_wall"] >= freeze_at and f["kind"] != "straggler"]
    if os.environ.get("WATCHDOG_SCALE_KEEP"):  # the journal and the coordinator's log, to read why
        print(f"# kept {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "ranks": n_ranks,
        "hosts": n_hosts,
        "cpu": cpu,
        "rss_mb": rss,
        "lat_p50_ms": 1e3 * _pct(lat, 0.5),
        "lat_p99_ms": 1e3 * _pct(lat, 0.99),
        "tick_p50_ms": 1e3 * _hist_quantile(0.5, b0, b1),
        "tick_p99_ms": 1e3 * _hist_quantile(0.99, b0, b1),
        "ticks_over_250ms": _over(0.25, b0, b1),
        "tick_cpu_p50_ms": 1e3 * _hist_quantile(0.5, c0, c1),
        "tick_cpu_p99_ms": 1e3 * _hist_quantile(0.99, c0, c1),
        "reports_per_s": len(lat) / steady_s,
        "hang_s": hang["t_wall"] - freeze_at if hang else None,
        "frozen_s": froz["t_wall"] - freeze_at if froz else None,
        "culprit_ok": bool(hang) and bool(froz) and all(f["ranks"] == [frozen] for f in after),
        "straggler_steps": int((strag["t_wall"] - t_start) / job.wall_s)
        if strag and strag["ranks"] == [straggler]
        else None,
        "false": len(false),
        "metrics_kb": statistics.median(len(b) for b, _ in scrapes) / 1024,
        "series": len(_series(scrapes[0][0])),
        "created_series": sum(1 for name in _series(scrapes[0][0]) if name.endswith("_created")),
        "scrape_ms": 1e3 * statistics.median(t for _, t in scrapes),
        "bytes_per_report": statistics.mean(nbytes) if nbytes else 0.0,
        "errors": sum(r["errors"] for r in results),
        "slowed": sum(r["slowed"] for r in results),
        "false_kinds": sorted({f["kind"] for f in false}),
        # A replay's own check: how late its reports went (their ages are right only if on time).
        "late_p99_ms": 1e3 * _pct(late, 0.99) if replay else None,
        "unlike": sum(r.get("unlike", 0) for r in results) if replay else None,
        "made": made,
    }


def _journal(path: str) -> list[dict]:
    out = []
    with open(path, "rb") as fh:
        for raw in fh:
            try:
                out.append(json.loads(raw))
            except ValueError:
                pass
    return out


COLUMNS = [
    ("ranks", "ranks", "{}"),
    ("hosts", "hosts", "{}"),
    ("cpu", "CPU(core)", "{:.2f}"),
    ("rss_mb", "RSS MB", "{:.0f}"),
    ("reports_per_s", "rep/s", "{:.0f}"),
    ("lat_p50_ms", "rep p50 ms", "{:.1f}"),
    ("lat_p99_ms", "rep p99 ms", "{:.1f}"),
    ("tick_p50_ms", "tick p50 ms", "{:.1f}"),
    ("tick_p99_ms", "tick p99 ms", "{:.1f}"),
    ("ticks_over_250ms", ">250 ms", "{}"),
    ("tick_cpu_p50_ms", "tick CPU p50", "{:.1f}"),
    ("tick_cpu_p99_ms", "tick CPU p99", "{:.1f}"),
    ("hang_s", "hang s", "{:.1f}"),
    ("frozen_s", "frozen s", "{:.1f}"),
    ("culprit_ok", "culprit", "{}"),
    ("straggler_steps", "strag steps", "{}"),
    ("false", "false", "{}"),
    ("series", "series", "{}"),
    ("metrics_kb", "metrics KB", "{:.0f}"),
    ("scrape_ms", "scrape ms", "{:.1f}"),
    ("bytes_per_report", "B/report", "{:.0f}"),
    ("errors", "errors", "{}"),
    ("slowed", "slowed", "{}"),
    ("late_p99_ms", "late p99 ms", "{:.1f}"),
    ("unlike", "unlike", "{}"),
]


def table(rows: list[dict]) -> str:
    cells = [[h for _, h, _ in COLUMNS]] + [
        [
            "-" if r[k] is None else (f.format(r[k]) if not isinstance(r[k], bool) else ("yes" if r[k] else "NO"))
            for k, _, f in COLUMNS
        ]
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="256,1024,4096,16384")
    ap.add_argument("--procs", type=int, default=3, help="generator processes")
    ap.add_argument("--core", type=int, default=1, help="pin the coordinator to this core (-1: no pinning)")
    ap.add_argument("--interval", type=float, default=1.0, help="report interval per agent, seconds")
    ap.add_argument("--steady-seconds", type=float, default=25.0)
    ap.add_argument("--after-seconds", type=float, default=12.0, help="how long to run after the freeze")
    ap.add_argument("--json", action="store_true", help="print one JSON object per size too")
    ap.add_argument(
        "--report-version",
        type=int,
        choices=(1, 2),
        default=2,
        help="2: agents send version-2 reports once the coordinator's reply says it reads them (as agents do); "
        "1: agents that only speak version 1",
    )
    ap.add_argument(
        "--no-summaries",
        action="store_true",
        help="agents that send no step summaries (older agents): the coordinator computes every rank's statistics",
    )
    ap.add_argument(
        "--compute-s",
        type=float,
        default=scalesim.Job.compute_s,
        help="each rank's compute time per step, seconds (a step adds the data wait, the straggler's 1.1x and "
        "the all-reduce): the default 0.2 s makes ~4 steps a second, so each report carries ~4 step samples a "
        "rank; jobs of thousands of GPUs step every few seconds",
    )
    ap.add_argument(
        "--replay",
        action="store_true",
        help="make every report before the run, then send each on time (benchmarks/scalereplay.py): the "
        "generator's CPU out of the run, where it cannot keep 2,048 hosts a second on the cores left; "
        "replies asking for a longer interval are counted, not followed",
    )
    ap.add_argument("coordinator_flags", nargs="*", help="extra coordinator flags (after --)")
    a = ap.parse_args(argv)
    core = None if a.core < 0 or (os.cpu_count() or 1) < 2 else a.core
    print(f"# load average before: {os.getloadavg()[0]:.2f}; coordinator pinned to core {core}", flush=True)
    rows = []
    for n in [int(x) for x in a.ranks.split(",")]:
        row = run_size(
            n,
            procs=a.procs,
            core=core,
            interval=a.interval,
            steady_s=a.steady_seconds,
            after_s=a.after_seconds,
            python=sys.executable,
            extra_flags=a.coordinator_flags,
            report_version=a.report_version,
            summaries=not a.no_summaries,
            compute_s=a.compute_s,
            replay=a.replay,
        )
        if row["made"]:
            count, size, took = row["made"]
            print(f"# {n} ranks: {count:,} reports ({size / 2**20:.0f} MB) made in {took:.0f} s first", flush=True)
        rows.append(row)
        if a.json:
            print(json.dumps(row), flush=True)
    print(table(rows))
    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    return 0 if all(r["culprit_ok"] and r["false"] == 0 and not r["errors"] and not r["unlike"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
