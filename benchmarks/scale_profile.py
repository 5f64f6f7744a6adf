"""In-process profile of the coordinator at N ranks: the same simulated hosts as
``scale.py`` (``scalesim``), but folded straight into a ``Coordinator`` on a
virtual clock (no HTTP, no JSON), so the report path and the tick can be timed
and profiled without the generator or the network in the numbers.

    python benchmarks/scale_profile.py --ranks 16384 --seconds 40 [--freeze-at 30] [--profile tick|accept] [--top 25]
        [--report-version 1|2|both] [--no-summaries]

Prints the CPU per accepted report and its split (JSON decode, schema,
validate, fold: the request handler's steps, and the cyclic collector's share
of each), for version-1 and version-2 bodies of the same reports
(``--report-version``; both by default, checked equal), the tick's thread CPU
p50/p99/max over the last half of the run (and over the ticks on which a
straggler window closed: the straggler scores are recomputed then), the
findings opened with the step the straggler was named at (there must be none
but the straggler, and with ``--freeze-at`` the frozen rank), and with
``--profile`` the top functions by own time, and the process's max RSS. CPU is
``time.thread_time()``: the machine's other load does not count.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import math
import os
import pstats
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baseline_tree
import scalesim

from watchdog.contracts.report import typed as typedbody
from watchdog.coordinator.config import Config
from watchdog.coordinator.gcpolicy import FULL_EVERY_S, YOUNG_THRESHOLD, GcPolicy
from watchdog.coordinator.intake.api import decode, validate
from watchdog.coordinator.intake.backpressure import STEPS_FROM_RATE, STEPS_INTERVAL_S
from watchdog.coordinator.journal.jsonl import Journal
from watchdog.coordinator.performance import verdict
from watchdog.coordinator.service import Coordinator
from watchdog.coordinator.view import columns
from watchdog.report import HostReport, as_rows
from watchdog.stepstats.steps import summary_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--seconds", type=int, default=40, help="virtual seconds: one report per host and one tick each")
    ap.add_argument(
        "--report-every",
        type=int,
        default=1,
        help="each host reports every this many seconds, the hosts spread over them (end to end at 16,384 ranks "
        "back-pressure slows agents to ~2-3 s, so their ranks close straggler windows on different ticks)",
    )
    ap.add_argument(
        "--compute-s",
        type=float,
        default=scalesim.Job.compute_s,
        help="each rank's compute per step (the step is ~1.2x that): the step samples a report carries scale with 1/it",
    )
    ap.add_argument("--freeze-at", type=float, default=None, help="virtual second at which one rank freezes (a hang)")
    ap.add_argument(
        "--suspend-at",
        type=float,
        default=None,
        help="virtual second at which every rank is stopped (a scheduler's suspend): one frozen_rank finding expected",
    )
    ap.add_argument("--profile", choices=("tick", "accept"), default=None)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument(
        "--no-freeze-before-tick", action="store_true", help="collector frozen after each tick only (as before)"
    )
    ap.add_argument(
        "--no-freeze-after-report",
        action="store_true",
        help="no collector freeze after each accepted report (as before): its objects stay visible until the tick",
    )
    ap.add_argument(
        "--gc-young",
        type=int,
        default=YOUNG_THRESHOLD,
        help=f"the collector's young-generation threshold (default {YOUNG_THRESHOLD:,}, as the daemon; CPython's is 700)",
    )
    ap.add_argument(
        "--report-version",
        choices=("1", "2", "both"),
        default="both",
        help="the report body decoded: version 1 (an object per rank), 2 (rows under field lists), or both "
        "(each report decoded both ways, timed apart, checked equal; the version-2 one folded)",
    )
    ap.add_argument(
        "--steps-every",
        type=float,
        default=-1.0,
        help="the hosts send their ranks' step samples this often, liveness in every report (the reply's "
        '"steps_interval_s"); 0: in every report; default: as the coordinator advises at this many reports a second',
    )
    ap.add_argument(
        "--no-summaries",
        action="store_true",
        help="the hosts send no step summaries (an older agent's reports): the coordinator computes every statistic",
    )
    ap.add_argument(
        "--no-typed",
        action="store_true",
        help="version-2 bodies read as before the typed reader (contracts/report/typed.py): JSON, then the schema",
    )
    ap.add_argument("--breakdown", action="store_true", help="thread CPU of each part of the tick (p50/p99/max)")
    ap.add_argument(
        "--full-gc",
        action="store_true",
        help="at the end, time the periodic full collection (gcpolicy.FULL_EVERY_S) on the heap built",
    )
    ap.add_argument(
        "--compare-with",
        metavar="DIR",
        help="a baseline's package (DIR/watchdog, e.g. from `git archive <commit> watchdog`): its detectors, "
        "verdict, goodput and gauges run on the same views each tick, timed next to this tree's",
    )
    args = ap.parse_args()

    t0 = 1_800_000_000.0
    frozen = {} if args.freeze_at is None else {"frozen": 2 * args.ranks // 3 + 1, "freeze_at": t0 + args.freeze_at}
    if args.suspend_at is not None:
        frozen["suspend_at"] = t0 + args.suspend_at
    job = scalesim.Job(world_size=args.ranks, t0=t0, straggler=args.ranks // 3, compute_s=args.compute_s, **frozen)
    hosts = [scalesim.Host(job, i, f"agent{i}") for i in range((args.ranks + 7) // 8)]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "journal.jsonl")
        journal = Journal(path, lambda: (time.time(), time.monotonic()))
        coord = Coordinator(Config(job=job.job, world_size=args.ranks, journal=path), journal)
        coord.runner._timer = time.thread_time  # each detector's duration in thread CPU too
        parts: dict[str, list[float]] = {}
        if args.breakdown:
            _time_parts(coord, parts)
        gc_policy = GcPolicy(0.0, young_threshold=args.gc_young)  # as the daemon does (gcpolicy.py)
        base = _Baseline(args.compare_with, coord) if args.compare_with else None
        prof = cProfile.Profile() if args.profile else None
        collector = _Collector()
        versions = {"1": (1,), "2": (2,), "both": (1, 2)}[args.report_version]
        size = dict.fromkeys(versions, 0)
        accept = {v: dict.fromkeys(("JSON decode", "schema", "validate", "fold"), 0.0) for v in versions}
        accepted, ticks, closing, opened = 0, [], [], []
        clock = time.thread_time
        window = coord.cfg.detectors.straggler_window_steps
        # What the request handler adds to each reply (api.ReportHandler): the hosts' agents then summarise.
        summary_settings = list(summary_config(coord.cfg.detectors)) if not args.no_summaries else None
        steps_every = args.steps_every
        if steps_every < 0:  # the advice of intake/backpressure.py at this rate (here it sees no loop to probe)
            steps_every = STEPS_INTERVAL_S if len(hosts) / args.report_every >= STEPS_FROM_RATE else 0.0
        coord.backpressure.steps_interval_s = steps_every  # what the replies say, and the goodput ledger reads
        print(f"step samples every {steps_every:g} s (0: in every report)")
        for sec in range(args.seconds):
            profiling = prof is not None and sec >= args.seconds // 2
            for i, h in enumerate(hosts):
                if (sec + i) % args.report_every:
                    continue
                wall = t0 + sec + i / len(hosts)
                raw = h.report(wall, float(args.report_every))
                bodies = {1: json.dumps(raw).encode()}
                if 2 in versions:
                    bodies[2] = json.dumps(as_rows(raw)).encode()
                if profiling and args.profile == "accept":
                    prof.enable()
                reports = {}
                for v in versions if accepted % 2 == 0 else versions[::-1]:  # neither always goes first
                    c0 = clock()
                    collector.phase = (v, "JSON decode")
                    # the request handler's steps, in its order (api.ReportHandler.handle): a version-2 body
                    # read in one pass where it can (both steps' time then counted as the decode's)
                    typed = typedbody.read(bodies[v]) if v == 2 and not args.no_typed else None
                    if typed is None:
                        obj = decode(bodies[v])
                    c1 = clock()
                    collector.phase = (v, "schema")
                    reports[v] = typed if typed is not None else HostReport.from_dict(obj, [])
                    c2 = clock()
                    collector.phase = (v, "validate")
                    validate(reports[v], ranks_checked=True)
                    c3 = clock()
                    collector.phase = None
                    for key, dt in zip(("JSON decode", "schema", "validate"), (c1 - c0, c2 - c1, c3 - c2), strict=True):
                        accept[v][key] += dt
                report = reports[versions[-1]]
                c3 = clock()
                collector.phase = (0, "fold")
                reply = coord.accept(report, wall - t0)
                c4 = clock()
                collector.phase = None
                if profiling and args.profile == "accept":
                    prof.disable()
                for v in versions:
                    accept[v]["fold"] += c4 - c3
                    size[v] += len(bodies[v])
                if len(reports) == 2 and not _same(reports[1], reports[2]):
                    sys.exit(f"version 1 and version 2 of report {h.name} #{h.seq} decoded differently")
                accepted += 1
                if summary_settings:
                    reply = {**reply, "step_summary_config": summary_settings}
                h.delivered(raw, {**reply, "steps_interval_s": steps_every} if steps_every else reply)
                if not args.no_freeze_after_report:
                    gc_policy.after_report()  # as the daemon does (gcpolicy.py)
            now = float(sec + 1)
            if base is not None:
                if not args.no_freeze_before_tick:
                    gc_policy.before_tick()  # the baseline's parts under the same collector policy
                base.tick(now, coord.view_at(now), measured=sec >= args.seconds // 2)
            if not args.no_freeze_before_tick:
                gc_policy.before_tick()  # as the daemon does (gcpolicy.py)
            c0 = time.thread_time()
            if profiling and args.profile == "tick":
                prof.enable()
            ran = {k: len(parts.get(k, ())) for k in _CADENCED}
            res = coord.tick(now, t0 + now)
            if profiling and args.profile == "tick":
                prof.disable()
            for k, n in ran.items():  # a part the cadence skipped costs this tick 0 (perf_cadence)
                if args.breakdown and len(parts.get(k, ())) == n:
                    parts.setdefault(k, []).append(0.0)
            if sec >= args.seconds // 2:
                ticks.append(time.thread_time() - c0)
                for o in res.outcomes:
                    parts.setdefault(f"detector {o.name}", []).append(o.duration_s)
                # A window closed on this tick when the job's step crossed a window boundary since the last one.
                step_now, step_before = int((now - 0.5) // job.wall_s), int((now - 1.5) // job.wall_s)
                if step_now // window != step_before // window:
                    closing.append(ticks[-1])
            gc_policy.after_tick(now)
            for f in res.opened:
                at = f"step {f.evidence['last_step']}" if f.kind == "straggler" else f"t={now:.0f}s"
                opened.append(
                    (f.kind, f.ranks[:8] + ((f"... {len(f.ranks):,} ranks",) if len(f.ranks) > 8 else ()), at)
                )
        if args.full_gc:  # the policy's own periodic collection, due at once, on this heap
            c0 = time.thread_time()
            full = gc_policy.after_tick(math.inf)
            assert full is not None
            full_gc = (full.frozen, time.thread_time() - c0, full.unreachable)
        journal.close()
    taken = coord.registry.get_sample_value("watchdog_coordinator_step_summaries_total", {"outcome": "used"}) or 0
    print(f"ranks {args.ranks}  hosts {len(hosts)}  virtual seconds {args.seconds}  step summaries taken: {taken:,.0f}")
    if args.full_gc:
        print(
            f"full collection (GcPolicy.after_tick every {FULL_EVERY_S:.0f} s): {full_gc[1] * 1e3:.0f} ms thread CPU "
            f"over {full_gc[0]:,} frozen objects; {full_gc[2]:,} unreachable found"
        )
    for v in versions:
        total = sum(accept[v].values())
        split = "  ".join(f"{k} {x / accepted * 1e6:.0f}" for k, x in accept[v].items())
        collector.spent[(v, "fold")] = collector.spent.get((0, "fold"), 0.0)
        print(
            f"accept v{v}: {total / accepted * 1e6:.0f} us CPU per report ({split}; {accepted} reports, "
            f"{size[v] / accepted / 1e3:.1f} KB each); core share at one report per host per second: "
            f"{total / accepted * len(hosts):.2f}"
        )
        gc_split = "  ".join(f"{k} {collector.spent.get((v, k), 0.0) / accepted * 1e6:.0f}" for k in accept[v])
        print(f"  of which the cyclic collector: {gc_split}")
    if len(versions) == 2:
        print(
            f"  (one run, the same reports; each decoded both ways, version {versions[-1]}'s folded; equal each time)"
        )
    print(f"tick thread CPU (last half, {len(ticks)} ticks): {_spread(ticks)}")
    print(f"  ticks on which a straggler window closed ({len(closing)}): {_spread(closing)}")
    print(f"findings opened: {opened}  (straggler is rank {job.straggler}, frozen rank {job.frozen})")
    if args.breakdown:
        half = args.seconds - args.seconds // 2
        for name, xs in sorted(parts.items(), key=lambda kv: -sorted(kv[1])[len(kv[1]) // 2]):
            print(f"  {name:32s} {_spread(xs[-half:])}")
        for name in _CADENCED:  # on the ticks they ran (perf_cadence)
            ran = [x for x in parts.get(name, [])[-half:] if x > 0]
            print(f"  {name + ' when run (' + str(len(ran)) + ')':32s} {_spread(ran)}")
    if base is not None:
        base.print(parts)
    print(f"max RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


_CADENCED = ("verdict.measure", "goodput.tick", "Performance")


def _time_parts(coord: Coordinator, parts: dict[str, list[float]]) -> None:
    """Wrap the tick's parts so each records its thread CPU per call."""

    def timed(name: str, fn):
        def wrapper(*a, **kw):
            c0 = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                parts.setdefault(name, []).append(time.thread_time() - c0)

        return wrapper

    for name in ("view_at", "_hosts"):
        setattr(coord, name, timed(name, getattr(coord, name)))
    for sub in coord.subsystems:  # Collector (evidence), Steering (actions), Gauges, Performance, ...
        sub.on_tick = timed(type(sub).__name__, sub.on_tick)  # type: ignore[method-assign]
    coord.runner.run = timed("detectors (all)", coord.runner.run)
    coord.metrics.set_detector_gauges = timed("set_detector_gauges", coord.metrics.set_detector_gauges)
    coord.goodput.tick = timed("goodput.tick", coord.goodput.tick)
    coord.goodput._scan = timed("goodput._scan", coord.goodput._scan)  # type: ignore[method-assign]
    coord.goodput._split = timed("goodput._split", coord.goodput._split)  # type: ignore[method-assign]
    verdict.measure = timed("verdict.measure", verdict.measure)
    columns.build = timed("columns.build", columns.build)


class _Baseline:
    """Another version's tick parts (detectors with their gauges exported,
    verdict, goodput), loaded as the package ``baseline_watchdog`` and run on the
    same view before this tree's tick, so both are timed in one run under the
    same load. Its modules import the shared wire types (``watchdog.report``)
    from this tree, so they read the same view objects."""

    def __init__(self, root: str, coord: Coordinator) -> None:
        from prometheus_client import CollectorRegistry

        det = baseline_tree.module(root, "coordinator.detectors")
        self.verdict = baseline_tree.module(root, "coordinator.verdict")
        goodput = baseline_tree.module(root, "coordinator.goodput")
        metrics = baseline_tree.module(root, "coordinator.metrics")
        self.cfg = coord.cfg.detectors
        self.detectors = det.build(self.cfg)
        self.metrics = metrics.CoordinatorMetrics(CollectorRegistry(), tuple(d.name for d in self.detectors))
        self.summaries = self.verdict.Summaries()
        self.ledger = goodput.Ledger()
        self.ticks: list[float] = []
        self.parts: dict[str, list[float]] = {}

    def tick(self, now: float, view, measured: bool) -> None:
        c0 = time.thread_time()
        for d in self.detectors:
            t0 = time.thread_time()
            d.check(now, view)
            gauges = getattr(d, "gauges", None)
            if gauges is not None:
                self.metrics.set_detector_gauges(dict(gauges(now, view)))
            if measured:
                self.parts.setdefault(f"detector {d.name}", []).append(time.thread_time() - t0)
        t0 = time.thread_time()
        self.verdict.measure(now, view, self.cfg, self.summaries)
        t1 = time.thread_time()
        self.ledger.tick(now, view, False)
        t2 = time.thread_time()
        if measured:
            self.parts.setdefault("verdict.measure", []).append(t1 - t0)
            self.parts.setdefault("goodput.tick", []).append(t2 - t1)
            self.ticks.append(t2 - c0)

    def print(self, parts: dict[str, list[float]]) -> None:
        """Baseline against this tree, part by part (this tree's detectors include their gauges' export)."""
        print("\nsame views, one run: baseline (detectors + gauges, verdict, goodput) -> this tree")
        mine = [sum(x) for x in zip(*(v for k, v in parts.items() if k.startswith("detector ")), strict=False)]
        mine = [a + b + c for a, b, c in zip(mine, parts.get("verdict.measure", []), parts.get("goodput.tick", []))]
        print(f"  {'those parts, per tick':32s} {_spread(self.ticks)}  ->  {_spread(mine[-len(self.ticks) :])}")
        for name, xs in sorted(self.parts.items(), key=lambda kv: -sorted(kv[1])[len(kv[1]) // 2]):
            print(f"  {name:32s} {_spread(xs)}  ->  {_spread(parts.get(name, [])[-len(xs) :])}")


class _Collector:
    """Thread CPU the cyclic garbage collector takes inside each timed step (the
    step it interrupts pays for it): collections run when enough container
    objects were allocated, whoever allocated them."""

    def __init__(self) -> None:
        self.phase: tuple[int, str] | None = None
        self.spent: dict[tuple[int, str], float] = {}
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, event: str, info: dict) -> None:
        if event == "start":
            self._started = time.thread_time()
        elif self.phase is not None:
            self.spent[self.phase] = self.spent.get(self.phase, 0.0) + time.thread_time() - self._started


def _same(a: HostReport, b: HostReport) -> bool:
    """Equal reports, the rank's ``death`` included (RankState's equality leaves it out)."""
    return a == b and [r.death for r in a.ranks] == [r.death for r in b.ranks]


def _spread(xs: list[float]) -> str:
    """p50 / p99 / max in ms (p99 of few ticks is their nearest-rank value)."""
    if not xs:
        return "-"
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)]
    return f"p50 {xs[len(xs) // 2] * 1e3:.1f} ms  p99 {p99 * 1e3:.1f} ms  max {xs[-1] * 1e3:.1f} ms"


if __name__ == "__main__":
    main()
