"""Back-pressure: when the coordinator falls behind, it says so and asks agents
to report less often, instead of letting reports pile up in socket buffers.

"Behind" is how late the request loop runs (``httpio`` probes it every 0.1 s):
every report is handled on that loop, so its lag is how long a report waits
before it is folded. Past ``BEHIND_S`` (the worst lag over the last second) the
replies carry ``"report_interval_s": SLOW_INTERVAL_S``; agents report at the
longer of that and their own interval (an agent that does not know the field
ignores it). The advice is withdrawn once the lag stayed under ``CALM_S`` for
``CALM_FOR_S``.

How detection degrades, and why never with a false finding:
- ``SLOW_INTERVAL_S`` is 2 s: every report still carries the agent's own
  readings (heartbeat age, collective state), so a finding waits at most one
  more second for its evidence. When the coordinator accepts fewer reports than
  the hosts send (its deficit), it asks for the pace it can keep: the time it
  takes to hear from every host once, x ``HEADROOM``, at most ``MAX_INTERVAL_S``;
  findings then wait up to that interval for their evidence.
- A host's silence limit is counted in the interval it *reports* (dead_rank,
  health.lost_hosts), so a slowed host is not a lost one; and the coordinator's
  own lag is added to every silence limit (``ClusterView.behind_s``), so reports
  still queued are not taken for silence; so is its deficit, when it accepts
  fewer reports than the hosts send and so hears from each one less often; and
  so is how old reports are when it reads them (``note_delay``: at 16,384 ranks
  on a starved core they sat 15-30 s in socket buffers, unseen by the loop's
  lag, and the hosts looked silent: 231 false dead_rank findings before this).
- A small job is never slowed down: below ``MIN_ADVISE_RATE`` reports a second
  reports cost a few ms of CPU a second, so a late loop there is late for
  another reason (a loaded machine: four ranks importing torch on two cores
  lagged it 0.6 s) and slowing the agents would only have found a dead rank
  later. The lag still counts in every silence limit; only the advice waits.
  So does a deficit: hosts that send fewer than ``MIN_ADVISE_RATE`` reports a
  second between them are heard from less often because their agents are late
  or their ranks not yet started, not because reports queue here.
- Before any of that, at ``STEPS_FROM_RATE`` reports a second or more, replies
  carry ``"steps_interval_s": STEPS_INTERVAL_S``: agents then send their ranks'
  step samples (and step summaries) every 4 s instead of in every report, each
  agent from a random point within the 4 s (in step, all the job's samples would
  come in one second of four), and every report still carries each rank's
  heartbeat, step, collective state and death. A report without samples costs
  the coordinator about half as much (at 16,384 ranks in process: ~260 against
  ~480 us). Findings read from liveness
  (dead_rank, frozen_rank, collective_hang, never_joined) are not delayed; those
  read from step samples (straggler, loader_starvation, the verdict, goodput)
  see them up to 4 s later. The goodput ledger waits for a step as long as the
  ranks' samples lag one another (``goodput``), so batched samples are not split
  as missing. Withdrawn below ``STEPS_UNTIL_RATE``.
- The hang deadline's 5 s floor covers a 2 s interval plus a step: progress
  seen one report late is not a hang; and the coordinator's lag is added to the
  deadline too, since progress still queued is not the absence of progress.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, insort
from collections import deque
from typing import Any

from ..metrics import CoordinatorMetrics

BEHIND_S = 0.5  # loop lag that counts as behind (a busy 2-core VM alone lags 0.1-0.3 s)
CALM_S = 0.05
CALM_FOR_S = 10.0
SLOW_INTERVAL_S = 2.0
MAX_INTERVAL_S = 10.0  # the longest interval agents accept as advice (agent.sender)
HEADROOM = 1.25  # ask for this much longer than the time it takes to get round every host
WINDOW_S = 1.0
RATE_WINDOW_S = 10.0
MIN_ADVISE_RATE = 20.0  # reports a second below which report handling cannot be what makes the loop late
STEPS_FROM_RATE = 400.0  # reports a second from which agents are asked to send step samples less often
STEPS_UNTIL_RATE = 300.0  # ... until the rate falls below this (not on and off around one rate)
STEPS_INTERVAL_S = 4.0
PROBE_S = 0.1  # how often the loop is probed (httpio.LAG_PROBE_S)
MAX_QUEUED_S = 120.0  # a report older than this on arrival says more about its host's clock than about us


class Backpressure:
    def __init__(self, metrics: CoordinatorMetrics | None = None) -> None:
        self._metrics = metrics
        # The request loop writes these and the tick thread reads them: iterating a
        # deque another thread appends to raises ("deque mutated during iteration",
        # which failed ticks at 16,384 ranks).
        self._lock = threading.Lock()
        self._recent: deque[tuple[float, float]] = deque()  # (when, lag)
        self._calm_since: float | None = None
        self.behind_s = 0.0  # worst lag over the last WINDOW_S
        self.interval_s = 0.0  # asked of agents; 0 = none
        self.steps_interval_s = 0.0  # how often agents are asked to send step samples; 0 = in every report
        self._last_probe: float | None = None
        self._accepted = Recent(RATE_WINDOW_S)  # when recent reports were accepted
        self._first_report: float | None = None
        self.deficit_s = 0.0  # last computed by ``deficit``
        self._deficit_is_ours = False  # whether that deficit is the coordinator's to advise on
        self.revisit_s = 0.0  # how long it takes to hear from every host once, at the accepted rate
        self._delays = Recent(RATE_WINDOW_S)  # how long recent reports were queued
        self._base: dict[str, float] = {}  # host -> least arrival age seen (its clock offset, and no queue)
        self._advised: dict[float, float] = {}  # interval advised -> when it was last sent (few distinct values)

    def note_report(self, now: float) -> None:
        """An accepted report (monotonic seconds)."""
        if self._first_report is None:
            self._first_report = now
        with self._lock:
            self._accepted.add(now, 0.0)

    def note_delay(self, host: str, delay_s: float, now: float) -> None:
        """How old an accepted report was when it was folded (the coordinator's wall
        clock minus the report's ``sent_wall``), less the least any report of that
        host ever showed: its clock's offset from ours cancels out, and what is left
        is time spent queued in socket buffers, which neither the loop's lag nor its
        throughput shows. A clock stepped forward makes it larger (detection later,
        never wrong); one host far off does not move the 99th percentile."""
        base = self._base.get(host)
        if base is None or delay_s < base:
            self._base[host] = base = delay_s
        with self._lock:
            self._delays.add(now, min(MAX_QUEUED_S, delay_s - base))

    def queued(self, now: float) -> float:
        """99th percentile of how old reports were on arrival over the last ``RATE_WINDOW_S``."""
        with self._lock:
            return self._delays.quantile(0.99, now)

    def rate(self, now: float) -> float:
        """Reports accepted a second over the last ``RATE_WINDOW_S`` (or since the first)."""
        if self._first_report is None:
            return 0.0
        span = max(1.0, min(RATE_WINDOW_S, now - self._first_report))
        with self._lock:
            return self._accepted.count_since(now - span, now) / span

    def deficit(self, now: float, hosts: int, interval_s: float) -> float:
        """How much longer than a report interval the coordinator takes to get round
        every host, from the rate it accepted reports at over the last
        ``RATE_WINDOW_S``. A starved coordinator's loop can run on time while it
        handles a tenth of what arrives; then each host is heard from every
        ``hosts / rate`` seconds, and that, not the host, is the silence."""
        if self._first_report is None or hosts == 0:
            self.deficit_s = 0.0
            return 0.0
        span = min(RATE_WINDOW_S, now - self._first_report)
        with self._lock:
            n = self._accepted.count_since(now - span, now) if span > 0 else 0
        revisit = hosts * span / n if n else span
        self.revisit_s = revisit if span >= interval_s else 0.0
        self.deficit_s = max(0.0, revisit - interval_s) if span >= interval_s else 0.0
        # Hosts that send fewer than MIN_ADVISE_RATE reports a second between them are not
        # short of reports for the coordinator's sake: their agents are late (a loaded
        # machine) or their ranks have not all started (``hosts`` counts those not heard
        # from yet). One host of a 4-rank demo, its ranks seen one by one, counted as four
        # and was told to report every 2 s instead of 0.25, for the rest of the job.
        self._deficit_is_ours = hosts / max(interval_s, 1e-3) >= MIN_ADVISE_RATE
        return self.deficit_s

    def behind(self, now: float) -> float:
        """How far behind, as the tick sees it at ``now`` (monotonic, the loop's
        clock): the last measured lag, or longer while the loop is stuck right now
        (a probe measures a stall only once it ends; the tick must not wait for that)."""
        stalled = now - self._last_probe - PROBE_S if self._last_probe is not None else 0.0
        return max(self.behind_s, stalled, self.queued(now))

    def observe_lag(self, lag: float, now: float) -> None:
        """Called by the loop's probe (loop time, seconds)."""
        self._last_probe = now
        self._recent.append((now, lag))
        while self._recent and self._recent[0][0] < now - WINDOW_S:
            self._recent.popleft()
        self.behind_s = max(x for _, x in self._recent)
        rate = self.rate(now)
        late = (self.behind_s > BEHIND_S or self.queued(now) > BEHIND_S) and rate >= MIN_ADVISE_RATE
        deficit = self.deficit_s if self._deficit_is_ours else 0.0
        if late or deficit > BEHIND_S:
            # The pace it can keep: at 16,384 ranks on half a core a 2 s interval
            # still sent twice what was handled, and the queue never drained.
            pace = max(self.revisit_s if deficit > BEHIND_S else 0.0, self.queued(now)) * HEADROOM
            pace = round(pace, 1)
            self.interval_s, self._calm_since = min(MAX_INTERVAL_S, max(SLOW_INTERVAL_S, pace)), None
        elif self.interval_s and self.behind_s < CALM_S and deficit < CALM_S:
            if self._calm_since is None:
                self._calm_since = now
            elif now - self._calm_since >= CALM_FOR_S:
                self.interval_s, self._calm_since = 0.0, None
        if rate >= STEPS_FROM_RATE:
            self.steps_interval_s = STEPS_INTERVAL_S
        elif rate < STEPS_UNTIL_RATE:
            self.steps_interval_s = 0.0
        if self._metrics is not None:
            self._metrics.behind.set(self.behind_s)
            self._metrics.advised_interval.set(self.interval_s)
            self._metrics.advised_steps_interval.set(self.steps_interval_s)

    def advise(self, reply: dict[str, Any], now: float) -> None:
        """Add the advice to an accepted report's reply (absent while calm)."""
        if self.steps_interval_s:
            reply["steps_interval_s"] = self.steps_interval_s
        if self.interval_s:
            reply["report_interval_s"] = self.interval_s
            if self._advised.get(self.interval_s) != now:
                with self._lock:
                    self._advised[self.interval_s] = now

    def steps_batched(self) -> bool:
        """Whether agents may be sending their step samples in batches (advised now)."""
        return self.steps_interval_s > 0

    def advised_in_effect(self, now: float) -> float:
        """The longest interval sent as advice recently enough that an agent may
        still be following it (within two of its intervals): the host that got it
        reports that much later, which its silence limit must allow (the report
        carrying the advice stated the agent's old interval). 0 when none."""
        with self._lock:
            for iv in [iv for iv, t in self._advised.items() if now - t > 2 * iv]:
                del self._advised[iv]
            return max(self._advised, default=0.0)


class Recent:
    """(when, value) pairs of the last ``span`` seconds, the values also kept
    sorted. At 16,384 ranks ~20,000 reports fall in the window, and the probe
    (ten times a second) and the tick read its 99th percentile and its count:
    sorting and counting all of them on each read cost ~5% of the coordinator's
    CPU (py-spy, benchmarks/scale.py). Here a report costs an insertion and a
    read costs the pairs that left the window since the last one.

    Pairs older than ``now - span`` at any call are dropped for good: callers
    pass monotonic times, so a later call never wants them back (a tick's
    ``now``, taken a little before a probe's, sees the window as of the probe).
    Not thread-safe: the owner holds its lock."""

    __slots__ = ("_fifo", "_sorted", "_span")

    def __init__(self, span: float) -> None:
        self._span = span
        self._fifo: deque[tuple[float, float]] = deque()
        self._sorted: list[float] = []

    def add(self, when: float, value: float) -> None:
        if value != value:  # NaN would break the sorted order; reports never carry one (schema)
            return
        self._fifo.append((when, value))
        insort(self._sorted, value)
        self._expire(when)

    def _expire(self, now: float) -> None:
        fifo, values, edge = self._fifo, self._sorted, now - self._span
        while fifo and fifo[0][0] < edge:
            del values[bisect_left(values, fifo.popleft()[1])]

    def quantile(self, q: float, now: float) -> float:
        """The value at ``int(q * (n - 1))`` in sorted order of the last ``span``
        seconds' n values; 0.0 when there are none."""
        self._expire(now)
        values = self._sorted
        return values[int(q * (len(values) - 1))] if values else 0.0

    def count_since(self, since: float, now: float) -> int:
        """How many pairs of the last ``span`` seconds came at ``since`` or later."""
        self._expire(now)
        older = 0
        for when, _ in self._fifo:  # only the window's oldest: since is within it or before
            if when >= since:
                break
            older += 1
        return len(self._fifo) - older

    def __len__(self) -> int:
        return len(self._fifo)
