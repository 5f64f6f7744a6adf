"""collective_hang: the job stopped making progress; name who holds it up.

Hang age is the longer of: how long ranks have waited in the collective most of
them are in, and how long no live rank completed a step or a collective. It must
pass an adaptive deadline, max(floor, multiple x p99 recent step time), plus an
allowance while any rank is in a phase the hook marked as slow on purpose
(checkpoint, eval) or in init / its first steps. The p99 leaves out the steps
some rank spent in such a phase (``unpaused_step_s``): the others' wait for
it was the phase's, not a step's.

The culprits are the ranks that have not entered the collective the others wait
in (see ``health.analyze``): a rank stuck in its own code, in the data loader,
dead, frozen or exited early (uneven inputs). A dead or frozen culprit also gets
its own dead_rank / frozen_rank finding; this one names the same rank and says
how long the others have waited. Ranks that entered it and failed or froze inside
are not a hang's culprits: theirs are dead_rank's and frozen_rank's findings alone. When nobody is in a collective the hook sees,
the ranks' Flight Recorders may show them in one issued from C++ (analysis/flight_recorder_blame.py):
then the ranks behind it are named, or nobody while no reading made since the
wait began proves who ("unproven"); on NCCL, the ranks whose collective was
entered on CPU but not started on GPU. Otherwise (all stuck in data loading,
say) every live rank is named with where it is. A rank is judged on what its
agent said since the wait began: one whose host has not been heard from since
(a host that missed its reports, or whose reports still sit in the buffers of
a coordinator that is behind) is not a culprit on its last state alone, and
when such ranks are the only ones not in the collective, nobody is named yet.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import and_, ge, is_not
from typing import Any

from ...contracts.finding import Finding, group_name, ranks_phrase, seconds
from ...stepstats import stats
from ...stepstats.history import Steps
from ...stepstats.steps import P99_SAMPLES, PAUSE_PHASES
from ..analysis.health import FROZEN, OK, Blame, analyze, classify_all, waiting, waiting_since
from ..analysis.intermittent_stalls import Stalls, expected_freeze_s, expected_s
from ..analysis.silence import SLOW_PHASES
from ..analysis.tick_memo import per_tick
from ..analysis.wedge import frozen_together
from ..config import DetectorConfig
from ..metrics import HANG_DEADLINE_SECONDS, HANG_SECONDS, GaugeValues
from ..view import columns
from ..view.cluster import ClusterView, FoldedRank
from .phrases import heartbeat, where, who

_STATUS = {
    "dead": "process gone",
    "frozen": "frozen (heartbeat stale)",
    "lost": "its host is lost",
    "exited": "exited already (a crash, or uneven inputs)",
}


@dataclass(frozen=True)
class HangState:
    age_s: float  # how long the job has been stuck (0 when it is not)
    deadline_s: float
    onset: float
    stuck: tuple[int, ...]  # live ranks, when nobody waits in a collective
    health: dict[int, str]
    # ``analyze`` of the view, asked for when read: the age needs only when the waiters
    # began (health.waiting_since), and on most ticks nobody reads the culprits.
    # The view is held weakly (analysis/tick_memo.py: the state outlives its tick in the memo).
    _analysis: Callable[[], Blame | None] = field(compare=False, repr=False)

    @property
    def blame(self) -> Blame | None:
        return self._analysis()


@per_tick(view_arg=1)
def hang_state(now: float, view: ClusterView, cfg: DetectorConfig) -> HangState | None:
    """Pure; also feeds the hang gauges. None when nothing is live."""
    health = classify_all(view, now, cfg)
    c = columns.of(view)
    # The live ranks (expected to make progress: OK or frozen, not exited, dead or lost) as a
    # column mask (classify_all's order is the columns'): at 16,384 ranks each pass over the
    # rank objects here was paid every tick.
    alive = list(map((OK, FROZEN).__contains__, health.values()))
    if not any(alive):
        return None  # all exited, dead or lost: dead_rank's business, not a hang
    since = waiting_since(view, now, cfg)  # analyze(...).waiting_since; None: no blame
    progress = max(compress(c.progress_at, alive))
    age, onset = now - progress, progress
    if since is not None and now - since > age:
        age, onset = now - since, since
    return HangState(
        age_s=max(0.0, age),
        deadline_s=deadline(view, alive, cfg),
        onset=onset,
        stuck=tuple(sorted(compress(c.rank, alive))) if since is None else (),
        health=health,
        _analysis=_analysis(view, now, cfg),
    )


def _analysis(view: ClusterView, now: float, cfg: DetectorConfig) -> Callable[[], Blame | None]:
    held = weakref.ref(view)

    def blame() -> Blame | None:
        v = held()
        if v is None:
            raise ReferenceError("the hang state's view is gone: read its blame within its tick")
        return analyze(v, now, cfg)

    return blame


def _joining(view: ClusterView, stuck: tuple[int, ...]) -> bool:
    """A multi-rank job stalled with stuck ranks before or inside init_process_group
    (a restart where one rank never calls it): the others wait in rendezvous for it,
    so naming every stuck rank would accuse them; never_joined names the one. A rank
    with any collective on record (the hook's marks, its Flight Recorder) has joined,
    whatever its process-group state says (a hook installed after the init)."""
    if view.world_size <= 1:
        return False
    return any(_before_any_collective(view.ranks[r]) for r in stuck)


def _before_any_collective(rv: FoldedRank) -> bool:
    s = rv.state
    return s.step == 0 and s.pg_state in _JOINING and s.coll.seq == 0 and not rv.colls and not s.fr_newest_seq


_JOINING = ("none", "initializing")


def deadline(view: ClusterView, alive: list[bool], cfg: DetectorConfig, also: frozenset[int] = frozenset()) -> float:
    """``alive[i]``: whether the rank in row ``i`` of the view's columns is live;
    ``also``: more steps the p99 leaves out (the unmarked stalls of a rank whose
    frame was seen: ``expected_stall_s`` gives their recurrences their time)."""
    c = columns.of(view)
    kept = list(map(and_, alive, c.has_history))
    step_s = stats.median(list(compress(c.p99_step_s, kept)))
    if cfg.hang_step_multiple * step_s > cfg.hang_floor_s:  # the step time decides: was it a pause's?
        step_s = unpaused_step_s(list(compress(c.step_history, kept)), step_s, also)
    base = max(cfg.hang_floor_s, cfg.hang_step_multiple * step_s)
    base += view.behind_s  # a coordinator running late has not yet seen the progress queued for it
    phases = set(compress(c.phase, alive))
    if not phases.isdisjoint(SLOW_PHASES):
        base += cfg.hang_phase_allowance_s
    warmup = cfg.warmup_steps
    if "init" in phases or any(map(ge, repeat(warmup), compress(c.steps_seen, alive))):  # any steps_seen <= warmup
        base += cfg.hang_warmup_allowance_s
    return base


def unpaused_step_s(histories: Sequence[Steps], step_s: float, also: frozenset[int] = frozenset()) -> float:
    """The median rank's p99 step time (``step_s``, over each rank's newest
    ``P99_SAMPLES`` steps) without the steps in which some rank was in a pause
    phase (checkpoint, eval: marked, or the hook's automatic eval). In such a
    step the others waited for it, their step as long as its pause: kept, one
    rank-0-only evaluation would stretch the deadline to ``hang_step_multiple``
    times its length for the next hundred steps (a spin named after ~30 s, not
    ~5). The pause itself has the phase allowance. Never longer than ``step_s``.
    The caller asks only when the step time decides the deadline (its multiple
    above the floor); only the histories that changed since the last call are
    read again (``_LAST``)."""
    # Its own cache with ``also``: the tick asks both ways (hang_state without, the detector
    # with), and one cache would read every history again at each change of the steps left out.
    pauses, p99_without = (_LAST_ALSO if also else _LAST).read(histories)
    found = [p for p in pauses if p]
    if also:
        found.append(also)
    if not found:
        return step_s
    p99s = [p for p in p99_without(frozenset().union(*found)) if p is not None]
    return min(step_s, stats.median(p99s)) if p99s else step_s


def _pauses(h: Steps) -> frozenset[int]:
    return frozenset(x.step for x in h[-P99_SAMPLES:] if x.phase in PAUSE_PHASES)


def _p99_without(h: Steps, paused: frozenset[int]) -> float | None:
    kept = [x.step_s for x in h[-P99_SAMPLES:] if x.step not in paused]
    return stats.quantile(kept, 0.99) if kept else None


class _Last:
    """What ``unpaused_step_s`` read of the histories of its last call: a rank's
    history is a new object when it grows, so comparing identities (one C-level
    pass) finds the few that changed since (reports come in once a second, ticks
    more often); a pure function's cache, the same answers as reading them all."""

    def __init__(self) -> None:
        self.histories: list[Steps] = []
        self.pauses: list[frozenset[int]] = []
        self.paused: frozenset[int] = frozenset()
        self.p99s: list[float | None] = []
        self.p99s_of: list[Steps] = []

    def _changed(self, histories: list[Steps], old: list[Steps]) -> list[int]:
        if len(old) != len(histories):
            return list(range(len(histories)))
        return list(compress(range(len(histories)), map(is_not, histories, old)))

    def read(self, histories: Sequence[Steps]) -> tuple[list[frozenset[int]], Callable[..., list[float | None]]]:
        histories = list(histories)
        changed = self._changed(histories, self.histories)
        pauses = self.pauses if len(self.pauses) == len(histories) else [frozenset()] * len(histories)
        pauses = list(pauses)
        for i in changed:
            pauses[i] = _pauses(histories[i])
        self.histories, self.pauses = histories, pauses

        def p99_without(paused: frozenset[int]) -> list[float | None]:
            if paused != self.paused or len(self.p99s) != len(histories):
                redo: Sequence[int] = range(len(histories))
                self.p99s = [None] * len(histories)
            else:
                redo = self._changed(histories, self.p99s_of)
            for i in redo:
                self.p99s[i] = _p99_without(histories[i], paused)
            self.paused, self.p99s_of = paused, histories
            return self.p99s

        return pauses, p99_without


_LAST = _Last()
_LAST_ALSO = _Last()


def expected_stall_s(view: ClusterView, known: Stalls | None, health: dict[int, str]) -> float:
    """The longest a live rank's stall now may last and be one seen before: a rank
    outside any collective whose hook sampled it, in the step it is still in, in a
    frame where it stalled before (stalls.expected_s), or a running rank whose
    heartbeat is frozen and froze before, then beat again (a call holding the GIL:
    stalls.expected_freeze_s); 0 when none is. Its recurrence is work it does alone
    (a metrics upload every N steps), not a hang, for as long as it took before. A
    stall that does not end is named past that."""
    if known is None or not (known.framed or known.froze):
        return 0.0
    c = columns.of(view)
    out = 0.0
    for i in compress(range(len(c.frame)), c.frame):  # the agents send frames only while their step lasts
        rank = c.rank[i]
        if c.frame_step[i] == c.step[i] + 1 and not c.coll_outstanding[i] and health.get(rank) == OK:
            out = max(out, expected_s(known, rank, c.frame[i]) or 0.0)
    for rank in {o.rank for o in known.froze}:  # a running rank frozen as it was before, and beat again
        rv = view.ranks.get(rank)
        if health.get(rank) == FROZEN and rv is not None and rv.state.proc_status != "stopped":
            out = max(out, expected_freeze_s(known, rank) or 0.0)
    return out


class CollectiveHang:
    name = "collective_hang"

    def __init__(self, cfg: DetectorConfig, stalls: Stalls | None = None) -> None:
        self.cfg = cfg
        # The goodput ledger's stalls (the coordinator hands them over): a stall that recurs
        # where one was seen before gets the time it took then (expected_stall_s).
        self.stalls = stalls

    def _deadline(self, view: ClusterView, st: HangState) -> float:
        """The state's deadline; once a rank's unmarked stalls were seen in a frame,
        without their steps in the p99 (a spin elsewhere is named as soon as
        before) but with their recurrence's time (``expected_stall_s``)."""
        known = self.stalls
        if known is None or not (known.framed or known.froze):
            return st.deadline_s
        alive = [h in (OK, FROZEN) for h in st.health.values()]
        base = deadline(view, alive, self.cfg, frozenset(o.step for o in (*known.framed, *known.froze)))
        return max(base, expected_stall_s(view, known, st.health))

    def gauges(self, now: float, view: ClusterView) -> GaugeValues:
        """How long the job has been stuck against its deadline (both 0 when nothing is live)."""
        st = hang_state(now, view, self.cfg)
        return {HANG_SECONDS: st.age_s if st else 0.0, HANG_DEADLINE_SECONDS: self._deadline(view, st) if st else 0.0}

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        st = hang_state(now, view, self.cfg)
        if st is None:
            return []
        deadline_s = self._deadline(view, st)
        if st.age_s <= deadline_s or frozen_together(now, view, self.cfg) is not None:
            return []  # (every rank frozen in one instant: the wedged verdict's, analysis/wedge.py)
        b = st.blame
        evidence: dict[str, Any] = {"hang_s": round(st.age_s, 3), "deadline_s": round(deadline_s, 3)}
        if b is None:
            if _joining(view, st.stuck):
                return []  # never_joined's, by its own deadline: it names who did not call init
            return [self._stalled(now, view, st, evidence)]
        evidence.update(group=b.group, seq=b.seq, op=b.op, waiters=list(b.waiters), how=b.how, source=b.source)
        if b.source == "flight_recorder":
            evidence.update(culprit_order=list(b.culprits), unread=list(b.unread), detail=dict(b.detail))
        waited = (
            f"{ranks_phrase(b.waiters)} waiting {seconds(now - b.waiting_since)}" if b.waiters else "no rank waiting"
        )
        coll = f"{b.op} #{b.seq} on {group_name(b.group)}"
        if b.source == "flight_recorder":
            coll += " (per the Flight Recorder)"
        if b.how == "unheard":
            quiet = sorted({view.ranks[r].host for r in b.unread})
            reason = (
                f"{waited} in {coll}; {ranks_phrase(b.unread)} not in it as last heard, before the wait began: "
                f"host {', '.join(quiet)} not heard from since; nobody named until "
                "they report again or their host is lost"
            )
            evidence["unheard"] = list(b.unread)
            return [self._nobody(now, st, reason, evidence, b.waiters)]
        if b.how == "unproven":
            reason = (
                f"{waited} in {coll}; {ranks_phrase(b.unread)} not in it, with no Flight Recorder reading "
                "since the wait began: nobody named until one shows who holds it up; stacks requested"
            )
            return [self._nobody(now, st, reason, evidence, tuple(sorted(b.waiters + b.unread)))]
        if not b.culprits:
            return []  # every rank inside one collective, none missing: the wedged verdict's (detectors/wedged.py)
        if b.how == "failed_inside":
            # They entered it and died or froze there: dead_rank's and frozen_rank's, which name
            # the first and call the rest victims. Named here too, a launcher's restart half done
            # (one node's new ranks up, the other's killed ranks not yet replaced) blamed the
            # victims once the root death had been replaced (two torchrun nodes, test_e2e_exit_status).
            return []
        rvs = [view.ranks[r] for r in b.culprits]
        verb = {
            "missing": "never entered",
            "behind": "has not caught up to",
            "mismatched": "called a different collective (op or size) than",
            "other_group": "is waiting elsewhere instead of in",
            "not_started": "entered on CPU, not started on GPU:",
        }[b.how]
        if b.how == "not_started":
            why = dict(b.detail)
            stuck = "; ".join(f"rank {r}: {why[r]}" for r in b.culprits if r in why)
            reason = f"{ranks_phrase(b.culprits)} {verb} {coll}; {waited}; {stuck}"
        elif len(rvs) == 1:
            rv = rvs[0]
            status = _STATUS.get(st.health[rv.rank]) or heartbeat(rv, now, self.cfg.frozen_heartbeat_s)
            reason = f"{who(rv)} {verb} {coll}; {waited}; rank {rv.rank} last seen {where(rv, now)}, {status}"
        else:
            places = Counter(where(rv, now).split(" at step")[0] for rv in rvs)
            top = ", ".join(f"{n} {p}" for p, n in places.most_common(2))
            reason = f"{ranks_phrase(b.culprits)} {verb} {coll}; {waited}; culprits last seen: {top}"
        evidence["culprits"] = {str(rv.rank): self._culprit(rv, st, now) for rv in rvs[:16]}
        return [
            Finding(
                kind=self.name,
                ranks=tuple(sorted(b.culprits)),  # the order, root cause first, is evidence["culprit_order"]
                hosts=tuple(sorted({rv.host for rv in rvs})),
                reason=reason,
                onset_mono=st.onset,
                detected_mono=now,
                evidence=evidence,
                wants_stacks=tuple(sorted(b.culprits)),
            )
        ]

    def _nobody(self, now: float, st: HangState, reason: str, evidence: dict, wants: tuple[int, ...]) -> Finding:
        """A hang whose culprit is not known (yet): it names no rank, asks for stacks."""
        return Finding(
            kind=self.name,
            ranks=(),
            hosts=(),
            reason=reason,
            onset_mono=st.onset,
            detected_mono=now,
            evidence=evidence,
            wants_stacks=wants,
        )

    def _stalled(self, now: float, view: ClusterView, st: HangState, evidence: dict) -> Finding:
        rvs = [view.ranks[r] for r in st.stuck]
        data = [rv.rank for rv in rvs if rv.state.in_data_wait and not waiting(rv)]
        if len(data) == len(rvs):
            tail = "all waiting on data: the input pipeline is stalled"
        else:
            places = Counter(where(rv, now).split(" at step")[0] for rv in rvs)
            tail = "last seen " + ", ".join(f"{n} {p}" for p, n in places.most_common(2))
        reason = f"no progress for {seconds(st.age_s)} and no rank is in a collective: {ranks_phrase(st.stuck)} {tail}"
        evidence["culprits"] = {str(rv.rank): self._culprit(rv, st, now) for rv in rvs[:16]}
        return Finding(
            kind=self.name,
            ranks=st.stuck,
            hosts=tuple(sorted({rv.host for rv in rvs})),
            reason=reason,
            onset_mono=st.onset,
            detected_mono=now,
            evidence=evidence,
            wants_stacks=st.stuck,
        )

    def _culprit(self, rv: FoldedRank, st: HangState, now: float) -> dict:
        s = rv.state
        return {
            "host": rv.host,
            "pid": s.pid,
            "step": s.step,
            "phase": s.phase,
            "in_data_wait": s.in_data_wait,
            "coll_group": s.coll.group,
            "coll_seq": s.coll.seq,
            "coll_outstanding": s.coll.outstanding,
            "heartbeat_age_s": round(rv.heartbeat_age(now), 3),
            "health": st.health[rv.rank],
            "frame": s.frame if s.frame_step == s.step + 1 else "",
        }
