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

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import add, attrgetter, itemgetter, sub
from typing import Any

from watchdog.report import StepSample

from . import columns
from . import journal_events as je
from .columns import RankColumns
from .stats import median, quantile
from .view import ClusterView

PRODUCTIVE, DATA_WAIT, COLLECTIVE_WAIT, STRAGGLER, CHECKPOINT_EVAL, RESTART, REDONE, STARTUP = (
    "productive",
    "data_wait",
    "collective_wait",
    "straggler",
    "checkpoint_eval",
    "restart",
    "redone",
    "startup",
)
CATEGORIES = (PRODUCTIVE, DATA_WAIT, COLLECTIVE_WAIT, STRAGGLER, CHECKPOINT_EVAL, RESTART, REDONE, STARTUP)
PAUSE_PHASES = ("checkpoint", "eval")
BASELINE_QUANTILE = 0.2  # the job's own collective cost per step: its 20th percentile
BASELINE_SAMPLES = 512
# A buffered sample: (step, step_s, data_s, coll_s, phase), read from its StepSample once.
Buffered = tuple[int, float, float, float, str]
_VALUES = attrgetter("step", "step_s", "data_s", "coll_s", "phase")
_AT_STEP, _STEP, _DATA, _COLL, _PHASE = (itemgetter(i) for i in range(5))
_NUMBER = attrgetter("step")
_PAUSES = frozenset(PAUSE_PHASES)
STALE_STEPS = 8  # a step some live rank still has not reported this many steps later is split without it


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
    buffer: dict[int, dict[int, Buffered]] = field(default_factory=dict)  # step -> rank -> sample's values
    coll_history: list[float] = field(default_factory=list)
    world_sizes: set[int] = field(default_factory=set)
    # Per-step means for the scaling report: step, compute (median rank), collective, data.
    profile: dict[str, float] = field(
        default_factory=lambda: {"step_s": 0.0, "compute_s": 0.0, "coll_s": 0.0, "data_s": 0.0}
    )
    # (ranks, pids, start times) when incarnations were last followed: unchanged, no rank restarted
    _tracked: tuple = field(default=(), repr=False, compare=False)

    def tick(self, now: float, view: ClusterView, restarting: bool = False) -> None:
        dt = 0.0 if self.last_tick is None else max(0.0, now - self.last_tick)
        self.last_tick = now
        # Every rank exited cleanly: the job is over, and a coordinator that lingers is not its time.
        status = columns.of(view).status
        over = bool(status) and status.count("exited") == len(status)
        if over and self.ended:
            return
        self.ended = False
        live, changed, pausing = self._scan(view, track=not restarting)
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
        if over and self.started:
            # The last steps' share of time still pending goes by the last proportions seen.
            self._allocate(self.last_parts or {PRODUCTIVE: 1.0})
            self.ended = True

    # -- bookkeeping ---------------------------------------------------------------

    def _scan(self, view: ClusterView, track: bool = True) -> tuple[list[int], bool, bool]:
        """The ranks whose process lives (the ones whose steps the job waits on),
        whether an incarnation changed or a rank died (``track``: restarts are
        followed), and whether a live rank is in a checkpoint or eval phase; their
        steps since the last tick go into the buffer.

        Read from the view's columns (columns.py), not from 16,384 rank objects: a
        pass over those cost ~10-30 ms of cache misses alone at 16,384 ranks."""
        cols = columns.of(view)
        changed = self._track(cols) if track else False
        hists: Sequence[tuple[StepSample, ...]]
        if all(cols.alive) and "exited" not in cols.status:  # every rank live: no mask to apply
            live, hists = list(cols.rank), cols.step_history
            self.world_sizes.update(cols.world_size)
            pausing = not _PAUSES.isdisjoint(cols.phase)
        else:
            mask = [a and s != "exited" for a, s in zip(cols.alive, cols.status)]
            live, hists = list(compress(cols.rank, mask)), list(compress(cols.step_history, mask))
            self.world_sizes.update(compress(cols.world_size, mask))
            pausing = not _PAUSES.isdisjoint(compress(cols.phase, mask))
        self._take(live, hists)
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

    def _take(self, live: list[int], hists: Sequence[tuple[StepSample, ...]]) -> None:
        """Buffer the live ranks' steps since the last tick, as flat values.

        Only the steps since the last tick: walking the whole history of every
        rank every tick cost 0.3 s a tick at 16,384 ranks. The ranks whose new
        steps are the same run of step numbers (nearly all of them: a report
        interval holds the same steps on every host, give or take one) form a
        group, buffered step by step through C-level maps; each sample is read
        once, here, into a tuple (``_VALUES``) that the split reads instead of
        16,384 scattered objects."""
        seen = self.seen
        groups: dict[tuple[int, int], tuple[list[int], list[tuple[StepSample, ...]]]] = {}
        for r, hist in zip(live, hists):
            if not hist:
                continue
            newest = hist[-1].step
            last = seen.get(r)
            if last is None:
                chunk = hist
                key = (hist[0].step, len(hist))
            elif newest <= last:
                continue
            else:  # steps are in order, usually consecutive: then the first new one is found without a search
                new = len(hist) - (newest - last)
                if 0 < new <= len(hist) and hist[new - 1].step == last:
                    chunk = hist[new:]
                    key = (last + 1, len(chunk))
                else:
                    chunk = hist[bisect_right(hist, last, key=_NUMBER) :]
                    key = (chunk[0].step if chunk else 0, len(chunk))
            seen[r] = newest
            if not chunk:
                continue
            got = groups.get(key)
            if got is None:
                groups[key] = ([r], [chunk])
            else:
                got[0].append(r)
                got[1].append(chunk)
        for (first, n), (ranks, chunks) in groups.items():
            self._buffer_group(first, n, ranks, chunks)

    def _buffer_group(self, first: int, n: int, ranks: list[int], chunks: list[tuple[StepSample, ...]]) -> None:
        """Buffer ``chunks`` (one per rank, ``n`` samples each, expected to be
        steps ``first`` .. ``first + n - 1``) a step at a time; a chunk whose
        step numbers are not that run (a report's steps out of order) sends the
        group through the plain loop, which files each sample under its own step."""
        buffer = self.buffer
        rows: list[list[Buffered]] = []
        for k in range(n):
            vals = list(map(_VALUES, map(itemgetter(k), chunks)))
            if list(map(_AT_STEP, vals)).count(first + k) != len(vals):
                for r, chunk in zip(ranks, chunks):
                    for x in chunk:
                        got = buffer.get(x.step)
                        if got is None:
                            got = buffer[x.step] = {}
                        got[r] = _VALUES(x)
                return
            rows.append(vals)
        for k, vals in enumerate(rows):
            got = buffer.get(first + k)
            if got is None:
                got = buffer[first + k] = {}
            got.update(zip(ranks, vals))

    def _ready_steps(self, live: list[int]) -> list[dict[int, Buffered]]:
        if not self.buffer:
            return []
        newest = max(self.buffer)
        want = set(live)
        out = []
        for step in sorted(self.buffer):
            got = self.buffer[step]
            # keys() is set-like: no set of 16,384 ranks built per buffered step and tick
            if (len(got) >= len(want) and want <= got.keys()) or step + STALE_STEPS <= newest:
                out.append(self.buffer.pop(step))
        return out

    def _split(self, steps: list[dict[int, Buffered]]) -> None:
        parts = dict.fromkeys(CATEGORIES, 0.0)
        for got in steps:
            xs = list(got.values())
            number = xs[0][0]
            # Column by column through C-level map, each column read once: this runs
            # for every rank of every step (~65,000 samples a second at 16,384 ranks).
            step_times = list(map(_STEP, xs))
            step_s = max(step_times)
            if number <= self.max_step:
                parts[REDONE] += step_s
                continue
            self.max_step = number
            if not _PAUSES.isdisjoint(map(_PHASE, xs)):
                parts[CHECKPOINT_EVAL] += step_s
                continue
            datas = list(map(_DATA, xs))
            computes = list(map(sub, map(sub, step_times, datas), map(_COLL, xs)))  # compute_s: s - d - c ...
            if min(computes) < 0.0:
                computes = [max(0.0, c) for c in computes]  # ... not below 0
            data = median(datas)
            compute = median(computes)
            slow = max(0.0, max(map(add, computes, datas)) - compute - data)
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
