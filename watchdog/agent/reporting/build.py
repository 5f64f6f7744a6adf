"""The per-host report for the coordinator: a pure function of the tracked ranks and
an explicit ``now``. Ages are against the agent's monotonic clock at build time."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from watchdog.agent.slotfiles import slot_states
from watchdog.agent.slotfiles.local_rank import LocalRank
from watchdog.contracts import slot as wire
from watchdog.contracts.slot import R_A, R_K, Clock
from watchdog.report import MAX_COLLS_PER_RANK, MAX_STEPS_PER_RANK, CollectiveState, CollSig, HostReport, RankState


def coll_sig(rec: wire.Record, now_mono_ns: int, now_wall_ns: int) -> CollSig:
    """A COLL_SIG record as the report carries it; its age read on the clock the
    hook said its times came from."""
    group, seq, op, elements, dtype, state, shape, created, _started, _done, clock, inputs = rec.payload[
        : R_K - R_A + 2
    ]
    now = now_wall_ns if clock == Clock.WALL else now_mono_ns
    return CollSig(
        group=group,
        seq=seq,
        op=slot_states.label(wire.CollOp, op, "other"),
        elements=elements,
        dtype=wire.DTYPES[dtype] if 0 <= dtype < len(wire.DTYPES) else "unknown",
        shape=wire.unpack_shape(shape),
        inputs=inputs,
        state=slot_states.label(wire.CollState, state, "unknown"),
        age_s=slot_states.age_s(now, created) if created > 0 and now > 0 else 0.0,
        clock=slot_states.label(Clock, clock, "none"),
    )


Mark = int | tuple[int, int]  # first step-ring index not reported, or (that, first event-ring index)


def rank_state(
    v: LocalRank, now_ns: int, since: Mark = 0, now_wall_ns: int = 0, steps: bool = True, colls_since: Mark = 0
) -> RankState:
    """``since``: the first ring record index not yet reported for this slot (and,
    as a pair, the first event-ring index: version-2 slots number them apart).
    ``steps``: carry the step samples (CPU and GPU clock) since then; without
    them the state is the rank's liveness and progress only, and the samples come
    in a later report (its ``since`` is not moved on: ``sender.Sender``).
    ``colls_since``: the same mark after the last report, with or without samples:
    the collective records before it went already (they share ``since``'s rings)."""
    since, events_since = _pair(since)
    colls_since, colls_events_since = _pair(colls_since)
    colls_from, colls_events_from = max(since, colls_since), max(events_since, colls_events_since)
    h, ident, age = v.header, v.identity, lambda w: slot_states.age_s(now_ns, h[w])
    coll = CollectiveState(
        group=h[wire.H_COLL_GROUP],
        seq=h[wire.H_COLL_SEQ],
        done_seq=h[wire.H_COLL_DONE_SEQ],
        op=slot_states.label(wire.CollOp, h[wire.H_COLL_OP], "other"),
        bytes=h[wire.H_COLL_BYTES],
        outstanding=h[wire.H_COLL_OUTSTANDING],
        since_s=age(wire.H_COLL_ENTER_NS),
    )
    fresh = [r for r in v.step_records if r.index >= since][-MAX_STEPS_PER_RANK:] if steps else []
    colls = [coll_sig(r, now_ns, now_wall_ns) for r in v.coll_records if r.index >= colls_from]
    colls += [coll_sig(r, now_ns, now_wall_ns) for r in v.event_colls if r.index >= colls_events_from]
    colls = colls[-MAX_COLLS_PER_RANK:]
    gpu = [g for i, g in v.gpu_steps if i >= events_since][-MAX_STEPS_PER_RANK:] if steps else []
    return RankState(
        rank=ident.rank,
        local_rank=ident.local_rank,
        world_size=ident.world_size,
        pid=ident.pid,
        proc_start_us=ident.proc_start_us,
        alive=v.proc.alive,
        status=slot_states.reported_status(h.status, v.state),
        step=h[wire.H_STEP],
        step_age_s=age(wire.H_STEP_START_NS),
        heartbeat_age_s=slot_states.age_s(now_ns, v.heartbeat_ns),
        phase=slot_states.label(wire.Phase, h[wire.H_PHASE], "other"),
        phase_age_s=age(wire.H_PHASE_SINCE_NS),
        pg_state=slot_states.label(wire.PgState, h[wire.H_PG_STATE], "none"),
        pg_age_s=age(wire.H_PG_CHANGE_NS),
        in_data_wait=h.in_data_wait,
        data_wait_age_s=age(wire.H_DATA_ENTER_NS) if h.in_data_wait else 0.0,
        coll=coll,
        last_step_s=h[wire.H_LAST_STEP_NS] / 1e9,
        last_data_s=h[wire.H_LAST_DATA_NS] / 1e9,
        last_coll_s=h[wire.H_LAST_COLL_NS] / 1e9,
        hook_errors=h[wire.H_HOOK_ERRORS],
        cpu_percent=v.cpu_percent,
        oncpu_share=v.oncpu_share,
        runq_share=v.runq_share,
        rss_bytes=v.proc.rss_bytes,
        torn=v.torn,
        created_wall=h.created_wall_ns / 1e9,
        recent_steps=tuple(slot_states.step_sample(r) for r in fresh),
        recent_colls=tuple(c for c in colls if c.seq > 0),
        recent_gpu=tuple(gpu),
        gpu_clock=v.gpu_clock,
        proc_status=v.proc.status,
        # > 0 marks the time as measured (the coordinator orders deaths by it).
        gone_age_s=max(1e-6, slot_states.age_s(now_ns, v.proc.gone_ns)) if not v.proc.alive and v.proc.gone_ns else 0.0,
        launcher_pid=v.launcher[0],
        launcher_start_us=v.launcher[1],
        ctrl_ack_seq=h[wire.H_CTRL_ACK_SEQ],
        ctrl_ack_step=h[wire.H_CTRL_ACK_STEP],
        ctrl_ack_ok=h[wire.H_CTRL_ACK_RESULT] >= 0,
        **_loss(h),
        coll_bytes_total=h[wire.H_TOTAL_COLL_BYTES],
        batch_per_rank=h[wire.H_BATCH_PER_RANK],
        **_fr_read(h, now_ns),
        death=v.death,
        **_frame(h),
    )


def _frame(h: wire.SlotHeader) -> dict:
    """The hook's frame sample while the rank is still in the step it was taken in:
    where it holds the job now (after that step, the words stay until the next
    long step's sample; sent on, they would cost every report of every rank)."""
    got = h.frame
    if got is None or got[0] != h[wire.H_STEP] + 1:
        return {}  # none sampled (an older hook, a copy torn by a write) or an old one: the defaults say so
    step, _t_ns, text = got
    return {"frame": text, "frame_step": step}


def _fr_read(h: wire.SlotHeader, now_ns: int) -> dict:
    if h[wire.H_FR_READ_NS] <= 0:
        return {}  # never read (or an older hook): the defaults say so
    return {
        "fr_read_age_s": slot_states.age_s(now_ns, h[wire.H_FR_READ_NS]),
        "fr_newest_group": h[wire.H_FR_NEWEST_GROUP],
        "fr_newest_seq": h[wire.H_FR_NEWEST_SEQ],
    }


def _loss(h: wire.SlotHeader) -> dict:
    value = h.loss
    if value is None:
        return {}
    finite = math.isfinite(value)
    return {
        "loss": value if finite else 0.0,
        "loss_finite": finite,
        "loss_step": h[wire.H_LOSS_STEP],
        "loss_bad_step": h[wire.H_LOSS_BAD_STEP],
        "loss_bad_count": h[wire.H_LOSS_BAD_COUNT],
    }


def build_report(
    job: str,
    host: str,
    agent_id: str,
    seq: int,
    tracked_ranks: Iterable[LocalRank],
    now_mono_ns: int,
    now_wall: float,
    interval_s: float,
    *,
    since: Mapping[str, Mark] | None = None,
    accelerators: Sequence[dict] = (),
    acks: Sequence[dict] = (),
    steps: bool = True,
    colls_since: Mapping[str, Mark] | None = None,
) -> HostReport:
    """One job's report. ``since`` maps a slot path to the first step record index
    not yet reported (see ``marks``); missing paths report every retained record.
    ``steps`` and ``colls_since``: whether its ranks carry their step samples, and
    where their collective records start (``rank_state``)."""
    since, colls_since = since or {}, colls_since or {}
    wall_ns = round(now_wall * 1e9)
    ranks = tuple(
        rank_state(v, now_mono_ns, since.get(v.path, 0), wall_ns, steps, colls_since.get(v.path, 0))
        for v in tracked_ranks
        if v.identity.job == job
    )
    return HostReport(
        job=job,
        host=host,
        agent_id=agent_id,
        seq=seq,
        sent_wall=now_wall,
        interval_s=interval_s,
        ranks=ranks,
        accelerators=tuple(accelerators),
        acks=tuple(acks),
    )


def pending_steps(v: LocalRank, since: Mark) -> int:
    """How many of the slot's step records a report has not carried yet."""
    first = _pair(since)[0]
    return sum(1 for r in v.step_records if r.index >= first)


def _pair(mark: Mark) -> tuple[int, int]:
    """(first step-ring index, first event-ring index) of a mark."""
    return mark if isinstance(mark, tuple) else (mark, 0)


def marks(tracked_ranks: Iterable[LocalRank]) -> dict[str, Mark]:
    """path -> the ``since`` for the next report once this one was delivered: the
    step ring's next index (shared there by every kind a version-1 slot holds),
    paired with the event ring's when the slot has one."""
    out: dict[str, Mark] = {}
    for v in tracked_ranks:
        last = max((rs[-1].index for rs in (v.step_records, v.coll_records) if rs), default=-1)
        last_ev = max(v.event_colls[-1].index if v.event_colls else -1, v.gpu_steps[-1][0] if v.gpu_steps else -1)
        if last_ev >= 0:
            out[v.path] = (last + 1, last_ev + 1)
        elif last >= 0:
            out[v.path] = last + 1
    return out


def jobs(tracked_ranks: Iterable[LocalRank]) -> list[str]:
    return sorted({v.identity.job for v in tracked_ranks})
