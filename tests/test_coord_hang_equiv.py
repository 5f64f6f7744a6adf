"""The hang path on columns (health's analysis, collective_hang, frozen_rank,
dead_rank) gives the answers of the plain code it replaced, kept here as the
reference: random views with waits on several groups, ranks behind, missing or
mismatched, quiet and lost hosts, dead, frozen, exited and unheard ranks, the
Flight Recorder's path when no rank waits; and simulated jobs that hang, die,
stop and exit. Compared value for value: blames, hang states, findings, gauges.

Never accuse the innocent: the faster code must name exactly whom the plain
code named, in the same order, with the same floats."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from watchdog.contracts.finding import Finding, rank_ranges, ranks_phrase, seconds
from watchdog.coordinator import testing as t
from watchdog.coordinator.analysis import flight_recorder_blame as frblame
from watchdog.coordinator.analysis import health, silence
from watchdog.coordinator.analysis.health import DEAD, EXITED, FAULTY, FROZEN, LOST, OK, RETIRED, STALL_SLACK_S, Blame
from watchdog.coordinator.analysis.mismatch import find as find_mismatch
from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.detectors import collective_hang as ch
from watchdog.coordinator.detectors.collective_hang import CollectiveHang, HangState
from watchdog.coordinator.detectors.dead_rank import CASCADE_S, TIE_COARSE_S, TIE_S, DeadRank
from watchdog.coordinator.detectors.frozen_rank import FrozenRank
from watchdog.coordinator.detectors.phrases import where, who
from watchdog.coordinator.view import columns
from watchdog.coordinator.view.cluster import ClusterView, FoldedRank
from watchdog.stepstats import stats

# -- the reference: the plain code, one pass over the rank objects per question ------------------


def ref_lost_hosts(view, now, cfg):
    # Which silent hosts are lost is silence.judge's rule (plain code over the rank objects).
    silent = {
        h: cfg.host_silence_intervals * view.reporting_interval(hv) + view.behind_s
        for h, hv in view.hosts.items()
        if now - hv.received_at > cfg.host_silence_intervals * view.reporting_interval(hv) + view.behind_s
    }
    return {h for h, s in silence.judge(view, now, silent, ref_waiting).items() if s.verdict == silence.LOST}


def ref_classify_all(view, now, cfg):
    lost = ref_lost_hosts(view, now, cfg)
    return {r: health.classify(rv, view, now, cfg, lost) for r, rv in view.ranks.items()}


def ref_waiting(rv: FoldedRank) -> bool:
    s = rv.state
    c = s.coll
    return c.outstanding > 0 and rv.received_at - s.step_age_s <= rv.received_at - c.since_s + STALL_SLACK_S


def ref_frblame_find(view, live, failed):
    pos = {r: frblame.positions(rv) for r, rv in view.ranks.items() if rv.colls or rv.state.fr_newest_seq}
    if not pos:
        return None
    best = None
    for g in sorted({g for p in pos.values() for g in p}):
        found = frblame._on_group(view, g, pos, live, failed)
        if found is not None and (best is None or frblame._rank(found) > frblame._rank(best)):
            best = found
    return best


def ref_fr_front(view, now, health_):
    ok = {r for r, h in health_.items() if h == OK}
    if not ok or now - max(view.ranks[r].progress_at for r in ok) < health.FR_AFTER_S:
        return None
    failed = {r for r, h in health_.items() if h in FAULTY + (EXITED,)}
    return ref_frblame_find(view, ok, failed)


def ref_fr_blame(view, now, health_):
    f = ref_fr_front(view, now, health_)
    if f is None:
        return None
    return Blame(
        group=f.group,
        seq=f.seq,
        op=f.op,
        waiters=f.waiters,
        culprits=f.culprits,
        elsewhere=(),
        waiting_since=f.waiting_since,
        latest_enter=f.latest_enter,
        how=f.how,
        source="flight_recorder",
        unread=f.unread,
        detail=tuple(sorted(f.detail.items())),
    )


def ref_analyze(view: ClusterView, now: float, cfg: DetectorConfig) -> Blame | None:
    health_ = ref_classify_all(view, now, cfg)
    quiet = health.quiet_hosts(view, now)
    wait = {
        r: rv
        for r, rv in view.ranks.items()
        if ref_waiting(rv) and health_[r] not in (EXITED, LOST, RETIRED) and (not quiet or rv.host not in quiet)
    }
    # A wait another live rank, outside any collective, has seen the end of is not a wait now.
    free = [rv for r, rv in view.ranks.items() if r not in wait and health_[r] in (OK, FROZEN)]
    wait = {
        r: rv
        for r, rv in wait.items()
        if not any(
            f.state.coll.group == rv.state.coll.group and f.state.coll.done_seq >= rv.state.coll.seq for f in free
        )
    }
    if not wait:
        return ref_fr_blame(view, now, health_)
    groups = Counter(rv.state.coll.group for rv in wait.values())
    group = min(groups, key=lambda g: (-groups[g], g))
    on = {r: rv for r, rv in wait.items() if rv.state.coll.group == group}
    seq = min(rv.state.coll.done_seq for rv in on.values()) + 1
    front = max(rv.state.coll.seq for rv in on.values())
    ops = Counter(rv.state.coll.op for rv in on.values())
    latest_enter = max(rv.coll_enter() for rv in on.values())
    elsewhere = tuple(sorted(set(wait) - set(on)))

    def stalled(rv):
        return rv.progress_at <= latest_enter + STALL_SLACK_S

    missing: list[int] = []
    unheard: list[int] = []
    for r, rv in view.ranks.items():
        if r in wait:
            continue
        if health_[r] in FAULTY + (EXITED,):
            missing.append(r)
        elif health_[r] != RETIRED and stalled(rv):
            (unheard if rv.received_at <= latest_enter else missing).append(r)
    fr = ref_fr_front(view, now, health_) if missing else None
    if fr is not None:
        held = set(fr.waiters) | set(fr.earlier)
        missing = [r for r in missing if r not in held]
    behind = [r for r, rv in on.items() if rv.state.coll.seq < front]
    at_front = {r: rv for r, rv in on.items() if rv.state.coll.seq == front}
    shapes = Counter((rv.state.coll.op, rv.state.coll.bytes) for rv in at_front.values())
    mismatched = []
    if len(shapes) > 1:
        (top, n_top), (_, n_next) = shapes.most_common(2)
        if n_top > n_next:
            mismatched = [r for r, rv in at_front.items() if (rv.state.coll.op, rv.state.coll.bytes) != top]
    inside = [r for r in wait if health_[r] in FAULTY]
    recorded = find_mismatch(view)
    recorded_odd = [r for r in recorded.odd if r in view.ranks] if recorded is not None else []
    how = "unknown"
    culprits: list[int] = []
    for how, culprits in (  # noqa: B007
        ("mismatched", recorded_odd),
        ("missing", missing),
        ("behind", behind),
        ("mismatched", mismatched),
        ("failed_inside", inside),
        ("other_group", list(elsewhere)),
    ):
        if culprits:
            break
    else:
        how = "unknown"
        found = ref_fr_blame(view, now, health_)
        if found is not None and found.culprits:
            return found
        if unheard:
            how = "unheard"
    blamed = set(culprits)
    return Blame(
        group=group,
        seq=seq,
        op=ops.most_common(1)[0][0],
        waiters=tuple(sorted(r for r in on if r not in blamed)),
        culprits=tuple(sorted(culprits)),
        elsewhere=tuple(r for r in elsewhere if r not in blamed),
        waiting_since=min(rv.coll_enter() for rv in on.values()),
        latest_enter=latest_enter,
        how=how,
        unread=tuple(sorted(unheard)) if how == "unheard" else (),
    )


def ref_victims(health_, blame):
    if blame is None or not blame.culprits or blame.how in ("failed_inside", "unknown", "unproven"):
        return set()
    return {r for r in blame.waiters + blame.elsewhere if health_[r] in FAULTY}


def ref_deadline(view, alive, cfg):
    rvs = [view.ranks[r] for r in alive]
    sts = [rv.step_stats for rv in rvs]
    p99s = [st.p99_step_s for st in sts if st.history]
    step_s = stats.median(p99s)
    if cfg.hang_step_multiple * step_s > cfg.hang_floor_s:
        step_s = ch.unpaused_step_s([st.history for st in sts if st.history], step_s)
    base = max(cfg.hang_floor_s, cfg.hang_step_multiple * step_s)
    base += view.behind_s
    phases = {rv.state.phase for rv in rvs}
    if not phases.isdisjoint(ch.SLOW_PHASES):
        base += cfg.hang_phase_allowance_s
    if "init" in phases or any(st.steps_seen <= cfg.warmup_steps for st in sts):
        base += cfg.hang_warmup_allowance_s
    return base


def ref_hang_state(now, view, cfg):
    health_ = ref_classify_all(view, now, cfg)
    alive = [r for r in view.ranks if health_[r] in (OK, FROZEN)]
    if not alive:
        return None
    blame = ref_analyze(view, now, cfg)
    progress = max(view.ranks[r].progress_at for r in alive)
    age, onset = now - progress, progress
    if blame is not None and now - blame.waiting_since > age:
        age, onset = now - blame.waiting_since, blame.waiting_since
    return HangState(
        age_s=max(0.0, age),
        deadline_s=ref_deadline(view, alive, cfg),
        onset=onset,
        stuck=tuple(sorted(alive)) if blame is None else (),
        health=health_,
        _analysis=lambda: blame,
    )


def ref_frozen_check(cfg, now, view):
    health_ = ref_classify_all(view, now, cfg)
    if FROZEN not in health_.values():
        return []
    blame = ref_analyze(view, now, cfg)
    spared = ref_victims(health_, blame)
    out = []
    for r, rv in sorted(view.ranks.items()):
        if health_[r] != FROZEN or r in spared:
            continue
        s = rv.state
        cpu = s.cpu_percent
        if s.status == "failed":
            why = s.death.get("summary") or "hook status failed"
            kind = f"exiting after an uncaught exception ({why})"
        elif s.proc_status == "stopped":
            kind = "stopped by a signal (SIGSTOP/SIGTSTP, or a debugger)"
        elif cpu < 5:
            kind = f"not running (CPU ~0%, OS state {s.proc_status or 'unknown'})"
        else:
            kind = f"busy in native code holding the GIL (CPU {cpu:.0f}%)"
        waiting = ""
        live_waiters = [w for w in blame.waiters if health_[w] == "ok"] if blame else []
        if blame and r in blame.culprits and live_waiters:
            waiting = f"; {ranks_phrase(live_waiters)} waiting in {blame.op} #{blame.seq} for {seconds(now - blame.waiting_since)}"
        out.append(
            Finding(
                kind="frozen_rank",
                ranks=(r,),
                hosts=(rv.host,),
                onset_mono=rv.last_heartbeat(),
                detected_mono=now,
                reason=f"{who(rv)} is frozen: process alive but heartbeat stale for {seconds(rv.heartbeat_age(now))}, "
                f"{kind}; last seen {where(rv, now)}{waiting}",
                evidence={
                    "heartbeat_age_s": round(rv.heartbeat_age(now), 3),
                    "cpu_percent": cpu,
                    "proc_status": s.proc_status,
                    "step": s.step,
                    "phase": s.phase,
                    "pid": s.pid,
                    "victims": sorted(v for v in spared if v != r),
                },
                wants_stacks=(r,),
            )
        )
    return out


class RefDeadRank(DeadRank):
    """dead_rank as it was: every question asked of every rank's objects."""

    def check(self, now, view):
        health_ = ref_classify_all(view, now, self.cfg)
        if not any(h in (DEAD, LOST) for h in health_.values()):
            return []
        blame = ref_analyze(view, now, self.cfg)
        spared = ref_victims(health_, blame)
        mismatch = find_mismatch(view)
        if mismatch is not None and mismatch.odd:
            spared |= {r for r in mismatch.usual if health_[r] == DEAD}
        lost = self._lost_hosts(now, view, health_)
        events = [(f.onset_mono, f.ranks, False) for f in lost]
        for r, rv in view.ranks.items():
            if health_[r] == DEAD and r not in spared and rv.died_at is not None:
                events.append((rv.died_at, (r,), rv.died_precise))
        events.sort()
        out = list(lost)
        root_t = None
        cluster: list[int] = []
        followers: list[int] = []
        precise = True
        for at, ranks, exact in events:
            if root_t is not None and at - root_t <= (TIE_S if precise and exact else TIE_COARSE_S):
                cluster += ranks if len(ranks) == 1 and health_[ranks[0]] == DEAD else []
                continue
            if root_t is not None and at - root_t <= CASCADE_S:
                followers += ranks
                continue
            if cluster:
                out += self._dead_ref(now, view, cluster, followers, spared, blame)
            root_t, precise, followers = at, exact, []
            cluster = list(ranks) if len(ranks) == 1 and health_[ranks[0]] == DEAD else []
        if cluster:
            out += self._dead_ref(now, view, cluster, followers, spared, blame)
        return out + self._left_early(now, view, health_, blame, spared)  # (its inputs are the reference's)

    def _dead_ref(self, now, view, cluster, followers, spared, blame):
        rvs = [view.ranks[r] for r in sorted(cluster)]
        first = min(rv.died_at for rv in rvs)
        seen = min(rv.dead_seen_at for rv in rvs)
        lost = ref_lost_hosts(view, now, self.cfg)
        heard = all(hv.received_at >= first or h in lost for h, hv in view.hosts.items())
        patience = 1.5 * max(view.reporting_interval(hv) for hv in view.hosts.values())
        judging = any(  # a host silent since before the death: judged (lost or not) at its limit
            hv.received_at < first
            and h not in lost
            and now - hv.received_at < health.host_silence_limit(view, h, self.cfg)
            for h, hv in view.hosts.items()
        )
        if not heard and (now - seen < patience or judging):
            return []
        after = sorted(set(followers) | {v for v in spared if v not in cluster})
        then = f"; {ranks_phrase(after)} failed after it" if after else ""
        waiting = ""
        live_waiters = [w for w in blame.waiters if view.ranks[w].state.alive] if blame else []
        if blame and set(cluster) & set(blame.culprits) and live_waiters:
            waiting = f"; {ranks_phrase(live_waiters)} waiting in {blame.op} #{blame.seq} for {seconds(now - blame.waiting_since)}"
        rv = rvs[0]
        causes = {x.rank: x.state.death.get("summary", "") for x in rvs if x.state.death.get("summary")}
        if len(rvs) == 1:
            cause = causes.get(rv.rank) or f"process gone (hook status {rv.state.status})"
            head = f"{who(rv)} died: {cause}, last seen {where(rv, now)}"
        else:
            hosts = sorted({x.host for x in rvs})
            span = max(x.died_at for x in rvs) - first
            head = (
                f"{ranks_phrase(cluster)} (host {', '.join(hosts)}) died within {seconds(span)} of each other, "
                f"order unknown: processes gone, rank {rv.rank} last seen {where(rv, now)}"
            )
            by_cause: dict[str, list[int]] = {}
            for r, c in sorted(causes.items()):
                by_cause.setdefault(c, []).append(r)
            head += "".join(f"; {ranks_phrase(rs)}: {c}" for c, rs in by_cause.items())
        return [
            Finding(
                kind=self.name,
                ranks=tuple(sorted(cluster)),
                hosts=tuple(sorted({x.host for x in rvs})),
                onset_mono=first,
                detected_mono=now,
                reason=head + waiting + then,
                evidence={
                    "pids": {str(x.rank): x.state.pid for x in rvs},
                    "status": rv.state.status,
                    "step": rv.state.step,
                    "phase": rv.state.phase,
                    "last_heartbeat_age_s": round(rv.heartbeat_age(now), 3),
                    "died_precise": all(x.died_precise for x in rvs),
                    "followers": after,
                    **(
                        {"death": {str(x.rank): x.state.death for x in rvs if x.state.death}}
                        if any(x.state.death for x in rvs)
                        else {}
                    ),
                },
            )
        ]

    def _lost_hosts(self, now, view, health_):
        out = []
        verdicts = health.silences(view, now, self.cfg)
        by_host: dict[str, list[int]] = {}
        for r, rv in view.ranks.items():
            if health_[r] == LOST:
                by_host.setdefault(rv.host, []).append(r)
        for host, hv in sorted(view.hosts.items()):
            ranks = sorted(by_host.get(host, ()))
            if not ranks:
                continue
            silent = now - hv.received_at
            steps = sorted({view.ranks[r].state.step for r in ranks})
            out.append(
                Finding(
                    kind=self.name,
                    ranks=tuple(ranks),
                    hosts=(host,),
                    onset_mono=hv.received_at,
                    detected_mono=now,
                    reason=(
                        f"host {host} lost: no report from its agent for {seconds(silent)} (expected every "
                        f"{seconds(hv.interval_s)}); {verdicts[host].why}: {ranks_phrase(ranks)} taken for dead, "
                        f"last at step {steps[0] if len(steps) == 1 else f'{steps[0]}-{steps[-1]}'}"
                    ),
                    evidence={
                        "silent_s": round(silent, 3),
                        "lost_on": verdicts[host].evidence.get("evidence", ""),
                        "limit_s": health.host_silence_limit(view, host, self.cfg),
                        "agent_id": hv.agent_id,
                        "last_seq": hv.seq,
                    },
                )
            )
        return out


def ref_hang_check(cfg, now, view, monkeypatch):
    """collective_hang's check (its per-finding text is unchanged) on the reference hang state."""
    with monkeypatch.context() as m:
        m.setattr(ch, "hang_state", lambda now_, view_, cfg_: ref_hang_state(now_, view_, cfg_))
        det = CollectiveHang(cfg)
        return det.check(now, view), det.gauges(now, view)


# -- the comparison -------------------------------------------------------------------------------


def _compare(view: ClusterView, now: float, cfg: DetectorConfig, monkeypatch) -> tuple:
    """Every answer of the hang path on ``view``, new against reference; returns a
    summary of what the view exercised."""
    got_health = health.classify_all.uncached(view, now, cfg)
    assert got_health == ref_classify_all(view, now, cfg)
    assert list(got_health) == list(view.ranks)
    assert health.lost_hosts(view, now, cfg) == ref_lost_hosts(view, now, cfg)
    blame = health._analyze.uncached(view, now, cfg)
    assert blame == ref_analyze(view, now, cfg)
    assert health.victims(view, now, cfg, got_health, blame) == ref_victims(got_health, blame)
    got_state, want_state = ch.hang_state.uncached(now, view, cfg), ref_hang_state(now, view, cfg)
    assert got_state == want_state
    if want_state is not None:  # the blame is read when asked for (not compared with the state)
        assert got_state is not None
        assert got_state.blame == want_state.blame
        assert health.waiting_since(view, now, cfg) == (blame.waiting_since if blame is not None else None)
    frozen = FrozenRank(cfg).each(now, view)  # per rank, before the grouping (test_coord_dead_frozen.py)
    assert frozen == ref_frozen_check(cfg, now, view)
    dead = DeadRank(cfg).check(now, view)
    assert dead == RefDeadRank(cfg).check(now, view)
    det = CollectiveHang(cfg)
    hang = det.check(now, view)
    assert (hang, det.gauges(now, view)) == ref_hang_check(cfg, now, view, monkeypatch)
    c = columns.of(view)
    fr = {r for r, rv in view.ranks.items() if rv.colls or rv.state.fr_newest_seq}
    assert {r for r, held in zip(c.rank, c.fr_held) if held} == fr
    return (
        None if blame is None else (blame.source, blame.how),
        frozenset(got_health.values()) | {f.kind for f in frozen + dead + hang},
    )


GROUPS = (0, 0, 0, 5, 9)


def _random_rank(rng: random.Random, r: int, n: int, front: int, odds: float, since0: float):
    """One rank: with probability ``1 - odds`` a healthy one waiting in collective
    #front on the default group (entered ``since0`` ago), else in one of the states
    a hang is made of."""

    unlike = rng.random() < odds  # this rank differs from the healthy waiters in some ways

    def odd(healthy, *others):
        return rng.choice(others) if unlike and rng.random() < 0.35 else healthy

    role = rng.choice(("wait", "behind", "odd", "step", "stuck", "data", "leak", "elsewhere")) if unlike else "wait"
    group = rng.choice(GROUPS[1:]) if role == "elsewhere" else odd(0, *GROUPS)
    seq = front - (role == "behind")
    op, nbytes = ("broadcast", 8) if role == "odd" else ("all_reduce", 64)
    since = odd(since0, 0.5, 3.0, 8.0, 12.0, 30.0)
    waiting = role in ("wait", "behind", "odd", "leak", "elsewhere")
    kw: dict = {
        "world_size": n,
        "step": odd(100, 0, 3, 100),
        "step_age_s": since + odd(0.0, 0.1, 2.0)
        if waiting and role != "leak"
        else rng.choice((0.05, 9.0, 40.0, since0 - STALL_SLACK_S)),
        "collective": t.coll(
            seq=seq if waiting else front - 1,
            done_seq=seq - 1 if waiting else front - 1,
            outstanding=1 if waiting else 0,
            since_s=since,
            group=group,
            op=op,
            nbytes=nbytes,
        ),
        "in_data_wait": role == "data",
        "data_wait_age_s": 7.0 if role == "data" else 0.0,
        "phase": odd("train", "eval", "checkpoint", "init"),
        "heartbeat_age_s": odd(0.2, 12.0, 40.0),
        "proc_status": odd("running", "sleeping", "stopped"),
        "alive": odd(True, False),
        "status": odd("running", "exited", "disabled", "failed"),
        "cpu_percent": rng.choice((1.0, 99.0)),
        "recent_steps": t.steps(1, odd(12, 0, 3), step_s=rng.choice((0.1, 0.3))),
    }
    if unlike and rng.random() < 0.5:  # the Flight Recorder's view: a C++-issued collective the marks do not see
        k = front + rng.choice((-1, 0, 1))
        states = ("scheduled",) * 3 + ("started", "completed")
        kw["recent_colls"] = tuple(
            t.sig(s, group=rng.choice((0, 0, 5)), age_s=20.0 - s, state=rng.choice(states))
            for s in range(max(1, k - 2), k + 1)
        )
        kw["fr_read_age_s"] = rng.choice((-1.0, 0.5, 15.0))
    elif unlike and rng.random() < 0.2:
        kw["fr_newest_seq"] = front
        kw["fr_read_age_s"] = 1.0
    if kw["status"] == "failed":
        kw["death"] = {"summary": "RuntimeError: boom"}
    if not kw["alive"]:
        kw["gone_age_s"] = rng.choice((0.0, 0.001, 0.5, 4.0))
    return t.rank(r, **kw)


def _random_view(rng: random.Random) -> tuple[ClusterView, float, DetectorConfig]:
    n = rng.randrange(2, 40)
    front = rng.randrange(3, 60)
    odds = rng.choice((0.0, 0.05, 0.1, 0.3, 1.0))
    since0 = rng.choice((0.5, 2.5, 3.0, 12.0))  # 2.5: entered just as a quiet host last reported
    states = [_random_rank(rng, r, n, front, odds, since0) for r in rng.sample(range(n), n)]
    if rng.random() < 0.15:  # a minority waits on another group (a subgroup's collective)
        moved = set(rng.sample(range(n), (n - 1) // 2))
        states = [replace(s, coll=replace(s.coll, group=5)) if s.rank in moved else s for s in states]
    if rng.random() < 0.2:  # nobody in a collective the marks see: stalled, or in the Flight Recorder's
        states = [replace(s, coll=t.coll(seq=front - 1, done_seq=front - 1), step_age_s=20.0) for s in states]
    if rng.random() < 0.2:  # ranks of an earlier world (a restart with fewer ranks): gone ones, or any
        gone_only = rng.random() < 0.6
        states = [
            replace(s, world_size=n + rng.choice((1, 8)))
            if rng.random() < 0.5 and (not gone_only or not s.alive or s.status == "exited")
            else s
            for s in states
        ]
    now = 100.0
    # Hosts heard from now, a little while ago (quiet), or long ago (lost).
    hosts = sorted({t.host_of(s.rank) for s in states})
    received = dict.fromkeys(hosts, now)
    if rng.random() < 0.4:
        received[rng.choice(hosts)] = now - rng.choice((2.5, 4.0, 20.0))
    first = t.view([replace(s, heartbeat_age_s=0.1, alive=True) for s in states], now=now - 30.0)
    view = (
        t.view(states, now=now, received=received, base=first, seq=2)
        if rng.random() < 0.7
        else t.view(states, now=now, received=received)
    )
    cfg = DetectorConfig(hang_warmup_allowance_s=rng.choice((0.0, 30.0)), hang_floor_s=rng.choice((1.0, 5.0)))
    at = now + rng.choice((0.0, 0.5, 1.5, 6.0))
    return view, at, cfg


def test_the_hang_path_on_columns_is_the_plain_code_on_random_views(monkeypatch):
    rng = random.Random(13)
    seen_blames: Counter[tuple | None] = Counter()  # the kinds of blame the random views gave
    seen_health: Counter[str] = Counter()
    for trial in range(400):
        view, now, cfg = _random_view(rng)
        try:
            blame, kinds = _compare(view, now, cfg, monkeypatch)
        except AssertionError as exc:
            raise AssertionError(f"trial {trial}") from exc
        seen_blames[blame] += 1
        seen_health.update(kinds)
    # The views exercised what a hang is made of (or this test would prove little).
    hows = {b[1] for b in seen_blames if b is not None}
    assert {"missing", "behind", "mismatched", "failed_inside", "other_group", "unknown", "unheard"} <= hows, hows
    assert ("flight_recorder", "missing") in seen_blames or ("flight_recorder", "unproven") in seen_blames
    assert None in seen_blames
    assert {OK, DEAD, FROZEN, EXITED, LOST, "dead_rank", "frozen_rank", "collective_hang"} <= set(seen_health)


def test_the_hang_path_on_columns_is_the_plain_code_on_simulated_faults(monkeypatch):
    """Jobs that run, then hang in a rank's own code, die (alone, or with victims after
    it), stop, or exit early; each also with a host that goes silent (quiet, then lost)."""
    faults = ("hang", "kill", "cascade", "stop", "exit_early")
    seen: Counter[str] = Counter()
    # A host lost for real: its agent silent from when its rank 4 dies, the others failing inside the collective.
    cases = [*((f, s) for f in faults for s in ((), ("host1",))), ("host_loss", ("host1",))]
    for seed, (fault, silent) in enumerate(cases):
        sim = t.SimJob(world_size=12, jitter=0.1, seed=seed)
        if fault == "cascade":
            sim.kill(3, 5, victims_die_after=2.0)
        elif fault == "host_loss":
            sim.kill(4, 5, victims_die_after=0.5)
        else:
            getattr(sim, fault)(3, 5)
        quiet_from = 2.4 if fault == "host_loss" else 6.0
        for until in (0.5, 2.5, 3.2, 4.5, 6.0, 7.5, 9.0, 12.0, 18.0, 30.0):
            view = sim.run_until(until, silent_hosts=silent if until > quiet_from else ())
            for now in (until, until + 0.7, until + 3.0):
                seen.update(_compare(view, now, sim.cfg, monkeypatch)[1])
    assert {"dead_rank", "frozen_rank", "collective_hang", LOST, EXITED} <= set(seen), seen


def _ref_rank_ranges(ranks) -> str:
    """finding.rank_ranges as it was: a step per rank."""
    out, items, i = [], sorted(set(ranks)), 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out)


def test_rank_ranges_are_the_plain_walks():
    """The waiters' phrase, on every tick of a hang at scale: runs found by halving."""
    rng = random.Random(3)
    cases = [[], [5], [16383], list(range(16384)), [r for r in range(16384) if r != 10923], list(range(0, 600, 2))]
    for _ in range(1500):
        span = rng.choice((20, 80, 400, 5000))
        cases.append([rng.randrange(-3, span) for _ in range(rng.randrange(0, 300))])
        lo = rng.randrange(0, 100)
        cases.append([r for r in range(lo, lo + rng.randrange(1, 200)) if rng.random() > 0.02])
    for ranks in cases:
        assert rank_ranges(ranks) == _ref_rank_ranges(ranks), ranks
