"""Why a rank is slow, and whether it costs enough to say so: pure rules over the view.

The straggler detector and the ``extra_work`` advisory ask three questions of a
slow rank; the answers are here, once.

- **Does it cost enough to report?** A rank computing 1.2x its peers' 0.5 ms costs
  0.1 ms a step: below what the scheduler alone moves between two ranks on a busy
  host (its slices are milliseconds), so it is not told from noise however many
  steps say it. A slowdown is reported when the job loses at least ``MIN_EXTRA_S``
  a step to it in work (more in wall time on a host where ranks wait for a CPU:
  ``noise_floor_s``) *and* at least ``MIN_COST_SHARE`` of its time (1.2 s a minute).
  Measured on the corpus (benchmarks/corpus.py, 2 ranks on a shared 2-core host):
  the healthy ``ddp_tutorial`` (1-3 ms steps) had a rank named at 0.13 ms (5% of a
  2.7 ms step), and its noisy-neighbour run named the wrong rank at 0.17-0.24 ms
  (0.8-1.2% of its steps); the real faults cost tens of milliseconds a step.
- **Is its host taking its CPU?** The agent reads the kernel's run-queue wait of each
  rank's main thread (/proc schedstat): time it was runnable but not running. Its
  *contention*, wait / (wait + on-CPU), is what a CPU hog sharing its core raises
  (to 1/2 with one hog) while the ranks on other cores keep theirs. Measured healthy
  on that shared host, over 20 s windows, two ranks' contention differed
  by at most 0.06 while both sat at 0.2-0.6 (0.14 over the agent's 10 s at 0.5-0.85), and their wait in seconds per second by
  up to 0.16 (rank 0's own threads and loader workers compete with it). A rank is
  starved when its contention exceeds the median of the others' by
  ``CONTENTION_EXCESS`` and the wait costs it ``RUNQ_EXCESS_S`` a second more than
  theirs, while theirs is under ``STARVED_BELOW`` (below). That is a slow host (a
  finding): it holds when DDP's all-reduce makes every rank's step equal, and
  when the hook sees no collective at all.
- **Can the host's load tell us anything?** Where the other ranks themselves wait
  for a CPU two-thirds as long as they run or more (the median of their contention is ``HOST_BUSY``
  or more), every rank's compute is the scheduler's to share out: which rank's
  core drew more of the host's load decides which computes slower, window after
  window, and the rank named was a healthy one. With a CPU hog pinned to rank 1's
  core on the shared 2-core host at load 7-10, the host's other load went to
  rank 0's core: its compute ran 1.13-1.26x rank 1's and it was named (DDP
  tutorial, nanoGPT), while both ranks' contention read 0.5-0.85 and differed by
  at most 0.14 over 10 s. With three hogs at load 25-30, rank 0's core drew so
  much of it that rank 0 read 0.86 against rank 1's 0.61 and was named starved.
  There, neither compute nor contention names anyone (``cannot_tell``): "cannot
  tell" rather than a healthy rank. Healthy ranks on a quiet host read 0.08
  (Lightning) to 0.37 (the DDP tutorial's 1 ms steps); a hog's victim there was
  named against 0.08-0.37. The exception is a slow rank that barely waits for a
  CPU itself (``barely_waits``): where the host's load makes a rank compute
  slower, the time it loses is time its threads wait for a CPU, and a rank whose
  main thread waited less than half the time its slowness costs the job is slow
  by something else (a sleep, a GPU, an I/O), however busy its host. Measured at
  load 9-11 (the integration tier at -n 4 and -n 5), the others' contention at
  0.40-0.74: the real stragglers (5x and 1.3x sleeps) waited 0.01-0.14 s a second
  against costs of 65-71% and 20% of the job's time, the 1.3x up to 0.31 while the
  agent's 10 s window still held the job's imports (told once it had passed
  them); healthy CPU-bound ranks on such a host wait 0.16-0.56 s a second (trl).
- **Is it rank 0 doing work the others do not?** Scripts log, print, sync a loss
  (``loss.item()``) and write metrics on rank 0 alone, every step. Rank 0 slower
  than its peers while its host leaves it its CPU (not starved) is that: said as
  advice (``extra_work``), not paged. Rank 0 on a starved core is a slow host like
  any other rank.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from ...stepstats import stats
from ..view import columns
from ..view.cluster import ClusterView

MIN_EXTRA_S = 0.001  # a step's loss to a slow rank below this is scheduler noise
MIN_COST_SHARE = 0.02  # of the job's time: 1.2 s a minute
CONTENTION_EXCESS = 0.25  # run-queue wait / runnable time, beyond the median of the other ranks'
RUNQ_EXCESS_S = 0.1  # seconds per second waited for a CPU beyond theirs: 6 s a minute
MAX_CONTENTION = 0.95  # the noise floor stops at 20x MIN_EXTRA_S
# The other ranks' contention (median) from which compute cannot tell a slow rank. Healthy ranks on
# a quiet host read 0.08-0.37; a healthy HF Trainer run on the shared 2-core host at load ~6 (the
# integration tier at -n 3) had rank 1 computing 1.40x its peer, over four windows, at 0.50 against 0.44.
HOST_BUSY = 0.4
# The other ranks' contention (median) under which a rank's own wait for a CPU can name it:
# stricter than HOST_BUSY, because on a busy host which rank's main thread the scheduler makes
# wait is a draw. A healthy HF Trainer run on the shared 2-core host at load ~10 (-n 4) had rank 0
# do rank 1's work on a CPU and wait three times as long for one: 0.66 of its runnable time
# against 0.395. The hogs' victims on a quiet host (benchmarks/corpus.py) were named against
# 0.02-0.05 (nanoGPT, Lightning, Fabric) and 0.285 (trl, whose loader workers share the cores).
STARVED_BELOW = 0.35
# The other ranks' runnable time (median), as a share of this rank's, below which their contention
# is no baseline for its: they barely ran (asleep in a collective, waiting for it). A CPU hog's
# victim makes its peers wait for it too, but they still run their own compute: at half the
# victim's speed their runnable time is half of its. A rank spinning alone while its peer slept
# in DDP's all-reduce read 0.67 against 0.37 on a busy host, its peer runnable 0.17 of its time
# (tests/test_e2e_alone.py at -n 3): that is the rank's own demand, a hang or compute's to judge.
BASELINE_RUNNABLE = 0.25
# On a busy host a slow rank is still told (``barely_waits``) when its main thread waited for a
# CPU less than this share of the time its slowness costs the job: the run queue cannot have
# taken that time from it. Half, not all: the run queue's wait is read over the agent's last
# 10 s, the cost over the straggler's windows.
WAIT_EXPLAINS = 0.5
# ... and its main thread did its process's CPU work, within this many seconds a second: where
# other threads do it (intra-op threads), their wait for a CPU is not read, and cannot be ruled out.
OTHER_THREADS_S = 0.1
LONE_WORKER = 0  # the rank scripts give the work no other rank does


def noise_floor_s(cont: Contention | None) -> float:
    """The least extra time a step that says something about a rank's work:
    ``MIN_EXTRA_S`` of its running, in wall time on its host, where a typical rank
    (the median of the others) waits for a CPU a share ``c`` of its runnable time:
    a millisecond of work takes 1 / (1 - c) there, and the scheduler's slices that
    land in one rank's compute and not its peer's grow alike. Healthy
    ``ddp_tutorial`` on the shared 2-core host at load 12-14 (c = 0.81: floor 5 ms):
    rank 0 computed 3.9x its peer, 1.25 ms more a step. The hog's victim on ``trl``
    at c = 0.62 (floor 2.6 ms): 33 ms more a step."""
    c = min(cont.baseline_ratio, MAX_CONTENTION) if cont is not None else 0.0
    return MIN_EXTRA_S / (1.0 - c)


def costs_enough(extra_s: float, share: float, floor_s: float = MIN_EXTRA_S) -> bool:
    """Whether a slowdown of ``extra_s`` a step, ``share`` of the job's time, is
    worth a report, above a noise floor of ``floor_s`` a step (``noise_floor_s``)."""
    return extra_s >= max(floor_s, MIN_EXTRA_S) and share >= MIN_COST_SHARE


@dataclass(frozen=True)
class Contention:
    rank: int
    wait_s: float  # seconds per second its main thread waited for a CPU
    ratio: float  # wait / (wait + on-CPU): the share of its runnable time spent waiting
    baseline_wait_s: float  # the median of the other measured ranks'
    baseline_ratio: float
    runnable_s: float  # seconds per second it was runnable (waiting for a CPU or on one)
    baseline_runnable_s: float  # the median of the other measured ranks'

    @property
    def excess_s(self) -> float:
        return self.wait_s - self.baseline_wait_s

    @property
    def starved(self) -> bool:
        return (
            self.baseline_ratio < STARVED_BELOW
            and self.ratio - self.baseline_ratio >= CONTENTION_EXCESS
            and self.excess_s >= RUNQ_EXCESS_S
            and self.baseline_runnable_s >= BASELINE_RUNNABLE * self.runnable_s
        )

    def describe(self) -> str:
        return (
            f"waits for a CPU {self.ratio:.0%} of the time it is runnable ({self.wait_s:.2f} s a second) against "
            f"{self.baseline_ratio:.0%} ({self.baseline_wait_s:.2f} s) for the median of the other ranks"
        )

    def evidence(self) -> dict[str, float]:
        return {
            "runq_wait_share": round(self.wait_s, 4),
            "runq_contention": round(self.ratio, 4),
            "runq_baseline_wait_share": round(self.baseline_wait_s, 4),
            "runq_baseline_contention": round(self.baseline_ratio, 4),
            "runnable_share": round(self.runnable_s, 4),
            "runnable_baseline_share": round(self.baseline_runnable_s, 4),
        }


class Contentions:
    """Every running rank's run-queue contention against the other running ranks',
    for the ranks the agents measured (none with fewer than two). Built from the
    view's columns; a rank's ``Contention`` is made when asked for: at 16,384 ranks
    one object each cost ~0.2 s a tick."""

    def __init__(self, measured: dict[int, tuple[float, float, float]]) -> None:
        self._measured = measured if len(measured) >= 2 else {}
        self._waits = sorted(w for w, _, _ in self._measured.values())
        self._ratios = sorted(q for _, q, _ in self._measured.values())
        self._runnables = sorted(u for _, _, u in self._measured.values())

    def get(self, rank: int) -> Contention | None:
        m = self._measured.get(rank)
        if m is None:
            return None
        w, q, u = m
        waits, ratios, runnables = self._waits, self._ratios, self._runnables
        return Contention(
            rank,
            w,
            q,
            stats.median_without(waits, bisect_left(waits, w)),
            stats.median_without(ratios, bisect_left(ratios, q)),
            u,
            stats.median_without(runnables, bisect_left(runnables, u)),
        )

    def cannot_tell(self, rank: int, cost: float | None = None, cpu_s: float = 0.0) -> bool:
        """``cannot_tell`` for ``rank`` (``cost`` and ``cpu_s`` as there), from the other
        ranks' contention whether or not its own was measured. An agent back from a
        silence (stopped, restarted, cut off) has no reading of its ranks until its
        samples span ``RUNQ_MIN_SPAN_S`` again, while the steps it missed reach the
        coordinator at once: at load 7 a healthy rank on such a host computed 1.18x its
        peers over the windows it missed and was named (tests/test_e2e_blind.py, a
        fresh-clone run at -n 4). Unmeasured, it is judged by the others' wait alone."""
        c = self.get(rank)
        if c is not None or not self._ratios:
            return cannot_tell(c, cost, cpu_s)
        return stats.median(self._ratios) >= HOST_BUSY  # every measured rank is another

    def starved(self) -> list[Contention]:
        """The ranks whose host takes their CPU (see the module docstring), in rank order."""
        if not self._measured:
            return []
        # No rank's baseline is below the median without the largest ratio: only those
        # that far above it can be starved.
        least = stats.median_without(self._ratios, len(self._ratios) - 1) + CONTENTION_EXCESS
        out = []
        for r in sorted(r for r, (_, q, _) in self._measured.items() if q >= least):
            c = self.get(r)
            if c is not None and c.starved:
                out.append(c)
        return out


def contention(view: ClusterView) -> Contentions:
    """``Contentions`` of the view's ranks that run, alive, not stopped, measured."""
    cols = columns.of(view)
    return Contentions(
        {
            r: (runq, runq / (runq + oncpu), runq + oncpu)
            for r, alive, status, proc, oncpu, runq in zip(
                cols.rank, cols.alive, cols.status, cols.proc_status, cols.oncpu_share, cols.runq_share
            )
            if alive and status == "running" and proc != "stopped" and oncpu + runq > 0
        }
    )


def starved(view: ClusterView) -> list[Contention]:
    """The ranks whose host takes their CPU (see the module docstring), in rank order."""
    return contention(view).starved()


def cannot_tell(cont: Contention | None, cost: float | None = None, cpu_s: float = 0.0) -> bool:
    """A slow rank's compute, and its own wait for a CPU, say nothing of it: the
    other ranks wait for a CPU two-thirds as long as they run (``HOST_BUSY``), and
    the rank, slow by ``cost`` of the job's time, does not barely wait for one
    itself (``barely_waits``; ``cpu_s``: its process's CPU seconds a second). With
    no ``cost`` (stalls now and then, which a reading of the last seconds does not
    cover) the host's load alone decides."""
    if cont is None or cont.baseline_ratio < HOST_BUSY:
        return False
    return cost is None or not barely_waits(cont, cost, cpu_s)


def barely_waits(cont: Contention, cost: float, cpu_s: float) -> bool:
    """Whether a rank whose slowness costs ``cost`` of the job's time waited for a CPU
    too little for the host's load to explain it: its main thread waited less than
    ``WAIT_EXPLAINS`` of that, and did its process's CPU work (``cpu_s``, seconds a
    second, within ``OTHER_THREADS_S`` of its own on-CPU time: other threads' wait
    is not read)."""
    oncpu_s = cont.runnable_s - cont.wait_s
    return cont.wait_s < WAIT_EXPLAINS * cost and cpu_s <= oncpu_s + OTHER_THREADS_S


def lone_work(rank: int, cont: Contention | None) -> bool:
    """A slow rank's slowness is work it does alone (not its host's doing)."""
    return rank == LONE_WORKER and not (cont is not None and cont.starved)
