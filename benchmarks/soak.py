"""Soak: a healthy 4-rank job (jitter, periodic checkpoints) watched by a real agent
and coordinator for N minutes. Expected: zero findings, and flat memory in every
hook (the ranks), the agent and the coordinator.

    python benchmarks/soak.py [--minutes 60] [--ranks 4] [--sample-seconds 30]

Samples each process's RSS every ``--sample-seconds`` and prints a table over
time, then each process's least-squares slope (MB per hour) over the samples after
the warm-up (the first 10 % of the run: imports, first checkpoint, history
windows filling). Not part of CI: it runs for an hour by default.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil

from watchdog.coordinator.journal import event_names as je
from watchdog.coordinator.journal import jsonl as journal
from watchdog.dev import localjob

MB = 2**20


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) in MB per hour; 0 with fewer than 2 points."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mx) * (v - my) for t, v in points) / var * 3600.0


def _series(samples: list[tuple[float, dict[str, float | None]]], name: str, since: float) -> list[tuple[float, float]]:
    """(seconds, MB) of one process from ``since`` on, samples where it was gone left out."""
    out = []
    for t, row in samples:
        mb = row[name]
        if t >= since and mb is not None:
            out.append((t, mb))
    return out


def rss_mb(pid: int) -> float | None:
    try:
        return psutil.Process(pid).memory_info().rss / MB
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--sample-seconds", type=float, default=30.0)
    ap.add_argument("--compute-ms", type=float, default=50.0)
    ap.add_argument("--jitter", type=float, default=0.2, help="random +-fraction on each rank's compute per step")
    ap.add_argument("--ckpt-every", type=int, default=200, help="checkpoint every N steps")
    ap.add_argument("--work-dir", default=None, help="keep logs, slots and the journal here (default: a temp dir)")
    args = ap.parse_args()
    # Killed or interrupted (a background job ignores SIGINT), the run still ends its job and daemons.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="watchdog-soak-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    run_dir, jpath = work / "run", work / "journal.jsonl"
    run_dir.mkdir(exist_ok=True)
    job = f"soak-{secrets.token_hex(3)}"
    token = work / "token"
    token.write_text(secrets.token_hex(16))
    os.chmod(token, 0o600)
    env = {**os.environ, "WATCHDOG_JOB_TOKEN_FILE": str(token)}
    duration_s = args.minutes * 60.0
    coordinator = agent = None
    tjob = localjob.TorchrunJob(
        nproc=args.ranks,
        run_dir=run_dir,
        job=job,
        work_dir=work,
        # More steps than the run can reach (a step takes at least --compute-ms): the soak ends the job, not
        # the script. Not many more: the example allocates its data set up front, about 1 kB per step.
        script_args=[
            "--steps",
            str(int(duration_s / (args.compute_ms / 1000.0)) + 1000),
            "--compute-ms",
            str(args.compute_ms),
            "--jitter",
            str(args.jitter),
            "--ckpt-dir",
            str(work / "ckpt"),
            "--ckpt-every",
            str(args.ckpt_every),
        ],
    )
    samples: list[tuple[float, dict[str, float | None]]] = []
    try:
        coordinator = localjob.start_coordinator(work, job, args.ranks, jpath, env=env)
        agent = localjob.start_agent(work, run_dir, job, env=env, extra=["--coordinator.url", coordinator.url])
        tjob.start()
        ranks = tjob.wait_for_ranks(120.0)
        print(f"soak: job {job}, {args.ranks} ranks, {args.minutes:g} min, work dir {work}", flush=True)
        pids = {
            "coordinator": coordinator.popen.pid,
            "agent": agent.popen.pid,
            **{f"rank{r}": pid for r, pid in sorted(ranks.items())},
        }
        t0 = time.monotonic()
        while (elapsed := time.monotonic() - t0) < duration_s:
            if tjob.proc is not None and not tjob.proc.alive():
                print(f"soak: torchrun exited early with {tjob.proc.popen.returncode}", flush=True)
                break
            samples.append((elapsed, {name: rss_mb(pid) for name, pid in pids.items()}))
            print(
                f"soak: t={elapsed:7.0f}s "
                + " ".join(f"{k}={v:.1f}" if v else f"{k}=gone" for k, v in samples[-1][1].items()),
                flush=True,
            )
            time.sleep(min(args.sample_seconds, max(0.0, duration_s - elapsed)))
        samples.append((time.monotonic() - t0, {name: rss_mb(pid) for name, pid in pids.items()}))
    finally:
        for proc in (coordinator, agent):
            if proc is not None:
                proc.stop()
        tjob.stop()

    recs = journal.read(str(jpath)) if jpath.exists() else []
    findings = [r for r in recs if r["event"] == je.FINDING]
    steps = [r for r in recs if r["event"] == je.STATE]
    names = list(samples[0][1]) if samples else []
    print(
        f"\nsoak: {args.ranks}-rank job, jitter +-{args.jitter:.0%}, checkpoint every {args.ckpt_every} steps, "
        f"{samples[-1][0] / 60 if samples else 0:.1f} min, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    )
    print(f"{'t (s)':>7} " + " ".join(f"{n:>11}" for n in names) + "   (RSS MB)")
    every = max(1, len(samples) // 20)
    for i, (t, row) in enumerate(samples):
        if i % every == 0 or i == len(samples) - 1:
            print(f"{t:>7.0f} " + " ".join(f"{row[n]:>11.1f}" if row[n] else f"{'gone':>11}" for n in names))
    warm = samples[0][0] + 0.1 * (samples[-1][0] - samples[0][0]) if samples else 0.0
    print(
        f"{'slope':>7} "
        + " ".join(f"{slope_per_hour(_series(samples, n, warm)):>+11.2f}" for n in names)
        + "   (MB/hour, after the first 10 %)"
    )
    print(f"findings: {len(findings)} " + ", ".join(f"{f.get('kind')} {f.get('ranks')}" for f in findings))
    print(f"journal: {jpath} ({len(recs)} records, {len(steps)} state changes)")
    return 0 if not findings else 1


if __name__ == "__main__":
    raise SystemExit(main())
