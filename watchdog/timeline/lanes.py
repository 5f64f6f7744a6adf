"""Slot snapshots (``evidence`` events) -> one rank's lane.

A rank can be snapshotted several times (one evidence event per finding and per
action): records of the same process are merged by ring index, so the lane holds
every record any snapshot saw, and the header of the latest snapshot says where
the rank was last. Each snapshot's own (created_wall, created_mono) pair maps its
monotonic times to wall time.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from watchdog.contracts import slot as wire
from watchdog.contracts.evidence import SlotEvidence
from watchdog.contracts.finding import group_name, seconds

from .model import Lane, Mark, RankNow, Span, StepSpan


def _label(enum: Callable[[int], Enum], value: int) -> str:
    try:
        return enum(value).name.lower()
    except ValueError:
        return f"#{value}"


LIFE_SIGNS = (
    "heartbeat_ns",
    "step_start_ns",
    "data_enter_ns",
    "data_exit_ns",
    "coll_enter_ns",
    "coll_exit_ns",
    "phase_since_ns",
    "pg_change_ns",
)
STALE_HEARTBEAT_S = 1.0  # the hook beats several times a second: a longer silence is worth drawing


def build(slots: list[SlotEvidence], alive: bool | None = None, gone_seen: float | None = None) -> Lane:
    """``slots``: every snapshot of one rank in one section (non-empty). ``alive``:
    whether the coordinator last knew the process alive (None: unknown);
    ``gone_seen``: when the coordinator learned it was gone (wall)."""
    latest = max(slots, key=lambda s: (s.created_mono_ns, s.taken_mono_ns))
    same = [s for s in slots if (s.pid, s.proc_start_us) == (latest.pid, latest.proc_start_us)]
    latest = max(same, key=lambda s: s.taken_mono_ns)
    records: dict[int, list[int]] = {}
    for snap in same:
        for words in snap.records:
            if len(words) >= wire.RECORD_WORDS:
                records[words[wire.R_INDEX]] = words
    lane = Lane(
        rank=latest.rank,
        host=latest.host,
        pid=latest.pid,
        torn=latest.torn,
        incarnations=len({(s.pid, s.proc_start_us) for s in slots}),
    )
    wall = latest.to_wall
    phase_changes = _read_records(lane, records, wall)
    h = latest.header
    t_end = wall(latest.taken_mono_ns)
    for snap in same:  # every snapshot saw one heartbeat: a frozen rank's stop moving
        if snap.header.get("heartbeat_ns"):
            mark = Mark(
                wall(snap.header["heartbeat_ns"]), "heartbeat", f"heartbeat #{snap.header.get('heartbeat_count', 0)}"
            )
            if mark not in lane.marks:
                lane.marks.append(mark)
    lane.marks.sort(key=lambda m: m.t)
    # Phases: each PHASE record starts one; train is the default and not drawn.
    if h.get("phase_since_ns") and (not phase_changes or wall(h["phase_since_ns"]) > phase_changes[-1][0] + 1e-6):
        phase_changes.append((wall(h["phase_since_ns"]), _label(wire.Phase, h.get("phase", 0))))
    for i, (t, phase) in enumerate(phase_changes):
        end = phase_changes[i + 1][0] if i + 1 < len(phase_changes) else t_end
        if phase != "train" and end > t:
            lane.spans.append(Span(phase, t, end, phase, open=i + 1 == len(phase_changes)))
    if alive is False:
        # A gone process did nothing after its last sign of life; it died between then
        # and when its agent noticed.
        last = wall(max(h.get(k, 0) for k in LIFE_SIGNS))
        lane.spans += _in_flight(h, wall, last)
        seen = gone_seen if gone_seen and gone_seen > last else t_end
        lane.spans.append(Span("gone", last, seen, "process gone (died in this interval)"))
    else:
        lane.spans += _in_flight(h, wall, t_end)
        hb = h.get("heartbeat_ns")
        if hb and (latest.taken_mono_ns - hb) / 1e9 > STALE_HEARTBEAT_S:
            lane.spans.append(Span("silent", wall(hb), t_end, "no heartbeat"))
    lane.now = _now(latest, h, wall, t_end, alive)
    return lane


def _read_records(lane: Lane, records: dict[int, list[int]], wall: Callable[[int], float]) -> list[tuple[float, str]]:
    """The slot's event records in order: steps and marks into ``lane``; the phase
    changes (wall time, phase) returned."""
    phase_changes: list[tuple[float, str]] = []
    for index in sorted(records):
        w = records[index]
        kind, t = w[wire.R_KIND], wall(w[wire.R_T_NS])
        if kind == wire.RecordKind.STEP_END:
            step_s = w[wire.R_A] / 1e9
            lane.steps.append(
                StepSpan(
                    step=w[wire.R_STEP],
                    start=t - step_s,
                    end=t,
                    data_s=w[wire.R_B] / 1e9,
                    coll_s=w[wire.R_C] / 1e9,
                    n_coll=w[wire.R_D],
                    last_seq=w[wire.R_E],
                    phase=_label(wire.Phase, w[wire.R_F]),
                )
            )
        elif kind == wire.RecordKind.PHASE:
            phase_changes.append((t, _label(wire.Phase, w[wire.R_A])))
        elif kind == wire.RecordKind.PG:
            lane.marks.append(Mark(t, "pg", f"process group {_label(wire.PgState, w[wire.R_A])}"))
        elif kind == wire.RecordKind.CONTROL:
            result = "ok" if w[wire.R_C] == 0 else f"failed ({w[wire.R_C]})"
            lane.marks.append(
                Mark(t, "control", f"control #{w[wire.R_A]} {_label(wire.Command, w[wire.R_B])}: {result}")
            )
        elif kind == wire.RecordKind.ERROR:
            lane.marks.append(Mark(t, "error", f"hook errors: {w[wire.R_A]}"))
    return phase_changes


def _before_init(h: dict) -> bool:
    """In or before init_process_group. A rank that steps or runs collectives is
    past it even when PG state was never recorded (no torch.distributed patching)."""
    if h.get("pg_state") == wire.PgState.INITIALIZING:
        return True
    return h.get("pg_state") == wire.PgState.NONE and not h.get("step") and not h.get("coll_seq")


def _in_flight(h: dict, wall: Callable[[int], float], t_end: float) -> list[Span]:
    """The step in progress when the slot was read, and what the rank was doing in it."""
    if h.get("status") == wire.Status.EXITED or _before_init(h):
        return []
    start = h.get("step_start_ns", 0)
    t_end = max(t_end, wall(start))
    out = [Span("step", wall(start), t_end, f"step {h.get('step', 0) + 1} (in progress)", open=True)]
    data_in, data_out = h.get("data_enter_ns", 0), h.get("data_exit_ns", 0)
    coll_in, coll_out = h.get("coll_enter_ns", 0), h.get("coll_exit_ns", 0)
    op = _label(wire.CollOp, h.get("coll_op", 0))
    if data_in >= start and data_out > data_in:
        out.append(Span("data", wall(data_in), wall(data_out), "data wait"))
    if h.get("coll_outstanding", 0) > 0:
        before = max(start, data_out)
        if coll_in > before:  # in the step, before entering the collective it waits in
            out.append(Span("code", wall(before), wall(coll_in), "own code"))
        out.append(
            Span(
                "collective", wall(coll_in), t_end, f"{op} #{h.get('coll_seq', 0)}", open=True, seq=h.get("coll_seq", 0)
            )
        )
        return out
    if coll_in >= start and coll_out > coll_in:
        out.append(
            Span("collective", wall(coll_in), wall(coll_out), f"{op} #{h.get('coll_seq', 0)}", seq=h.get("coll_seq", 0))
        )
    if data_in > data_out:
        out.append(Span("data", wall(data_in), t_end, "data wait", open=True))
    else:
        since = max(start, data_out, coll_out)
        out.append(Span("code", wall(since), t_end, "own code", open=True))
    return out


def _now(snap: SlotEvidence, h: dict, wall: Callable[[int], float], t_end: float, alive: bool | None) -> RankNow:
    mono = snap.taken_mono_ns
    step, phase = h.get("step", 0), _label(wire.Phase, h.get("phase", 0))
    op = _label(wire.CollOp, h.get("coll_op", 0))
    seq, done, out = h.get("coll_seq", 0), h.get("coll_done_seq", 0), h.get("coll_outstanding", 0)

    gone = alive is False

    last = max(h.get(k, 0) for k in LIFE_SIGNS)

    def dur(ns: int) -> str:
        # A gone process died at an unknown moment after its last sign of life: at least that long.
        if gone:
            return f" for >= {seconds(max(0.0, (last - ns) / 1e9))}" if last > ns else ""
        return f" for {seconds(max(0.0, (mono - ns) / 1e9))}"

    if h.get("status") == wire.Status.EXITED:
        where, activity = f"exited (the hook saw the interpreter exit) after step {step}", "exited"
        brief = "exited"
    elif _before_init(h) and h.get("pg_state") == wire.PgState.NONE:
        where = brief = "before process-group init"
        activity = "init"
    elif _before_init(h):
        where, activity = f"inside init_process_group (rendezvous){dur(h.get('pg_change_ns', mono))}", "init"
        brief = f"in rendezvous{dur(h.get('pg_change_ns', mono))}"
    elif h.get("data_enter_ns", 0) > h.get("data_exit_ns", 0):
        where, activity = f"in the data loader{dur(h.get('data_enter_ns', mono))} at step {step}", "data"
        brief = f"in the data loader{dur(h.get('data_enter_ns', mono))}"
    elif out > 0:
        where = (
            f"in {op} #{seq} on {group_name(h.get('coll_group', 0))}{dur(h.get('coll_enter_ns', mono))} at step {step}"
        )
        activity, brief = "collective", f"in {op} #{seq}{dur(h.get('coll_enter_ns', mono))}"
    else:
        since = max(h.get("step_start_ns", 0), h.get("coll_exit_ns", 0), h.get("data_exit_ns", 0))
        place = "in training code" if phase == "train" else f"in {phase}"
        where = (
            f"{place}, outside collectives and data loading{dur(since)}, at step {step} (last collective #{done} done)"
        )
        activity, brief = "code", f"{place}{dur(since)}, not in a collective"
    if gone:
        where, activity, brief = f"process gone; last seen {where}", "gone", f"process gone; was {brief}"
    hb = h.get("heartbeat_ns")
    return RankNow(
        t=t_end,
        source="slot",
        step=step,
        phase=phase,
        where=where,
        brief=brief,
        activity=activity,
        coll_op=op,
        coll_group=h.get("coll_group", 0),
        coll_seq=seq,
        coll_done_seq=done,
        coll_outstanding=out,
        heartbeat_age_s=round((mono - hb) / 1e9, 3) if hb else None,
        alive=alive,
        status=_label(wire.Status, h.get("status", 0)),
    )
