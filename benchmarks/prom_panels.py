"""Dashboard query time at scale: a real Prometheus scraping a simulated host set.

    python benchmarks/prom_panels.py [--hosts 128] [--ranks-per-host 8] [--json]

For each per-rank detail (``--metrics.rank-detail`` full, then summary) it starts
one fake agent per host, each exporting the real agent's metric families through
the agent's own code (``rankmetrics.RanksCollector`` and ``AcceleratorCollector``
behind the agent's ``Exporter`` and HTTP ``Server``) from simulated slot data,
plus one fake coordinator (its real ``CoordinatorMetrics``, values set by
hand), then a real Prometheus (Debian's, loopback, temp dir) with every rule file
of deploy/prometheus/rules/. After ``--warmup-seconds`` of scrapes it runs every
panel target of both dashboards through the HTTP API as Grafana would (range
targets with ``/api/v1/query_range`` over the last ``--range-seconds`` at
``--step-seconds``, instant ones with ``/api/v1/query``), ``--repeats`` times, and
prints per target: wall ms p50/max (client side, JSON included), series
returned, and the samples Prometheus read (``stats=all``); then the head series,
samples per scrape round, rule evaluation time, and the targets that read raw
per-rank series and took longer than ``--slow-ms``.

The job: synchronous data parallel, 0.5 s steps; rank 1's compute is 1.15x the
others' (a straggler), every other rank's differs by up to ±2%. Variables: the
job dashboard with every host ($host = .*), the rank dashboard with the first
host and its ranks. $__rate_interval as Grafana computes it from the step and
the scrape interval.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from prometheus_client import CollectorRegistry  # noqa: E402
from promserver import Prometheus  # noqa: E402  (the tests' runner: one way to start Prometheus)

from watchdog import logs  # noqa: E402
from watchdog.agent import testing  # noqa: E402
from watchdog.agent.export.accelmetrics import AcceleratorCollector  # noqa: E402
from watchdog.agent.export.exporter import Exporter  # noqa: E402
from watchdog.agent.export.nvml import Accelerators  # noqa: E402
from watchdog.agent.export.rankmetrics import DETAILS, RanksCollector  # noqa: E402
from watchdog.agent.processes.table import ProcSample  # noqa: E402
from watchdog.agent.server import Server  # noqa: E402
from watchdog.agent.slotfiles import slot_states  # noqa: E402
from watchdog.agent.slotfiles.local_rank import LocalRank  # noqa: E402
from watchdog.contracts import slot as wire  # noqa: E402
from watchdog.coordinator import metrics as cm  # noqa: E402

JOB = "promscale"
DASHBOARDS = ("rank-watchdog-job.json", "rank-watchdog-rank.json")
RULES = sorted((REPO / "deploy" / "prometheus" / "rules").glob("*.rules.yml"))
PER_RANK = re.compile(r"\b(watchdog_rank_\w+|watchdog_coordinator_straggler_score|rank:watchdog_\w+)\b")
S = 1_000_000_000


@dataclasses.dataclass(frozen=True)
class SimJob:
    """Step k of every rank starts at t0 + k x step: data wait, compute, then the
    all-reduce, in which each rank waits for the slowest one's compute."""

    hosts: int
    per_host: int
    t0_ns: int
    data_s: float = 0.02
    compute_s: float = 0.36
    comm_s: float = 0.1
    straggler: int = 1
    factor: float = 1.15

    @property
    def world(self) -> int:
        return self.hosts * self.per_host

    def compute(self, rank: int) -> float:
        if rank == self.straggler:
            return self.compute_s * self.factor
        return self.compute_s * (1 + 0.02 * ((rank * 7919) % 101 - 50) / 50)

    @property
    def step_s(self) -> float:  # the slowest rank's compute plus the all-reduce itself
        return self.data_s + self.compute_s * max(self.factor, 1.02) + self.comm_s


class SimHost:
    """One host's ranks as the agent's tracker would hand them to the collectors."""

    def __init__(self, job: SimJob, index: int) -> None:
        self.job, self.name = job, f"node{index:04d}"
        self.ranks = []
        for lr in range(job.per_host):
            r = index * job.per_host + lr
            ident = testing.identity(JOB, r, job.world, pid=10_000 + r, proc_start_us=1, local_rank=lr, host=self.name)
            words = {wire.H_PG_STATE: int(wire.PgState.JOINED), wire.H_PHASE: int(wire.Phase.TRAIN)}
            snap = testing.snapshot(ident, words, path=f"/run/{r}.slot")
            self.ranks.append((r, snap.path, snap.header))
        self.gpus = [
            {
                "name": b"Simulated H100",
                "uuid": f"GPU-{self.name}-{g}",
                "util": 90 + g % 7,
                "mem_util": 40,
                "mem_used": 60 << 30,
                "mem_total": 80 << 30,
                "temp": 60,
                "power_mw": 500_000,
                "sm_mhz": 1980,
                "throttle": 0,
                "pids": [10_000 + index * job.per_host + g],
            }
            for g in range(job.per_host)
        ]

    def views(self, now_ns: int | None = None) -> list[LocalRank]:
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        j = self.job
        step_ns = int(j.step_s * S)
        k = max(0, (now_ns - j.t0_ns) // step_ns)
        start = j.t0_ns + k * step_ns
        out = []
        for r, path, header in self.ranks:
            comp = int(j.compute(r) * S)
            data, coll = int(j.data_s * S), step_ns - int(j.data_s * S) - comp
            w = list(header.words)
            w[wire.H_STEP], w[wire.H_STEP_START_NS] = k, start
            w[wire.H_LAST_STEP_NS], w[wire.H_LAST_DATA_NS], w[wire.H_LAST_COLL_NS] = step_ns, data, coll
            w[wire.H_TOTAL_STEP_NS], w[wire.H_TOTAL_DATA_NS], w[wire.H_TOTAL_COLL_NS] = k * step_ns, k * data, k * coll
            w[wire.H_COLL_SEQ], w[wire.H_TOTAL_COLL_BYTES] = k, k * (100 << 20)
            in_coll = now_ns - start > data + comp
            w[wire.H_COLL_OUTSTANDING], w[wire.H_COLL_ENTER_NS] = int(in_coll), start + data + comp
            hb = now_ns - (now_ns % (S // 2))
            w[wire.H_HEARTBEAT_NS] = hb
            h = dataclasses.replace(header, words=tuple(w))
            out.append(
                LocalRank(path, h, hb, False, ProcSample(True, "running", 100.0, 8 << 30), slot_states.ALIVE, 0.0, ())
            )
        return out


def start_agents(job: SimJob, detail: str) -> list[Server]:
    servers = []
    for i in range(job.hosts):
        host = SimHost(job, i)
        reg = CollectorRegistry(auto_describe=False)
        acc = Accelerators(testing.FakeNvml(host.gpus))
        reg.register(
            Exporter(
                [
                    RanksCollector(host.views, host.name, detail=detail),
                    AcceleratorCollector(acc, host.name, ranks=host.views),
                ]
            )
        )
        srv = Server(("127.0.0.1", 0), reg)
        srv.start()
        servers.append(srv)
    return servers


def start_coordinator(job: SimJob, stop: threading.Event) -> Server:
    reg = CollectorRegistry(auto_describe=False)
    m = cm.CoordinatorMetrics(reg)
    m.info.labels(JOB).set(1)
    scores = {str(r): job.compute(r) / job.compute_s for r in range(job.world)}
    m.set_detector_gauges({cm.STRAGGLER_SCORE: scores, cm.HANG_SECONDS: 0.3, cm.HANG_DEADLINE_SECONDS: 120.0})
    m.bottleneck.labels("compute").set(1)
    m.goodput_ratio.set(0.9)

    def advance() -> None:  # the counters a rate() reads must move
        while not stop.wait(1.0):
            m.goodput_seconds.labels("productive").inc(0.9)
            m.goodput_seconds.labels("data_wait").inc(0.1)

    threading.Thread(target=advance, daemon=True, name="coordinator-counters").start()
    srv = Server(("127.0.0.1", 0), reg)
    srv.start()
    return srv


def dashboards(rev: str = "") -> dict[str, dict]:
    """The committed dashboards, or those of git revision ``rev`` (a baseline)."""
    out = {}
    for name in DASHBOARDS:
        path = REPO / "grafana" / "dashboards" / name
        if rev:
            text = subprocess.run(
                ["git", "show", f"{rev}:{path.relative_to(REPO)}"], cwd=REPO, capture_output=True, text=True, check=True
            ).stdout
        else:
            text = path.read_text()
        out[name] = json.loads(text)
    return out


def targets(hosts: list[str], step_s: float, scrape_s: float, baseline: str = "") -> list[dict]:
    """Every panel target of both dashboards with Grafana's variables filled in
    (then the baseline revision's, titled with the revision)."""
    rate = f"{round(max(step_s + scrape_s, 4 * scrape_s))}s"
    out = []
    sets = [("", dashboards())] + ([(f"{baseline} ", dashboards(baseline))] if baseline else [])
    for prefix, name, doc in ((pre, n, d) for pre, docs in sets for n, d in docs.items()):
        values = {
            "cluster": ".*",
            "namespace": ".*",
            "training_job": JOB,
            "host": ".*" if name.endswith("job.json") else hosts[0],
            "rank": ".*",
        }
        for p in doc["panels"]:
            for t in p["targets"]:
                expr = t["expr"].replace("$__rate_interval", rate)
                expr = re.sub(r"\$(\w+)", lambda m, v=values: v[m.group(1)], expr)
                title = f"{prefix}{name.split('-')[-1][:-5]}: {p['title']}" + (
                    f" [{t['refId']}]" if len(p["targets"]) > 1 else ""
                )
                out.append({"title": title, "expr": expr, "instant": bool(t.get("instant")), "raw": t["expr"]})
    return out


def api(prom: Prometheus, path: str, params: dict) -> dict:
    url = f"{prom.url}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=120) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{path} {params}: {body}")
    return body["data"]


def time_target(prom: Prometheus, t: dict, end: float, range_s: float, step_s: float, repeats: int) -> dict:
    if t["instant"]:
        path, params = "/api/v1/query", {"query": t["expr"], "time": end, "stats": "all"}
    else:
        path = "/api/v1/query_range"
        params = {"query": t["expr"], "start": end - range_s, "end": end, "step": step_s, "stats": "all"}
    ms, data = [], {}
    for _ in range(repeats):
        t0 = time.perf_counter()
        data = api(prom, path, params)
        ms.append((time.perf_counter() - t0) * 1000)
    samples = (data.get("stats") or {}).get("samples", {}).get("totalQueryableSamples")
    return {
        "title": t["title"],
        "p50_ms": statistics.median(ms),
        "max_ms": max(ms),
        "series": len(data["result"]),
        "samples": samples,
        "per_rank": bool(PER_RANK.search(t["raw"])),
    }


def wait_ready(prom: Prometheus, n_targets: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # Every target scraped at least once (a loaded machine may miss a scrape now and then).
        up = api(prom, "/api/v1/query", {"query": "count(max_over_time(up[5m]) == 1)"})["result"]
        rule = api(prom, "/api/v1/query", {"query": "job:watchdog_host_steps:rate1m"})["result"]
        if up and float(up[0]["value"][1]) == n_targets and rule:
            return
        time.sleep(0.5)
    raise RuntimeError(f"Prometheus did not scrape all {n_targets} targets and evaluate the rules in {timeout_s} s")


def run_detail(args, detail: str, work: Path) -> dict:
    job = SimJob(args.hosts, args.ranks_per_host, time.monotonic_ns())
    stop = threading.Event()
    servers: list[Server] = []
    prom = None
    try:
        servers = start_agents(job, detail)
        servers.append(start_coordinator(job, stop))
        prom = Prometheus(work, [s.address for s in servers], scrape_interval_s=args.scrape_seconds, rule_files=RULES)
        prom.start()
        wait_ready(prom, len(servers), 60 + args.hosts)
        time.sleep(args.warmup_seconds)
        end = time.time()
        rows = [
            time_target(prom, t, end, args.range_seconds, args.step_seconds, args.repeats)
            for t in targets([f"node{0:04d}"], args.step_seconds, args.scrape_seconds, args.baseline)
        ]
        head = api(prom, "/api/v1/status/tsdb", {})["headStats"]["numSeries"]
        scraped = api(prom, "/api/v1/query", {"query": "sum(max_over_time(scrape_samples_scraped[1m]))"})["result"]
        window = f"{round(args.range_seconds)}s"
        ok = api(prom, "/api/v1/query", {"query": f"avg(avg_over_time(up[{window}]))"})["result"]
        took = api(
            prom, "/api/v1/query", {"query": f"quantile(0.5, avg_over_time(scrape_duration_seconds[{window}]))"}
        )["result"]
        groups = api(prom, "/api/v1/rules", {"type": "record"})["groups"]
        return {
            "detail": detail,
            "ranks": job.world,
            "hosts": job.hosts,
            "head_series": head,
            "samples_per_scrape": int(float(scraped[0]["value"][1])) if scraped else 0,
            "scrapes_ok": float(ok[0]["value"][1]) if ok else 0.0,
            "scrape_ms_p50": 1000 * float(took[0]["value"][1]) if took else 0.0,
            "rule_eval_ms": {g["name"]: round(g["evaluationTime"] * 1000, 2) for g in groups},
            "rows": rows,
        }
    finally:
        stop.set()
        if prom is not None:
            prom.stop()
        with ThreadPoolExecutor(32) as pool:  # each stop waits out its serve_forever poll (0.5 s)
            list(pool.map(lambda s: s.stop(), servers))


def print_tables(results: list[dict], slow_ms: float) -> None:
    by = {r["detail"]: r for r in results}
    details = list(by)
    head = "".join(f"  {d:>7} p50  max ms  series  samples" for d in details)
    print(f"{'panel target':<72}{head}")
    for i, row in enumerate(results[0]["rows"]):
        cells = ""
        for d in details:
            x = by[d]["rows"][i]
            smp = "-" if x["samples"] is None else str(x["samples"])
            cells += f"  {x['p50_ms']:11.1f} {x['max_ms']:7.1f} {x['series']:7d} {smp:>8}"
        print(f"{row['title'][:71]:<72}{cells}")
    for d in details:
        r = by[d]
        total = sum(x["p50_ms"] for x in r["rows"])
        print(
            f"\n{d}: {r['ranks']} ranks on {r['hosts']} hosts, {r['head_series']} head series, "
            f"{r['samples_per_scrape']} samples per scrape round, {100 * r['scrapes_ok']:.1f}% of scrapes "
            f"succeeded (p50 {r['scrape_ms_p50']:.0f} ms), all targets {total:.0f} ms (sum of p50), "
            f"rule groups (ms per evaluation): {r['rule_eval_ms']}"
        )
        groups: dict[str, list[dict]] = {}
        for x in r["rows"]:
            groups.setdefault(x["title"].split(":")[0], []).append(x)
        for g, xs in groups.items():
            print(
                f"  {g + ' dashboard:':<22} {sum(x['p50_ms'] for x in xs):8.0f} ms  "
                f"{sum(x['series'] for x in xs):6d} series  {sum(x['samples'] or 0 for x in xs):9d} samples  "
                f"(all targets once, sum of p50)"
            )
        slow = sorted((x for x in r["rows"] if x["per_rank"] and x["p50_ms"] > slow_ms), key=lambda x: -x["p50_ms"])
        print(f"  targets reading raw per-rank series slower than {slow_ms:g} ms: " + ("none" if not slow else ""))
        for x in slow:
            print(f"    {x['p50_ms']:8.1f} ms  {x['samples']} samples  {x['title']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--ranks-per-host", type=int, default=8)
    ap.add_argument("--details", default=",".join(DETAILS), help="comma-separated: full,summary")
    # 128 simulated agents render in this one process: 5 s keeps them inside the scrape
    # timeout on a shared 2-core machine (each /metrics at full detail costs ~6 ms of CPU).
    ap.add_argument("--scrape-seconds", type=float, default=5.0)
    ap.add_argument("--warmup-seconds", type=float, default=150.0, help="scraping before the queries run")
    ap.add_argument("--range-seconds", type=float, default=150.0)
    ap.add_argument("--step-seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slow-ms", type=float, default=50.0)
    ap.add_argument("--baseline", default="", help="also time the dashboards of this git revision (e.g. main)")
    ap.add_argument("--json", action="store_true", help="one JSON object per detail instead of the tables")
    args = ap.parse_args(argv)
    logs.configure("warning")  # 129 servers saying "listening" would bury the table
    if Prometheus.binary() is None:
        print("prometheus not found (Debian's prometheus: bash .ci/setup)", file=sys.stderr)
        return 2
    results = []
    for detail in args.details.split(","):
        with tempfile.TemporaryDirectory(prefix=f"prom-panels-{detail}-") as tmp:
            results.append(run_detail(args, detail, Path(tmp)))
    if args.json:
        for r in results:
            print(json.dumps(r))
    else:
        print_tables(results, args.slow_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
