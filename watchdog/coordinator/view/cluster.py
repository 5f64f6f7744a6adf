"""The cluster view and the pure fold of one host report into it.

The view is immutable: ``fold`` returns a new view (copying two small dicts), so
the tick can run detectors on the view it read while reports keep arriving, with
no lock held. Only the daemon reads the clock; ``fold`` gets ``now`` (coordinator
monotonic seconds) as an argument.

Ages. A report carries ages measured by the agent at send time (monotonic clocks
are not comparable across hosts). An age at ``now`` is the age at send plus the
time since the coordinator received it; network latency is ignored (ms).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, cast

from watchdog.contracts.journal.ranks import HostSeenRecord, RankJoinedRecord, RankRestartedRecord, StateRecord
from watchdog.contracts.journal.record import Record
from watchdog.report import CollSig, GpuStep, HostReport, RankState, StepSample, made, twinned

from ...stepstats.history import Steps
from ...stepstats.steps import StepStats, WindowStat, add_samples, summary_config, with_summary
from ..config import DetectorConfig
from . import columns, loss_screen

_EMPTY: Mapping = MappingProxyType({})
LOSS_HISTORY = 64
COLL_HISTORY = 32  # Flight Recorder signatures kept per rank (the newest by sequence)
GPU_STALE_STEPS = 64  # a GPU-clock split this many steps behind the CPU side's is no longer read


@twinned
@dataclass(frozen=True, slots=True)  # one per rank per report: slots are built ~4x faster (``made``)
class FoldedRank:
    """One rank as the coordinator knows it: every report about it folded
    together (latest state, progress and death times, step statistics), per
    incarnation. (The agent's reading of a local rank is ``agent.slots.LocalRank``.)"""

    state: RankState  # latest, as reported
    host: str
    received_at: float  # when the report carrying ``state`` arrived
    registered_at: float  # first seen (this incarnation: pid + start time)
    progress_at: float  # last evidence of progress: a step completed or a collective moved
    last_alive_at: float  # latest report that said the process exists
    heartbeat_moved: bool = False  # the hook's heartbeat was seen to beat at least once
    step_stats: StepStats = StepStats()  # what its step samples say (watchdog/stepstats/steps.py)
    died_at: float | None = None  # estimate, set by the first report that said the process is gone
    died_precise: bool = False  # from the agent's gone_age_s (poll resolution), not a bound
    dead_seen_at: float | None = None
    # Finite losses seen, oldest first, at most LOSS_HISTORY: one per report at most
    # (the latest at read time), for loss_anomaly's robust bound. As two arrays (the
    # step each ended, the loss), new ones per new loss, never mutated: 64 (step, loss)
    # tuples per rank were ~7 KB each, 115 MB of small objects at 16,384 ranks.
    loss_steps: array = field(default_factory=lambda: array("q"))
    loss_values: array = field(default_factory=lambda: array("d"))
    loss_calm: bool = True  # no spike possible in ``loss_values`` (loss_screen.calm), decided as they change
    # The rank's recent collectives as its Flight Recorder saw them, each with its
    # creation time on the coordinator's clock, by (group, seq), at most COLL_HISTORY.
    colls: tuple[tuple[CollSig, float], ...] = ()
    # The same, as ((group, seq), comparable signature, time): built once per report
    # that brings new ones, so comparing thousands of ranks each tick stays cheap.
    coll_keys: tuple[tuple[tuple[int, int], tuple, float], ...] = ()
    # The same step statistics on the accelerator's clock (report.GpuStep: step time
    # between GPU step completions, GPU-side collective wait), for ranks whose hook
    # has a completion source. On NCCL the CPU side reads collective wait ~0: where
    # these exist, the split that detectors read comes from them (``split_stats``).
    gpu_stats: StepStats = StepStats()
    gpu_last: GpuStep | None = None  # the latest step the accelerator finished, as reported
    # When the incarnation this one replaced died (None: it did not, as far as reports
    # showed). A restart replaces the root cause's record first as often as not; dead_rank
    # still orders the deaths of the teardown after it, so a victim left in the view with
    # the earliest death on record is not named as a new root cause.
    previous_died_at: float | None = None
    # (last beat before, first beat after) the latest gap in its heartbeat longer than a
    # stopped rank's frozen threshold, as its agent read it: a rank that was stopped and
    # runs again. Ranks resumed from a job-wide stop report it host by host, seconds apart;
    # the ones reported later are not frozen on their own (analysis/wedge.py).
    resumed: tuple[float, float] | None = None

    @property
    def rank(self) -> int:
        return self.state.rank

    @property
    def split_stats(self) -> StepStats:
        """The step split detectors read: the GPU clock's when the rank has one
        that keeps up (a completion source that failed mid-run stops it: its old
        windows must not stand for the rank's present)."""
        return self.gpu_stats if self.gpu_current() else self.step_stats

    @property
    def split_clock(self) -> str:
        """Which clock ``split_stats`` (``history``, ``windows``) came from: "gpu" or "cpu"."""
        return "gpu" if self.gpu_current() else "cpu"

    def gpu_current(self) -> bool:
        g, c = self.gpu_stats.history, self.step_stats.history
        if not self.gpu_stats.steps_seen:
            return False
        return not g or not c or g[-1].step + GPU_STALE_STEPS >= c[-1].step

    # Detectors read the step statistics as the rank's own attributes.
    @property
    def steps_seen(self) -> int:
        return self.step_stats.steps_seen

    @property
    def history(self) -> tuple[StepSample, ...]:
        # A stephistory.History (or a tuple): it reads as the tuple of its samples
        # (tests/test_coord_stephistory.py), so readers typed for a tuple keep
        # their annotations; only StepStats builds and mutates histories.
        return cast(tuple[StepSample, ...], self.split_stats.history)

    @property
    def windows(self) -> tuple[WindowStat, ...]:
        return self.split_stats.windows

    @property
    def p99_step_s(self) -> float:
        return self.step_stats.p99_step_s

    @property
    def train_steps(self) -> int:
        return self.step_stats.train_steps

    @property
    def data_share(self) -> float:
        return self.step_stats.data_share

    @property
    def incarnation(self) -> tuple[int, int]:
        return (self.state.pid, self.state.proc_start_us)

    def age(self, age_at_send: float, now: float) -> float:
        return age_at_send + max(0.0, now - self.received_at)

    def heartbeat_age(self, now: float) -> float:
        return self.age(self.state.heartbeat_age_s, now)

    def last_heartbeat(self) -> float:
        return self.received_at - self.state.heartbeat_age_s

    def step_start(self) -> float:
        """When the step in progress started (= the last step completed)."""
        return self.received_at - self.state.step_age_s

    def coll_enter(self) -> float:
        """When the last collective was entered (meaningful while outstanding > 0)."""
        return self.received_at - self.state.coll.since_s

    def fr_read_at(self) -> float | None:
        """When the hook's last Flight Recorder read began; None: never read."""
        age = self.state.fr_read_age_s
        return None if age < 0 else self.received_at - age


@dataclass(frozen=True)
class HostView:
    host: str
    agent_id: str
    seq: int
    interval_s: float
    received_at: float
    first_seen: float
    sent_wall: float
    ranks: tuple[int, ...]  # ranks in its latest report
    reports: int = 1
    accelerators: tuple[dict, ...] = ()


@dataclass(frozen=True)
class LauncherExit:
    """A host's launcher (torchrun under ``watchdog run``) exited, as its wrapper told
    the coordinator directly: evidence about a host whose agent is silent (analysis/silence.py)."""

    pid: int
    status: int  # its exit code; negative: killed by that signal
    at: float  # when the coordinator was told


@dataclass(frozen=True)
class ClusterView:
    job: str = ""
    world_size: int = 0  # expected ranks; configured, or learned from reports when 0
    world_size_fixed: bool = False
    hosts: Mapping[str, HostView] = field(default_factory=lambda: _EMPTY)
    ranks: Mapping[int, FoldedRank] = field(default_factory=lambda: _EMPTY)
    # How far behind the coordinator's report handling runs (intake/backpressure.py):
    # reports still queued are not silence, so silence limits grow by it.
    behind_s: float = 0.0
    # The longest report interval the coordinator advised in a recent reply: an
    # agent told to slow down still stated its old interval in the report that got
    # the advice, and its next one comes that much later, which is not silence.
    advised_interval_s: float = 0.0
    launcher_exits: Mapping[str, LauncherExit] = field(default_factory=lambda: _EMPTY)  # by host

    def reporting_interval(self, hv: HostView) -> float:
        """How often ``hv`` may be expected to report now (at least 0.1 s)."""
        return max(hv.interval_s, self.advised_interval_s, 0.1)

    def first_registered_at(self) -> float | None:
        return min(columns.of(self).registered_at, default=None)


def empty(job: str = "", world_size: int = 0) -> ClusterView:
    return ClusterView(job=job, world_size=world_size, world_size_fixed=world_size > 0)


Event = Record  # a rank's or host's change, as journaled (contracts/journal/ranks.py)


def fold(
    view: ClusterView, report: HostReport, now: float, cfg: DetectorConfig = DetectorConfig()
) -> tuple[ClusterView, list[Event]]:
    """Fold one accepted report into the view. Returns the new view and the state
    changes worth journaling (never one per report when nothing changed).

    Copies the view's two dicts: O(ranks) per report. The coordinator folds with
    a ``Folder`` instead, which gives the same views (tests/test_coord_folder.py)."""
    if _already_folded(view.hosts, report):
        return view, []
    # mappingproxy.copy() is the fast C dict copy; dict(proxy) is not (the view holds proxies)
    hosts, ranks = view.hosts.copy(), view.ranks.copy()  # type: ignore[attr-defined]
    events: list[Event] = []
    world = _fold_into(hosts, ranks, view.world_size, view.world_size_fixed, report, now, cfg, events)
    return replace(view, hosts=MappingProxyType(hosts), ranks=MappingProxyType(ranks), world_size=world), events


class Folder:
    """The view being folded into, for the coordinator. ``fold`` above copies the
    view's dicts per report, which at 16,384 ranks and 2,048 reports a second was
    most of a core by itself; a Folder changes the report's entries in place and
    builds the immutable view only when one is asked for (``snapshot``: once per
    tick or status request), so a report costs O(its ranks). Not thread-safe: the
    coordinator calls it under its lock."""

    def __init__(self, view: ClusterView) -> None:
        self._hosts, self._ranks = dict(view.hosts), dict(view.ranks)
        self._view: ClusterView | None = None  # built on the first snapshot, with the columns below
        self._columns = columns.Store()  # the detectors' columns, written as ranks fold
        for rv in self._ranks.values():
            self._columns.put(rv)
        self.job, self.world_size, self.world_size_fixed = view.job, view.world_size, view.world_size_fixed
        self._exits = dict(view.launcher_exits)
        self.step_summaries = [0, 0]  # ranks' step summaries taken, not taken (``_stepped``)
        self._replaced: list[FoldedRank] = []  # dead incarnations a restart replaced since ``take_replaced``

    def fold(self, report: HostReport, now: float, cfg: DetectorConfig = DetectorConfig()) -> list[Event]:
        if _already_folded(self._hosts, report):
            return []
        events: list[Event] = []
        self.world_size = _fold_into(
            self._hosts,
            self._ranks,
            self.world_size,
            self.world_size_fixed,
            report,
            now,
            cfg,
            events,
            self.step_summaries,
            self._replaced,
        )
        ranks, put = self._ranks, self._columns.put
        for state in report.ranks:
            rv = ranks.get(state.rank)
            if rv is not None:
                put(rv)  # just built: still in cache
        self._view = None
        return events

    def take_replaced(self) -> list[FoldedRank]:
        """The dead incarnations whose successor was folded since the last call, oldest
        first: the coordinator keeps their deaths in view until a tick judged them (view/unjudged.py)."""
        out, self._replaced = self._replaced, []
        return out

    def set_job(self, job: str) -> None:
        self.job, self._view = job, None

    def launcher_exited(self, host: str, ex: LauncherExit) -> None:
        """Kept for hosts that have reported (the only ones it can tell about): bounded by them."""
        if host in self._hosts:
            self._exits[host] = ex
            self._view = None

    def snapshot(self) -> ClusterView:
        if self._view is None:
            self._view = ClusterView(
                job=self.job,
                world_size=self.world_size,
                world_size_fixed=self.world_size_fixed,
                hosts=MappingProxyType(dict(self._hosts)),
                ranks=MappingProxyType(dict(self._ranks)),
                launcher_exits=MappingProxyType(dict(self._exits)) if self._exits else _EMPTY,
            )
            columns.attach(self._view, self._columns.columns())
        return self._view


def _already_folded(hosts: Mapping[str, HostView], report: HostReport) -> bool:
    """A retried or reordered report."""
    prev = hosts.get(report.host)
    return prev is not None and prev.agent_id == report.agent_id and report.seq <= prev.seq


def _fold_into(
    hosts: dict[str, HostView],
    ranks: dict[int, FoldedRank],
    world: int,
    world_fixed: bool,
    report: HostReport,
    now: float,
    cfg: DetectorConfig,
    events: list[Event],
    tally: list[int] | None = None,
    replaced: list[FoldedRank] | None = None,
) -> int:
    """Fold ``report`` into the two dicts in place; returns the world size.
    ``tally``: [step summaries taken, step summaries not taken] (``_stepped``),
    added to when given and the report's summaries were computed under ``cfg``.
    ``replaced``: where given, the dead incarnations a new one replaced are added to it."""
    summaries = None
    if report.step_summary_config and report.step_summary_config == summary_config(cfg):
        summaries = tally if tally is not None else [0, 0]
    prev_host = hosts.get(report.host)
    if prev_host is None or prev_host.agent_id != report.agent_id:
        events.append(
            HostSeenRecord(
                host=report.host,
                agent_id=report.agent_id,
                agent_restarted=prev_host is not None,
                previous_agent_id=prev_host.agent_id if prev_host else None,
            )
        )
    hosts[report.host] = HostView(
        host=report.host,
        agent_id=report.agent_id,
        seq=report.seq,
        interval_s=report.interval_s,
        received_at=now,
        first_seen=prev_host.first_seen if prev_host else now,
        sent_wall=report.sent_wall,
        ranks=tuple(r.rank for r in report.ranks),
        reports=(prev_host.reports + 1) if prev_host else 1,
        accelerators=report.accelerators,
    )
    for state in report.ranks:
        rv = _fold_rank(ranks.get(state.rank), state, report.host, now, cfg, events, summaries, replaced)
        if rv is not None:
            ranks[state.rank] = rv
        if not world_fixed:
            world = max(world, state.world_size)
    return world


def _fold_rank(
    prev: FoldedRank | None,
    s: RankState,
    host: str,
    now: float,
    cfg: DetectorConfig,
    events: list[Event],
    summaries: list[int] | None = None,
    replaced: list[FoldedRank] | None = None,
) -> FoldedRank | None:
    replaced_death: float | None = None
    if prev is not None and (s.pid != prev.state.pid or s.proc_start_us != prev.state.proc_start_us):
        if s.proc_start_us < prev.state.proc_start_us:
            return None  # an older incarnation still reported somewhere: the newer one wins
        events.append(
            RankRestartedRecord(
                rank=s.rank,
                host=host,
                pid=s.pid,
                local_rank=s.local_rank,
                old_pid=prev.state.pid,
                old_host=prev.host,
                old_step=prev.state.step,
            )
        )
        replaced_death = prev.died_at
        if replaced is not None and replaced_death is not None:
            replaced.append(prev)
        prev = None  # a restarted rank starts over: no detector state carries across
    elif prev is None:
        events.append(
            RankJoinedRecord(
                rank=s.rank,
                host=host,
                pid=s.pid,
                local_rank=s.local_rank,
                world_size=s.world_size,
                status=s.status,
                pg_state=s.pg_state,
            )
        )
    step_start = now - s.step_age_s
    if prev is None:
        return _joined(s, host, now, step_start, cfg, replaced_death, summaries)
    # Every field's new value, then one FoldedRank (``report.made``: a frozen dataclass's
    # __init__ sets its 19 fields one call each, and the fold builds one per rank per report).
    old = prev.state
    if s.alive != old.alive or s.status != old.status or s.pg_state != old.pg_state:
        _state_changes(old, s, host, events)
    progress = max(prev.progress_at, step_start)
    c, pc = s.coll, old.coll
    if c.group != pc.group or c.seq != pc.seq or c.done_seq != pc.done_seq:
        # Moved some time after the previous report: its arrival is a lower bound.
        progress = max(progress, prev.received_at)
    beat, before = now - s.heartbeat_age_s, prev.last_heartbeat()
    moved = prev.heartbeat_moved or beat > before + 0.05
    # Seen frozen by its agent last time (past the threshold for the state it was in), beating
    # now: it resumed. A running rank whose beats were only late (a stopped rank's shorter
    # threshold, not a running one's) was busy, not stopped with anyone: a peer waiting in DDP's
    # all-reduce beats late while its culprit is SIGSTOPped alone (tests/test_e2e_periodic.py).
    threshold = cfg.frozen_after_s(old.proc_status, old.step == 0)
    stale = prev.heartbeat_moved and old.heartbeat_age_s > threshold and beat > before + 0.05
    resumed = (before, beat) if stale else prev.resumed
    alive = s.alive
    last_alive = now if alive else prev.last_alive_at
    step_stats = _stepped(prev.step_stats, s, cfg, summaries) if s.recent_steps else prev.step_stats
    died_at, died_precise, dead_seen_at = prev.died_at, prev.died_precise, prev.dead_seen_at
    if alive:
        if died_at is not None:  # alive again (reported so): no longer dead
            died_at, died_precise, dead_seen_at = None, False, None
    elif died_at is None:
        died_at, died_precise, dead_seen_at = _died(s, now, now - s.heartbeat_age_s, last_alive, died_precise)
    loss_steps, loss_values, loss_calm = prev.loss_steps, prev.loss_values, prev.loss_calm
    if _new_loss(loss_steps, s):
        loss_steps, loss_values, loss_calm = _with_loss(loss_steps, loss_values, s)
    colls, coll_keys = prev.colls, prev.coll_keys
    if s.recent_colls:
        colls, coll_keys = _with_colls(colls, s.recent_colls, now)
    gpu_stats, gpu_last = prev.gpu_stats, prev.gpu_last
    if s.recent_gpu:
        gpu_stats = add_samples(gpu_stats, gpu_samples(s.recent_gpu, step_stats.history), cfg)
        gpu_last = s.recent_gpu[-1]
    return made(
        FoldedRank,
        s,
        host,
        now,
        prev.registered_at,
        progress,
        last_alive,
        moved,
        step_stats,
        died_at,
        died_precise,
        dead_seen_at,
        loss_steps,
        loss_values,
        loss_calm,
        colls,
        coll_keys,
        gpu_stats,
        gpu_last,
        prev.previous_died_at,
        resumed,
    )


def _stepped(st: StepStats, s: RankState, cfg: DetectorConfig, summaries: list[int] | None) -> StepStats:
    """``st`` with the rank's new step samples: its statistics from the agent's
    summary where it sent one under these settings (``summaries``: not None) and it
    ends where the history does, else computed here."""
    if summaries is not None and s.step_summary:
        got = with_summary(st, s.recent_steps, s.step_summary, cfg)
        if got is not None:
            summaries[0] += 1
            return got
        summaries[1] += 1
    return add_samples(st, s.recent_steps, cfg)


def _joined(
    s: RankState,
    host: str,
    now: float,
    step_start: float,
    cfg: DetectorConfig,
    replaced_death: float | None = None,
    summaries: list[int] | None = None,
) -> FoldedRank:
    """A rank's first report (of this incarnation)."""
    kw: dict[str, Any] = {"previous_died_at": replaced_death}
    last_alive = now if s.alive else now - s.heartbeat_age_s
    if not s.alive:
        kw["died_at"], kw["died_precise"], kw["dead_seen_at"] = _died(
            s, now, now - s.heartbeat_age_s, last_alive, False
        )
    if _new_loss(_NO_LOSS_STEPS, s):
        kw["loss_steps"], kw["loss_values"], kw["loss_calm"] = _with_loss(_NO_LOSS_STEPS, _NO_LOSS_VALUES, s)
    if s.recent_colls:
        kw["colls"], kw["coll_keys"] = _with_colls((), s.recent_colls, now)
    step_stats = _stepped(_NO_STATS, s, cfg, summaries) if s.recent_steps else _NO_STATS
    if s.recent_gpu:
        kw["gpu_stats"] = add_samples(_NO_GPU_STATS, gpu_samples(s.recent_gpu, step_stats.history), cfg)
        kw["gpu_last"] = s.recent_gpu[-1]
    return FoldedRank(
        state=s,
        host=host,
        received_at=now,
        registered_at=now,
        progress_at=step_start,
        last_alive_at=last_alive,
        # At step 0 the step start is the slot's creation, when the heartbeat
        # word was initialised: a younger heartbeat has beaten since.
        heartbeat_moved=s.step > 0 or s.heartbeat_age_s + 0.05 < s.step_age_s,
        step_stats=step_stats,
        **kw,
    )


def _died(
    s: RankState, now: float, last_heartbeat: float, last_alive: float, precise: bool
) -> tuple[float, bool, float]:
    """(died_at, died_precise, dead_seen_at) of a rank first reported gone now:
    estimated once, later reports only see it longer gone."""
    if s.gone_age_s > 0:
        return now - s.gone_age_s, True, now
    # Between the last sign of life and this report; the lower bound orders a cascade best.
    return min(now, max(last_heartbeat, last_alive)), precise, now


def _new_loss(steps: array, s: RankState) -> bool:
    """``s`` carries a finite loss that the history ``steps`` has not kept yet
    (one per report at most)."""
    return s.loss_step > 0 and s.loss_finite and not (steps and steps[-1] == s.loss_step)


def _with_loss(steps: array, values: array, s: RankState) -> tuple[array, array, bool]:
    """The loss history with ``s``'s loss added (new arrays: a FoldedRank's are
    never mutated), and its ``loss_calm``."""
    steps, values = steps[-(LOSS_HISTORY - 1) :], values[-(LOSS_HISTORY - 1) :]
    steps.append(s.loss_step)
    values.append(s.loss)
    return steps, values, loss_screen.calm(values)


def gpu_samples(gpu: tuple[GpuStep, ...], cpu: Steps) -> tuple[StepSample, ...]:
    """GPU-clock steps as StepSamples, keeping what only the CPU side measures
    (collective bytes, the finer split) from the same step's CPU sample."""
    by_step = {x.step: x for x in cpu[-2 * len(gpu) - 8 :]}  # the GPU runs a few steps behind at most
    out = []
    for g in gpu:
        x = by_step.get(g.step)
        if x is None:
            out.append(g.as_step_sample())
        else:
            out.append(replace(x, step_s=g.step_s, data_s=g.data_s, coll_s=g.coll_s, phase=g.phase))
    return tuple(out)


_FOLDED_FIELDS = tuple(f.name for f in fields(FoldedRank))
# _fold_rank builds a FoldedRank from its values in this order (positional: cheaper).
assert _FOLDED_FIELDS == (
    "state",
    "host",
    "received_at",
    "registered_at",
    "progress_at",
    "last_alive_at",
    "heartbeat_moved",
    "step_stats",
    "died_at",
    "died_precise",
    "dead_seen_at",
    "loss_steps",
    "loss_values",
    "loss_calm",
    "colls",
    "coll_keys",
    "gpu_stats",
    "gpu_last",
    "previous_died_at",
    "resumed",
), _FOLDED_FIELDS
# The fields' defaults (each its own instance, shared by every FoldedRank built without one)
_NO_STATS: StepStats = FoldedRank.__dataclass_fields__["step_stats"].default  # type: ignore[assignment]
_NO_GPU_STATS: StepStats = FoldedRank.__dataclass_fields__["gpu_stats"].default  # type: ignore[assignment]
_NO_LOSS_STEPS, _NO_LOSS_VALUES = array("q"), array("d")  # empty, never mutated (sliced into new ones)


# Ops whose per-rank input sizes may differ legitimately (uneven all-to-all splits,
# point-to-point, a root's list): only the op itself is compared.
SIZE_FREE_OPS = frozenset({"all_to_all", "send", "recv", "gather", "scatter", "other"})


def comparable(c: CollSig) -> tuple:
    """What must be equal on every rank at one (group, seq)."""
    return (c.op,) if c.op in SIZE_FREE_OPS else (c.op, c.elements, c.dtype)


def _with_colls(
    old: tuple[tuple[CollSig, float], ...], new: tuple[CollSig, ...], now: float
) -> tuple[tuple[tuple[CollSig, float], ...], tuple[tuple[tuple[int, int], tuple, float], ...]]:
    """``FoldedRank.colls`` and ``coll_keys`` with ``new`` folded in."""
    colls = _fold_colls(old, new, now)
    return colls, tuple(((c.group, c.seq), comparable(c), at) for c, at in colls)


def _fold_colls(
    old: tuple[tuple[CollSig, float], ...], new: tuple[CollSig, ...], now: float
) -> tuple[tuple[CollSig, float], ...]:
    """A later record of the same (group, seq) replaces the earlier one (its state
    moved on NCCL); the newest COLL_HISTORY by sequence are kept."""
    by_key = {(c.group, c.seq): (c, at) for c, at in old}
    for c in new:
        by_key[(c.group, c.seq)] = (c, now - c.age_s)
    items = sorted(by_key.values(), key=lambda x: (x[0].seq, x[0].group))
    return tuple(items[-COLL_HISTORY:])


def _state_changes(old: RankState, new: RankState, host: str, events: list[Event]) -> None:
    changed = {
        name: [getattr(old, name), getattr(new, name)]
        for name in ("alive", "status", "pg_state")
        if getattr(old, name) != getattr(new, name)
    }
    if changed:
        # Why it died, with the death itself: a launcher may replace it before any finding is made.
        cause = new.death.get("summary") if old.alive and not new.alive else None
        events.append(
            StateRecord(
                rank=new.rank,
                host=host,
                pid=new.pid,
                local_rank=new.local_rank,
                step=new.step,
                changed=changed,
                cause=cause or None,
            )
        )
