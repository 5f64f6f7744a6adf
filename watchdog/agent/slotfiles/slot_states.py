"""Pure decisions about slots: stale at first sight, which slot speaks for a rank,
a rank's state, windowed step statistics. Everything takes ``now`` explicitly."""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from watchdog.agent.processes.table import ProcSample
from watchdog.contracts import slot as wire
from watchdog.report import StepSample

# Slot states: the first three are ranks we export; the others are files we do not.
ALIVE, DEAD, EXITED = "alive", "dead", "exited"
STALE = "stale"  # process gone and heartbeat old when first seen: an earlier job's leftover
SUPERSEDED = "superseded"  # a newer slot claims the same (job, rank): history
OTHER_JOB = "other_job"  # filtered out by --job.name
INVALID = "invalid"  # never read successfully (garbage, unknown version, I/O error)
EXPIRED = "expired"  # its job's processes on this host all ended longer ago than --stale.job-expiry-seconds
SLOT_STATES = (ALIVE, DEAD, EXITED, STALE, SUPERSEDED, OTHER_JOB, INVALID, EXPIRED)

WINDOW_STEPS = 32
# A heartbeat ahead of our clock by more than this is from before a reboot
# (CLOCK_MONOTONIC restarts at boot), not clock jitter.
FUTURE_SLACK_NS = 1_000_000_000


def stale_reason(
    header: wire.SlotHeader, proc: ProcSample, now_mono_ns: int, now_wall_ns: int, stale_after_s: float
) -> str | None:
    """Why a slot seen for the first time is an earlier job's leftover, or None.

    Only a slot whose process is gone can be stale. Its last heartbeat is judged on
    both clocks: monotonic ages are meaningless across a reboot (the clock restarts,
    so the heartbeat may even lie in the future), and the wall-clock estimate
    ``created_wall + (heartbeat - created_mono)`` survives one."""
    if proc.alive:
        return None
    limit_ns = stale_after_s * 1e9
    hb = header.heartbeat_ns
    if hb > now_mono_ns + FUTURE_SLACK_NS or header.created_mono_ns > now_mono_ns + FUTURE_SLACK_NS:
        return "heartbeat is ahead of this host's monotonic clock (written before a reboot)"
    if now_mono_ns - hb > limit_ns:
        return f"process {proc.status}, last heartbeat {(now_mono_ns - hb) / 1e9:.0f}s ago"
    hb_wall = header.created_wall_ns + (hb - header.created_mono_ns)
    if now_wall_ns - hb_wall > limit_ns:
        return f"process {proc.status}, last heartbeat {(now_wall_ns - hb_wall) / 1e9:.0f}s ago by the wall clock"
    return None


def expired_jobs(procs: Iterable[tuple[str, ProcSample]], now_mono_ns: int, expiry_s: float) -> dict[str, float]:
    """job -> seconds since its last process on this host ended, for every job whose
    processes here have *all* been gone longer than ``expiry_s``: an abandoned job,
    whose dead ranks would otherwise page until someone deletes the files. One live
    process keeps every slot of its job (a dead rank in a live job must keep alerting).

    ``procs``: (job, process sample) of every tracked slot, superseded ones included."""
    alive: set[str] = set()
    last_gone: dict[str, int] = {}
    for job, proc in procs:
        if proc.alive:
            alive.add(job)
        else:
            last_gone[job] = max(last_gone.get(job, 0), proc.gone_ns)
    limit_ns = expiry_s * 1e9
    return {
        job: (now_mono_ns - gone) / 1e9
        for job, gone in last_gone.items()
        if job not in alive and now_mono_ns - gone > limit_ns
    }


def rank_state(status: int, proc: ProcSample, exit_code: int | None = None) -> str:
    """A clean exit (the hook's atexit wrote EXITED) is not a death, unless the
    exit status says otherwise: ``exit_code`` (deathcause.decode's, a signal
    negative; None: not read) other than 0 is a failure whatever the hook's status
    (a ``raise SystemExit(1)``, a C-level ``exit(1)``)."""
    if status == wire.Status.EXITED and not exit_code:
        return EXITED
    return ALIVE if proc.alive else DEAD


def reported_status(status: int, state: str) -> str:
    """The hook status a report carries: "exited" only for a clean exit, and
    "failed" for a rank whose hook said exited but whose exit status did not."""
    if state == EXITED:
        return "exited"
    if state == DEAD and status == wire.Status.EXITED:
        return "failed"
    return label(wire.Status, status, "unknown")


T = TypeVar("T")


@dataclass(frozen=True)
class Claim:
    """What decides which slot speaks for a (job, rank): what the agent saw itself.
    ``first_seen``: the agent's poll number at first sight; ``seen_alive``: its process
    was alive then; ``alive``: it is now. ``created``: the writer's own creation times,
    only a tie-break between slots first seen in the same poll (an agent's first poll)
    with the same liveness: a writer can set them to anything."""

    first_seen: int
    seen_alive: bool
    alive: bool
    created: tuple[int, int]
    path: str


def speakers(slots: Iterable[T], key_of: Callable[[T], Hashable], claim_of: Callable[[T], Claim]) -> dict[Hashable, T]:
    """key -> the slot that speaks for it: the one the agent saw first most recently
    (a torchrun restart leaves the old worker's file behind), except that a slot whose
    process was never seen alive cannot supersede one whose process lives (a file
    naming a dead pid would hide a live rank and make it look dead)."""
    groups: dict[Hashable, list[tuple[Claim, T]]] = {}
    for s in slots:
        groups.setdefault(key_of(s), []).append((claim_of(s), s))
    out: dict[Hashable, T] = {}
    for key, group in groups.items():
        if any(c.alive for c, _ in group):
            group = [(c, s) for c, s in group if c.seen_alive]
        _, out[key] = max(group, key=lambda cs: (cs[0].first_seen, cs[0].seen_alive, cs[0].created, cs[0].path))
    return out


def job_admits(owner: int | None, uid: int, trusted: frozenset[int]) -> bool:
    """May a slot owned by ``uid`` speak for a job whose ranks here belong to ``owner``
    (None: no live rank fixed it yet)? ``uid`` < 0: unknown (fakes, tests)."""
    return uid < 0 or owner is None or uid == owner or uid in trusted


def job_owner(owner: int | None, uid: int, alive: bool, trusted: frozenset[int]) -> int | None:
    """The job's owner after admitting a slot: the first live rank of a job fixes it;
    a trusted uid writes for others and fixes nothing; a dead slot proves nothing."""
    if owner is not None or not alive or uid < 0 or uid in trusted:
        return owner
    return uid


def window_mean_s(step_records: Sequence[wire.Record], n: int = WINDOW_STEPS) -> float:
    """Mean step duration (s) over the last ``n`` STEP_END records; 0 with none."""
    recent = step_records[-n:]
    if not recent:
        return 0.0
    return sum(r.payload[0] for r in recent) / len(recent) / 1e9


def cpu_percent(prev: ProcSample | None, cur: ProcSample) -> float:
    """CPU use between two samples, in percent of one core (psutil's convention)."""
    if prev is None or not prev.sampled_ns or cur.sampled_ns <= prev.sampled_ns:
        return 0.0
    return max(0.0, 100.0 * (cur.cpu_seconds - prev.cpu_seconds) / ((cur.sampled_ns - prev.sampled_ns) / 1e9))


# The run-queue shares are over this much of the rank's recent life: a CPU hog shows in
# full one window after it started. Two ranks' contention on a shared 2-core host at load
# 7-10 (the corpus scripts, benchmarks/corpus.py, whose hog that load hid) differed by at
# most 0.14 over 10 s windows (0.11 over 20 s), against the 0.25 that names a starved rank
# (analysis/slowcause.py); a hog on a quiet host was named 50.9 s after it started with 20 s.
RUNQ_WINDOW_S = 10.0
RUNQ_MIN_SPAN_S = 5.0  # and say nothing (0.0) until they cover this much


def runq_shares(window: Sequence[ProcSample]) -> tuple[float, float]:
    """Seconds per second the rank's main thread ran on a CPU, and waited for one,
    between the oldest and newest of ``window`` (its resource samples, oldest
    first); (0.0, 0.0) until they span ``RUNQ_MIN_SPAN_S`` or where the kernel
    keeps no schedstat."""
    if len(window) < 2:
        return 0.0, 0.0
    first, last = window[0], window[-1]
    span_s = (last.sampled_ns - first.sampled_ns) / 1e9
    if span_s < RUNQ_MIN_SPAN_S or not first.oncpu_s:
        return 0.0, 0.0
    return max(0.0, (last.oncpu_s - first.oncpu_s) / span_s), max(0.0, (last.runq_s - first.runq_s) / span_s)


def label(enum_cls: type[enum.IntEnum], code: int, unknown: str) -> str:
    """Bounded label for a wire enum; a code this agent does not know maps to ``unknown``."""
    try:
        return enum_cls(code).name.lower()
    except ValueError:
        return unknown


def step_sample(rec: wire.Record) -> StepSample:
    p = rec.payload  # STEP_END: A step_ns, B data_ns, C coll_ns, ..., F phase, H bytes, I..L the finer split
    return StepSample(
        step=rec.step,
        step_s=p[0] / 1e9,
        data_s=p[1] / 1e9,
        coll_s=p[2] / 1e9,
        phase=label(wire.Phase, p[5], "other"),
        coll_bytes=p[7],
        forward_s=p[8] / 1e9,
        backward_s=p[9] / 1e9,
        optimizer_s=p[10] / 1e9,
        h2d_s=p[11] / 1e9,
    )


def age_s(now_ns: int, then_ns: int) -> float:
    """Seconds since ``then_ns``; 0 for "never" (0) and for times ahead of now."""
    return max(0.0, (now_ns - then_ns) / 1e9) if then_ns > 0 else 0.0
