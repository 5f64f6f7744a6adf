"""Goodput: where the job's wall time went, as counters that add up to it.

Every tick hands the ledger the wall time since the previous one. That time is
attributed by what the job was doing:

- before the first step completes: ``startup``;
- while a rank is in a checkpoint or eval phase: ``checkpoint_eval``;
- from a rank's death or restart until the new incarnation completes its first
  step: ``restart``;
- otherwise it waits (``pending``) until the steps it contained arrive in the
  reports, and is split by those steps: ``productive`` (the median rank's
  compute, plus the collective time of the job's own baseline: communication the
  job needs), ``data_wait``, ``collective_wait`` (beyond the baseline: the
  low quantile of the job's collective time per step so far), ``straggler`` (the
  slowest rank's compute beyond the median: everyone waits for it), and
  ``redone`` (steps a restart made the job do again).

Once every rank has exited cleanly the job is over: what is pending goes by the
last steps' proportions and the clock stops (a coordinator that outlives its
job does not dilute the job's goodput).

Pure: ``tick(now, view, restarting)`` with time as an argument; nothing here
reads the clock. Counters sum to the time ticked (until the job ended) minus
``pending`` (less than a step or a report interval).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import add, attrgetter, getitem, gt, itemgetter, lt, not_
from typing import Any, cast

from watchdog.report import StepSample

from ...stepstats.median import median
from ...stepstats.stats import quantile
from ...stepstats.steps import FLAT_FIELDS, PAUSE_PHASES
from ..analysis.intermittent_stalls import FREEZE_MIN_S, SplitStep, Stalls
from ..journal import event_names as je
from ..view import columns
from ..view.cluster import ClusterView
from ..view.columns import RankColumns
from ..view.stepcolumns import StepColumns
from ..vocabularies import GOODPUT_CATEGORIES as CATEGORIES

# One name per category, in the vocabulary's order (the metrics label by the same values).
PRODUCTIVE, DATA_WAIT, COLLECTIVE_WAIT, STRAGGLER, CHECKPOINT_EVAL, RESTART, REDONE, STARTUP = CATEGORIES
BASELINE_QUANTILE = 0.2  # the job's own collective cost per step: its 20th percentile
BASELINE_SAMPLES = 512
_NUMBER = attrgetter("step")
_PAUSES = frozenset(PAUSE_PHASES)
_EXACT = 1 << 53  # integers up to here are exact as doubles
_tail: Callable[[array, slice], array] = getitem  # type: ignore[assignment]  # array[slice] -> array
# Steps gathered from histories: step -> (ranks, step_s, data_s, compute_s, pause), row by row.
_Samples = dict[int, tuple[list[int], list[float], list[float], list[float], list[float]]]
STALE_STEPS = 8  # a step some live rank still has not reported this many steps later is split without it
# While agents send their step samples in batches (backpressure.STEPS_INTERVAL_S), ranks' newest
# samples lag one another by up to a batch: a step then waits that lag longer, up to this many.
STALE_STEPS_MAX = 64
LAG_QUANTILE = 0.01  # the lag is the newest step less this quantile of the ranks' newest: a stuck few do not hold all


@dataclass
class Ledger:
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    pending: float = 0.0
    last_tick: float | None = None
    started: bool = False  # a step completed
    restarting: bool = False
    ended: bool = False  # every rank exited: the clock stopped
    last_parts: dict[str, float] = field(default_factory=dict)  # the last split's proportions
    steps: int = 0  # steps split so far
    max_step: int = -1  # highest step number split; a lower one later is redone
    incarnations: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank -> (pid, start)
    seen: dict[int, int] = field(default_factory=dict)  # rank -> last step number taken from its history
    buffer: dict[int, StepColumns] = field(default_factory=dict)  # step -> its samples so far, by rank
    coll_history: list[float] = field(default_factory=list)
    world_sizes: set[int] = field(default_factory=set)
    # Per-step means for the scaling report: step, compute (median rank), collective, data.
    profile: dict[str, float] = field(
        default_factory=lambda: {"step_s": 0.0, "compute_s": 0.0, "coll_s": 0.0, "data_s": 0.0}
    )
    # Each train step's rank with the most work of its own, for the ranks that stall now and then
    # (analysis/intermittent_stalls.py): the straggler and loader_starvation detectors name them from these.
    stalls: Stalls = field(default_factory=Stalls, compare=False)
    # (ranks, pids, start times) when incarnations were last followed: unchanged, no rank restarted
    _tracked: tuple = field(default=(), repr=False, compare=False)
    # How many steps later a step some live rank has not reported is split without it (_scan).
    stale_steps: int = field(default=STALE_STEPS, repr=False, compare=False)

    def tick(self, now: float, view: ClusterView, restarting: bool = False, batched: bool = False) -> None:
        """``batched``: agents may be sending their ranks' step samples in batches
        (the coordinator asked them to), so a step waits as long as the ranks'
        newest samples lag one another before it is split without a rank."""
        dt = 0.0 if self.last_tick is None else max(0.0, now - self.last_tick)
        self.last_tick = now
        # Every rank exited cleanly: the job is over, and a coordinator that lingers is not its time.
        status = columns.of(view).status
        over = bool(status) and status.count("exited") == len(status)
        if over and self.ended:
            return
        self.ended = False
        live, changed, pausing = self._scan(view, track=not restarting, batched=batched)
        self._frames(view)
        self._beats(view)
        if restarting or changed:
            self.restarting = True
        ready = self._ready_steps(live)
        if not self.started:
            self.seconds[STARTUP] += dt
            self.started = bool(ready)
        elif self.restarting:
            # Down, then the new group's first step (its init included): all restart.
            self.seconds[RESTART] += dt + self.pending
            self.pending = 0.0
            self.restarting = not ready
        elif pausing:
            self.seconds[CHECKPOINT_EVAL] += dt
        else:
            self.pending += dt
        if ready:
            self._split(ready)
        if restarting or changed:  # after this tick's split: its steps were the old group's too
            self.stalls.clear()
        if over and self.started:
            # The last steps' share of time still pending goes by the last proportions seen.
            self._allocate(self.last_parts or {PRODUCTIVE: 1.0})
            self.ended = True

    # -- bookkeeping ---------------------------------------------------------------

    def _frames(self, view: ClusterView) -> None:
        """Note the frames the ranks' hooks sampled in the step they are still in
        (analysis/intermittent_stalls.py: where a rank held the job, for its step once split). One C-level
        pass over the columns finds the few ranks in a long step."""
        c = columns.of(view)
        if not any(c.frame):  # the agents send a frame only while its step lasts: nearly always none
            return
        for i in compress(range(len(c.frame)), c.frame):
            if c.frame_step[i] == c.step[i] + 1:
                self.stalls.saw_frame(c.rank[i], c.frame_step[i], c.frame[i])

    def _beats(self, view: ClusterView) -> None:
        """Note the heartbeat freezes of running ranks (``Stalls.beat``): the ranks
        whose agent read their heartbeat stale, found by one C-level pass over the
        column, and those that were at the last tick. A rank not running (dead,
        exited, failing, before its first beat) ends no freeze by itself, and one
        before its first step is starting up (imports, init: a real job's rank 0
        froze 1-1.5 s there, which made a pattern of its first recurring freeze)."""
        c = columns.of(view)
        stalls = self.stalls
        stale = set(compress(c.rank, map(gt, c.heartbeat_age_s, repeat(FREEZE_MIN_S))))
        for r in stale.union(stalls.freezing):
            rv = view.ranks.get(r)
            s = rv.state if rv is not None else None
            if rv is None or s is None or not (s.alive and rv.heartbeat_moved and s.status == "running" and s.step):
                stalls.lost(r)
                continue
            stalls.beat(
                r, s.step + 1, rv.received_at - s.heartbeat_age_s, s.heartbeat_age_s, s.proc_status == "stopped"
            )

    def _scan(self, view: ClusterView, track: bool = True, batched: bool = False) -> tuple[list[int], bool, bool]:
        """The ranks whose process lives (the ones whose steps the job waits on),
        whether an incarnation changed or a rank died (``track``: restarts are
        followed), and whether a live rank is in a checkpoint or eval phase; their
        steps since the last tick go into the buffer.

        Read from the view's columns (view/columns.py), not from 16,384 rank objects: a
        pass over those cost ~10-30 ms of cache misses alone at 16,384 ranks."""
        cols = columns.of(view)
        changed = self._track(cols) if track else False
        hists: Sequence[tuple[StepSample, ...]]
        flats: Sequence[array]
        newest: Sequence[float]
        if all(cols.alive) and "exited" not in cols.status:  # every rank live: no mask to apply
            live, hists, flats, newest = list(cols.rank), cols.step_history, cols.step_flat, cols.step_newest
            self.world_sizes.update(cols.world_size)
            pausing = not _PAUSES.isdisjoint(cols.phase)
        else:
            mask = [a and s != "exited" for a, s in zip(cols.alive, cols.status)]
            live, hists = list(compress(cols.rank, mask)), list(compress(cols.step_history, mask))
            flats, newest = list(compress(cols.step_flat, mask)), list(compress(cols.step_newest, mask))
            self.world_sizes.update(compress(cols.world_size, mask))
            pausing = not _PAUSES.isdisjoint(compress(cols.phase, mask))
        self._take(live, hists, flats, newest)
        self.stale_steps = _patience(newest) if batched else STALE_STEPS
        return live, changed, pausing

    def _track(self, cols: RankColumns) -> bool:
        """Follow incarnations: True if one changed (a restart) or a rank died."""
        changed = False
        now = (cols.rank, cols.pid, cols.proc_start_us)
        if now != self._tracked:  # the same ranks, pids and start times as last time: no rank restarted
            incarnations, seen = self.incarnations, self.seen
            for r, inc in zip(cols.rank, zip(cols.pid, cols.proc_start_us)):
                old = incarnations.get(r)
                if old != inc:
                    if old is not None:
                        changed = True
                        seen.pop(r, None)  # a new incarnation's history starts afresh
                    incarnations[r] = inc
            self._tracked = now
        if self.started and not all(cols.alive):
            # a rank died (not one that exited): the job waits for the restart from here
            changed = any(not a and s != "exited" for a, s in zip(cols.alive, cols.status)) or changed
        return changed

    def _take(
        self,
        live: list[int],
        hists: Sequence[tuple[StepSample, ...]],
        flats: Sequence[array],
        newest_steps: Sequence[float] | None = None,
    ) -> None:
        """Buffer the live ranks' steps since the last tick.

        Only the steps since the last tick: walking the whole history of every
        rank every tick cost 0.3 s a tick at 16,384 ranks. They are read from
        each rank's flat numbers (``StepStats.flat``), not from its StepSample
        objects: an array is one object, where a sample is an object, three
        floats and a step number scattered in memory. The ranks whose last step
        taken and newest step are the same (nearly all: a report interval holds
        the same steps on every host, give or take one) form a run, found and
        buffered through C-level calls over whole columns, without a Python
        statement per rank. A rank whose new steps are not the plain case (its
        first steps, more than its flat numbers hold, a gap, steps out of order)
        is read from its history, as before.

        ``newest_steps``: each flat's newest step number (``columns.NO_STEP`` for an empty
        one), the view's ``step_newest`` column, written as the ranks folded: read
        from it, not from 16,384 arrays (~3 ms of cache misses a tick)."""
        seen = self.seen
        slow: _Samples = {}  # steps read from histories, buffered at the end
        lasts: list[int | None] = list(map(seen.get, live))
        newests: list[float] | None = None
        if None not in lasts:
            if newest_steps is not None:
                if not newest_steps or min(newest_steps) != columns.NO_STEP:  # else a rank without flat numbers
                    newests = list(newest_steps)
            else:
                try:
                    newests = list(map(itemgetter(-FLAT_FIELDS), flats))
                except IndexError:  # a rank without flat numbers
                    pass
        if newests is None:  # some ranks are read from their history
            plain = [bool(f) and last is not None for f, last in zip(flats, lasts)]
            for r, hist in compress(zip(live, hists), map(not_, plain)):
                if hist:
                    self._take_from_history(r, hist, slow)
            live, hists, flats = list(compress(live, plain)), list(compress(hists, plain)), list(compress(flats, plain))
            lasts = list(compress(lasts, plain))
            newests = list(map(itemgetter(-FLAT_FIELDS), flats))
        if lasts and max(cast(list[int], lasts)) >= _EXACT:  # (no None left) a step number beyond 2^53: rare
            for r, hist in zip(live, hists):
                self._take_from_history(r, hist, slow)
            lasts = []
        for run, rows in _runs(cast(list[int], lasts), newests).items():
            last, newest = int(run.real), run.imag
            if newest <= last:
                continue  # nothing new
            ranks = list(map(live.__getitem__, rows))
            n = int(newest) - last
            if self._buffer_run(last, n, ranks, list(map(flats.__getitem__, rows))):
                seen.update(zip(ranks, repeat(last + n)))
            else:  # not the plain case for some rank of the run: each from its history
                for r, hist in zip(ranks, map(hists.__getitem__, rows)):
                    self._take_from_history(r, hist, slow)
        self._buffer_samples(slow)

    def _take_from_history(self, r: int, hist: tuple[StepSample, ...], into: _Samples) -> None:
        """Rank ``r``'s new steps from its history (the plain walk), into ``into``."""
        last = self.seen.get(r)
        newest = hist[-1].step
        if last is None:
            new = 0
        elif newest <= last:
            return
        else:  # steps are in order, usually consecutive: then the first new one is found without a search
            new = len(hist) - (newest - last)
            if not (0 < new <= len(hist) and hist[new - 1].step == last):
                new = bisect_right(hist, last, key=_NUMBER)
        for x in hist[new:]:
            got = into.get(x.step)
            if got is None:
                got = into[x.step] = ([], [], [], [], [])
            step_s, data_s = x.step_s, x.data_s
            got[0].append(r)
            got[1].append(step_s)
            got[2].append(data_s)
            got[3].append(step_s - data_s - x.coll_s)
            got[4].append(1.0 if x.phase in _PAUSES else 0.0)
        self.seen[r] = newest

    def _buffer_samples(self, samples: _Samples) -> None:
        """Buffer what ``_take_from_history`` gathered, a step at a time."""
        buffer = self.buffer
        for step, (ranks, *values) in samples.items():
            got = buffer.get(step)
            if got is None:
                got = buffer[step] = StepColumns()
            got.extend(ranks, *(array("d", v) for v in values))

    def _buffer_run(self, last: int, n: int, ranks: list[int], arrays: list[array]) -> bool:
        """Buffer steps ``last + 1`` .. ``last + n`` of these ranks from their
        flat numbers, where each one's last ``n + 1`` samples should be steps
        ``last`` .. ``last + n`` (the one before the new ones is the last taken,
        and the new ones follow it without a gap or a turn: what the ledger's
        history walk takes without a search). False, with nothing buffered, if
        that is not so for every rank.

        The ranks' last ``n + 1`` samples are copied into one array (their bytes
        joined): each step's column of each value is then a strided slice of
        it, and the check one comparison of bytes."""
        width = (n + 1) * FLAT_FIELDS
        both = array("d")
        both.frombytes(b"".join(map(_tail, arrays, repeat(slice(-width, None)))))
        want = array("d", range(last, last + n + 1)).tobytes() * len(arrays)
        if len(both) != width * len(arrays) or both[::FLAT_FIELDS].tobytes() != want:
            return False
        buffer = self.buffer
        for k in range(1, n + 1):
            at = k * FLAT_FIELDS
            got = buffer.get(last + k)
            if got is None:
                got = buffer[last + k] = StepColumns()
            got.extend(ranks, *(both[at + j :: width] for j in (1, 2, 3, 4)))
        return True

    def _ready_steps(self, live: list[int]) -> list[tuple[int, StepColumns]]:
        if not self.buffer:
            return []
        newest = max(self.buffer)
        want = set(live)
        out = []
        for step in sorted(self.buffer):
            got = self.buffer[step]
            if (len(got) >= len(want) and want <= got.seen) or step + self.stale_steps <= newest:
                out.append((step, self.buffer.pop(step)))
        return out

    def _split(self, steps: list[tuple[int, StepColumns]]) -> None:
        parts = dict.fromkeys(CATEGORIES, 0.0)
        for number, got in steps:
            # Whole columns through C-level calls: this runs for every rank of
            # every step (~65,000 samples a second at 16,384 ranks).
            step_s = max(got.step_s)
            if number <= self.max_step:
                parts[REDONE] += step_s
                continue
            self.max_step = number
            if got.paused():
                parts[CHECKPOINT_EVAL] += step_s
                paused = [r for r, p in zip(got.ranks, got.pause) if p]
                if len(paused) < len(got):  # not the whole job: the others waited for these
                    self.stalls.pause(number, max(0.0, step_s - self.profile["step_s"]), paused)
                continue
            datas = got.data_s
            computes: Sequence[float] = got.compute_s  # compute_s: s - d - c ...
            if min(computes) < 0.0:
                computes = [max(0.0, c) for c in computes]  # ... not below 0
            data = median(datas)
            compute = median(computes)
            owns = list(map(add, computes, datas))  # each rank's own work: what the others wait for
            top = max(owns)
            i = owns.index(top)
            excess = top - compute - data
            slow = max(0.0, excess)
            cost = max(0.0, step_s - self.profile["step_s"]) if self.steps else None
            self.stalls.add(SplitStep(number, step_s, got.ranks[i], excess, datas[i] - data, len(got)), cost)
            coll = max(0.0, step_s - data - compute - slow)
            self.coll_history = (self.coll_history + [coll])[-BASELINE_SAMPLES:]
            base = min(coll, quantile(self.coll_history, BASELINE_QUANTILE))
            parts[PRODUCTIVE] += compute + base
            parts[DATA_WAIT] += data
            parts[STRAGGLER] += slow
            parts[COLLECTIVE_WAIT] += coll - base
            n = self.steps + 1
            for key, val in (("step_s", step_s), ("compute_s", compute), ("coll_s", coll), ("data_s", data)):
                self.profile[key] += (val - self.profile[key]) / n
            self.steps = n
        if sum(parts.values()) > 0:
            self.last_parts = parts
        self._allocate(parts)

    def _allocate(self, parts: dict[str, float]) -> None:
        """The wall time pending, in the proportions of the steps it held."""
        total = sum(parts.values())
        if total <= 0 or self.pending <= 0:
            return
        for c, v in parts.items():
            self.seconds[c] += self.pending * v / total
        self.pending = 0.0

    # -- reading -------------------------------------------------------------------

    def total(self) -> float:
        return sum(self.seconds.values())

    def goodput(self) -> float:
        t = self.total()
        return self.seconds[PRODUCTIVE] / t if t > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        t = self.total()
        return {
            "seconds": {c: round(v, 3) for c, v in self.seconds.items()},
            "shares": {c: round(v / t, 4) if t > 0 else 0.0 for c, v in self.seconds.items()},
            "total_s": round(t, 3),
            "pending_s": round(self.pending, 3),
            "goodput": round(self.goodput(), 4),
            "steps": self.steps,
            "world_sizes": sorted(self.world_sizes),
            "profile": {k: round(v, 6) for k, v in self.profile.items()},
        }


def _patience(newest: Sequence[float]) -> int:
    """``STALE_STEPS`` plus how far the live ranks' newest step samples lag the
    newest (from their ``LAG_QUANTILE``), at most ``STALE_STEPS_MAX``: with samples
    sent in batches, a rank whose batch is still to come is not missing its steps."""
    steps = sorted(x for x in newest if x != columns.NO_STEP)
    if not steps:
        return STALE_STEPS
    lag = steps[-1] - steps[int(LAG_QUANTILE * (len(steps) - 1))]
    return int(min(STALE_STEPS_MAX, STALE_STEPS + lag))


def summary_line(s: dict[str, Any]) -> str:
    """One line for a person: goodput, then the losses, largest first."""
    parts = [
        f"{c.replace('_', ' ')} {v:.1%}"
        for c, v in sorted(s["shares"].items(), key=lambda kv: -kv[1])
        if c != PRODUCTIVE and v >= 0.001
    ]
    return f"goodput {s['goodput']:.1%} of {s['total_s']:.1f} s" + (f" (lost: {', '.join(parts)})" if parts else "")


def job_span(records: list[dict[str, Any]]) -> float | None:
    """From a journal's records: wall seconds from the coordinator's start to the
    last rank's clean exit (what the counters should add up to, less the first
    tick and plus at most a report interval); None when no rank exited cleanly."""
    start = next((r["t_wall"] for r in records if r.get("event") == je.START), None)
    ends = [
        r["t_wall"]
        for r in records
        if r.get("event") == je.STATE and (r.get("changed") or {}).get("status", [""])[-1] == "exited"
    ]
    return max(ends) - start if start is not None and ends else None


def _runs(lasts: list[int], newests: list[float]) -> dict[complex, list[int]]:
    """The rows (indices of ``lasts``) by run: ranks whose last step taken and newest
    step are the same. Runs keyed by (last step taken, newest step) as one complex
    number, exact below 2^53: a key the collector does not track and that hashes in C."""
    runs: dict[complex, list[int]] = {}  # key -> the rows (in ``live``) of its ranks
    # Only the rows with a step newer than the last taken (a C-level filter): the
    # others add nothing, and between their host's reports (back-pressure spaces them
    # 2-3 s apart at 16,384 ranks) most ranks have none. The same runs, rows and
    # order: a run's key says whether it has new steps, so a run is kept or left whole.
    fresh = list(map(lt, lasts, newests))
    keys = map(complex, compress(lasts, fresh), compress(newests, fresh))
    for i, run in zip(compress(range(len(fresh)), fresh), keys):
        got = runs.get(run)
        if got is None:
            runs[run] = [i]
        else:
            got.append(i)
    return runs
