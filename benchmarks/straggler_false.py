"""The straggler detector on simulated jobs (``SimJob``, no processes): how many
healthy jobs whose steps pause at random get a rank named (false findings), and
how soon a real straggler is named, for each ``straggler_sigmas`` given.

    python benchmarks/straggler_false.py [--sigmas 4 4.5] [--jobs 200] [--steps 5000]

A pause: on each step, each rank computes ``extra`` seconds longer with
probability ``chance`` (a collection of a large heap, a page fault storm),
independently of the others; compute is 0.1 s +-10 %. The score is tested on
every window close, so a threshold whose tail is too thin names someone in a
long enough job; the table shows where.
"""

from __future__ import annotations

import argparse
import statistics

from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors.straggler import Straggler
from watchdog.coordinator.testing import SimJob

# (world size, chance per step, extra seconds)
HEALTHY = [(2, 0.2, 0.05), (2, 0.05, 0.2), (2, 0.1, 0.1), (2, 0.02, 0.5), (4, 0.2, 0.05), (8, 0.2, 0.05)]
# (world size, chance, extra, the straggler's factor)
SLOW = [(8, 0.0, 0.0, 1.05), (2, 0.0, 0.0, 1.05), (2, 0.05, 0.2, 1.1), (8, 0.2, 0.05, 1.2)]


def _job(world: int, chance: float, extra: float, seed: int) -> SimJob:
    sim = SimJob(world_size=world, ranks_per_host=min(4, world), jitter=0.1, seed=seed, compute_s=0.1)
    if chance:
        sim.pauses(chance, extra)
    return sim


def false_findings(cfg: DetectorConfig, world: int, chance: float, extra: float, jobs: int, steps: int) -> int:
    """Healthy jobs of ``steps`` steps in which the detector named a rank."""
    named = 0
    for seed in range(jobs):
        sim, det, now = _job(world, chance, extra, seed), Straggler(cfg), 0.0
        while sim.view.ranks.get(0) is None or sim.view.ranks[0].state.step < steps:
            now += 5.0
            if det.check(now, sim.run_until(now)):
                named += 1
                break
    return named


def steps_to_find(cfg: DetectorConfig, world: int, chance: float, extra: float, factor: float, jobs: int) -> list:
    """Per job, the step at which the slow rank was named (None: missed, or another rank named)."""
    out: list[int | None] = []
    for seed in range(jobs):
        sim, det, now, slow = _job(world, chance, extra, seed), Straggler(cfg), 0.0, seed % world
        sim.slow(slow, factor)
        got = None
        while now < 2 + 1500 * 0.12 * factor:
            now += 0.5
            found = det.check(now, sim.run_until(now))
            if found:  # the first finding decides: the slow rank alone, or a miss
                got = sim.view.ranks[slow].state.step if found[0].ranks == (slow,) else None
                break
        out.append(got)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sigmas", type=float, nargs="+", default=[4.0, 4.5])
    ap.add_argument("--jobs", type=int, default=200, help="healthy jobs per row")
    ap.add_argument("--steps", type=int, default=5000, help="steps per healthy job")
    ap.add_argument("--slow-jobs", type=int, default=16, help="jobs with a straggler per row")
    args = ap.parse_args()
    cfgs = [DetectorConfig(straggler_sigmas=s) for s in args.sigmas]
    head = " | ".join(f"sigmas {s:g}" for s in args.sigmas)
    print(f"healthy jobs of {args.steps} steps with a rank named, of {args.jobs}\n")
    print(f"| ranks | pauses (chance x extra s) | {head} |")
    print("|---|---|" + "---|" * len(cfgs))
    for world, chance, extra in HEALTHY:
        got = [false_findings(cfg, world, chance, extra, args.jobs, args.steps) for cfg in cfgs]
        print(f"| {world} | {chance:g} x {extra:g} | " + " | ".join(map(str, got)) + " |")
    print(f"\nthe straggler named: jobs, and the step (median / max), of {args.slow_jobs}\n")
    print(f"| ranks | pauses | factor | {head} |")
    print("|---|---|---|" + "---|" * len(cfgs))
    for world, chance, extra, factor in SLOW:
        cells = []
        for cfg in cfgs:
            at = [x for x in steps_to_find(cfg, world, chance, extra, factor, args.slow_jobs) if x is not None]
            cells.append(f"{len(at)}: {statistics.median(at):.0f} / {max(at)}" if at else "0")
        print(f"| {world} | {chance:g} x {extra:g} | {factor:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
