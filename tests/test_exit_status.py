"""A nonzero exit is a failure: the pure parts, table-driven. How a ``SystemExit``
code becomes an exit status, how a rank's end is classified from the hook's
status and the exit status, and the one line a finding says about it."""

from __future__ import annotations

import os

import pytest

from watchdog.agent.processes import deathcause
from watchdog.agent.processes.table import ProcSample
from watchdog.agent.slotfiles import slot_states
from watchdog.contracts import crash_record as crashrecord
from watchdog.contracts import slot as wire
from watchdog.hook.lifecycle import crash_writer, exitcall

GONE = ProcSample(status="gone", alive=False)
ALIVE = ProcSample(status="running", alive=True)
EXITED, FAILED, RUNNING = wire.Status.EXITED, wire.Status.FAILED, wire.Status.RUNNING


@pytest.mark.parametrize(
    "code,status",
    [(None, 0), (0, 0), (1, 1), (3, 3), (256, 0), (-1, 255), (True, 1), (False, 0), ("no data", 1), ([1], 1)],
)
def test_a_systemexit_code_gives_cpythons_exit_status(code, status):
    assert exitcall.exit_status(code) == status


@pytest.mark.parametrize(
    "call,code,failed,label",
    [
        (exitcall.SYS_EXIT, 1, True, "sys.exit(1)"),
        (exitcall.SYS_EXIT, None, False, "sys.exit()"),
        (exitcall.SYS_EXIT, 0, False, "sys.exit(0)"),
        (exitcall.SYS_EXIT, "no data", True, "sys.exit('no data')"),
        (exitcall.OS_EXIT, 3, True, "os._exit(3)"),
        (exitcall.OS_EXIT, 0, False, "os._exit(0)"),
        (exitcall.OS_EXIT, "x", False, "os._exit('x')"),  # os._exit refuses it (TypeError): not an exit
    ],
)
def test_an_exit_call_is_a_failure_when_its_status_is_not_zero(call, code, failed, label):
    ex = exitcall.note(call, code)
    assert (ex.failed, ex.label()) == (failed, label)


def test_the_exception_being_handled_is_the_cause_but_a_systemexit_is_not():
    try:
        raise ValueError("bad batch")
    except ValueError:
        assert exitcall.handled()[0] is ValueError
    try:
        raise SystemExit(1)
    except SystemExit:
        assert exitcall.handled() == (None, None, None)
    assert exitcall.handled() == (None, None, None)


def test_an_exception_held_by_the_code_that_exits_is_the_cause():
    def click_like():  # click 8.2+: leaves the except block keeping e.show, then sys.exit
        report = None
        try:
            raise ValueError("bad batch")
        except ValueError as e:
            report = e.__str__
        assert report is not None
        return exitcall.handled()

    def plain():
        status = 1
        assert status
        return exitcall.handled()

    assert click_like()[:2][0] is ValueError and str(click_like()[1]) == "bad batch"
    assert plain() == (None, None, None)


@pytest.mark.parametrize(
    "hook,proc,exit_code,state",
    [
        (EXITED, GONE, None, slot_states.EXITED),  # status not read: the hook's clean exit stands
        (EXITED, GONE, 0, slot_states.EXITED),
        (EXITED, GONE, 1, slot_states.DEAD),  # raise SystemExit(1): the hook saw a normal shutdown
        (EXITED, GONE, -9, slot_states.DEAD),  # killed after atexit
        (EXITED, ALIVE, None, slot_states.EXITED),  # shutting down
        (FAILED, GONE, 1, slot_states.DEAD),
        (FAILED, GONE, None, slot_states.DEAD),
        (RUNNING, GONE, None, slot_states.DEAD),
        (RUNNING, ALIVE, None, slot_states.ALIVE),
    ],
)
def test_a_rank_is_dead_when_gone_unless_it_exited_cleanly_with_status_zero(hook, proc, exit_code, state):
    assert slot_states.rank_state(hook, proc, exit_code) == state


@pytest.mark.parametrize(
    "hook,state,reported",
    [
        (EXITED, slot_states.EXITED, "exited"),
        (EXITED, slot_states.DEAD, "failed"),  # the exit status overrules the hook
        (FAILED, slot_states.DEAD, "failed"),
        (RUNNING, slot_states.DEAD, "running"),  # SIGKILLed: the coordinator sees alive=false
        (RUNNING, slot_states.ALIVE, "running"),
    ],
)
def test_the_reported_status_is_exited_only_for_a_clean_exit(hook, state, reported):
    assert slot_states.reported_status(hook, state) == reported


def exit_wait(code: int) -> int:
    return code << 8  # the wait status of a normal exit with that code


def crash(tmp_path, exc: BaseException | None, call: str, status: int) -> str:
    slot = str(tmp_path / "r.slot")
    open(slot, "wb").close()  # a crash record is read only beside its slot, from the slot's owner
    tb = None
    if exc is not None:
        try:
            raise exc
        except BaseException as e:  # noqa: BLE001 - any exception is a cause
            tb = e.__traceback__
    assert crash_writer.write(slot, type(exc) if exc else None, exc, tb, "MainThread", {"call": call, "status": status})
    return slot


@pytest.mark.parametrize(
    "exc,call,status,wait,hook,summary,code",
    [
        # hydra / click: the exception being handled, then sys.exit(1); the zombie was read
        (
            ValueError("bad batch"),
            "sys.exit(1)",
            1,
            exit_wait(1),
            "failed",
            "ValueError: bad batch at test_exit_status.py:",
            1,
        ),
        # the zombie was reaped first: the status the rank asked for
        (ValueError("bad batch"), "sys.exit(1)", 1, None, "failed", "exit 1 by sys.exit(1)", 1),
        (None, "os._exit(3)", 3, None, "failed", "exit 3 by os._exit(3)", 3),
        (None, "sys.exit('no data')", 1, exit_wait(1), "failed", "exit 1 by sys.exit('no data')", 1),
    ],
)
def test_the_finding_names_the_cause_and_the_exit_status(tmp_path, exc, call, status, wait, hook, summary, code):
    out = deathcause.explain(wait_status=wait, hook_status=hook, slot_path=crash(tmp_path, exc, call, status))
    assert summary in out["summary"] and f"exit {code} by {call}" in out["summary"], out
    assert (out["exit_code"], out["exit_call"]) == (code, call)
    assert ("exception" in out) == (exc is not None)


@pytest.mark.parametrize(
    "wait,hook,summary",
    [
        (exit_wait(4), "exited", "exit 4 (a SystemExit or C-level exit with a nonzero status)"),
        (exit_wait(0), "exited", "exit 0"),
        (9, "running", "exit -9 (SIGKILL)"),
    ],
)
def test_without_a_record_the_exit_status_alone_is_said(tmp_path, wait, hook, summary):
    out = deathcause.explain(wait_status=wait, hook_status=hook, slot_path=str(tmp_path / "none.slot"), kmsg=os.devnull)
    assert out["summary"] == summary


def test_a_hostile_exit_field_is_dropped_and_the_rest_read(tmp_path):
    slot = str(tmp_path / "r.slot")
    open(slot, "wb").close()
    rec = crash_writer.describe(None, None, None, "MainThread", {"call": "sys.exit(1)", "status": 999})
    assert crash_writer.write_record(slot, rec)
    got = crashrecord.read_crash(slot)
    assert got is not None and "exit" not in got


# -- a death replaced by its launcher before the other hosts reported -----------------
#
# Two hosts (hosta: ranks 0-1, hostb: ranks 2-3), reports every second. Rank 2 catches an
# exception and exits 1 at 10.3; hostb's torchrun stops rank 3 and starts both again;
# gloo fails ranks 0-1 inside the all-reduce rank 2 never entered. hostb tells the deaths
# at 10.5 and the successors at 11.5; hosta's report, due at 11.0, is late (a busy host)
# and comes at 12.8. dead_rank waits for hosta (it may hold an earlier death) past the
# successors' arrival: the death must still be judged, and named, once hosta is heard.

CAUSE = "ValueError: bad batch at step 103 at train.py:40; exit 1 by sys.exit(1)"
NEW_START = 1_800_000_000_000_000


def _rank(r: int, now: float, **kw):
    from watchdog.coordinator import testing as T

    step = int(now * 10)
    return T.rank(r, world_size=4, **{"step": step, "collective": T.coll(seq=step, done_seq=step), **kw})


def _hostb(now: float, seq: int):
    from watchdog.coordinator import testing as T

    if now < 10.3:
        states = [_rank(2, now), _rank(3, now)]
    elif now < 11.5:  # the deaths, told once
        died = {"alive": False, "status": "failed", "step": 103, "collective": T.coll(seq=103, done_seq=103)}
        states = [
            _rank(2, now, **died, gone_age_s=now - 10.3, death={"summary": CAUSE, "exit_code": 1}),
            _rank(3, now, **died, gone_age_s=now - 10.4, death={"summary": "exit -15 (SIGTERM)", "signal": "SIGTERM"}),
        ]
    else:  # torchrun's new workers: in init_process_group, then training from the checkpoint (step 100)
        step = 100 + max(0, int((now - 13.4) * 10))
        states = [
            T.rank(
                r,
                world_size=4,
                pid=3000 + r,
                proc_start_us=NEW_START,
                step=step,
                pg_state="initializing" if now < 13.0 else "joined",
                collective=T.coll(seq=step, done_seq=step),
            )
            for r in (2, 3)
        ]
    return T.report("hostb", states, seq=seq)


def _hosta(now: float, seq: int):
    from watchdog.coordinator import testing as T

    if now < 10.3:
        return T.report("hosta", [_rank(0, now), _rank(1, now)], seq=seq)
    waiting = T.coll(seq=104, done_seq=103, outstanding=1, since_s=now - 10.25)
    victim = {"summary": "RuntimeError: Connection closed by peer; exit 1", "exit_code": 1}
    states = [
        _rank(r, now, alive=False, status="failed", step=103, collective=waiting, gone_age_s=now - 10.32, death=victim)
        for r in (0, 1)
    ]
    return T.report("hosta", states, seq=seq)


def _replaced_before_judged(tmp_path, policy=None):
    """The coordinator through that story, ticking every 0.25 s; its journal, and the
    pid it showed for rank 2 at each tick."""
    from watchdog.coordinator.config import Config
    from watchdog.coordinator.journal import jsonl as journal
    from watchdog.coordinator.journal.jsonl import Journal
    from watchdog.coordinator.service import Coordinator

    path = str(tmp_path / "journal.jsonl")
    kw = {"policy": policy} if policy is not None else {}
    c = Coordinator(
        Config(journal=path, job="job", world_size=4, tick_s=0.25, token="secret", **kw),
        Journal(path, lambda: (1.7e9, 0.0)),
    )
    reports = [(float(s), _hosta, "hosta") for s in range(1, 11)] + [(12.8, _hosta, "hosta")]
    reports += [(s + 0.5, _hostb, "hostb") for s in range(1, 14)]
    reports.sort(key=lambda x: x[0])
    seqs = {"hosta": 0, "hostb": 0}
    shown = []
    now = 0.0
    for i in range(1, 60):
        now = i * 0.25
        while reports and reports[0][0] <= now:
            at, make, host = reports.pop(0)
            seqs[host] += 1
            c.accept(make(at, seqs[host]), at)
        c.tick(now, 1.7e9 + now)
        rv = c.view_at(now).ranks.get(2)
        shown.append((now, rv.state.pid if rv else None))
    c.journal.close()
    return journal.read(path), shown


def test_a_death_replaced_before_every_host_reported_is_still_named(tmp_path):
    from watchdog.coordinator.journal import event_names as je

    recs, shown = _replaced_before_judged(tmp_path)
    found = [r for r in recs if r["event"] == je.FINDING]
    assert [(f["kind"], f["ranks"]) for f in found] == [("dead_rank", [2])], [f["reason"] for f in found]
    f = found[0]
    assert "died: ValueError: bad batch at step 103" in f["reason"] and "exit 1 by sys.exit(1)" in f["reason"]
    assert f["evidence"]["death"]["2"]["exit_code"] == 1
    # judged once hosta was heard (12.8), on the first tick after: not before, not later
    assert f["detected_wall"] - 1.7e9 == 13.0, f
    assert sorted(f["evidence"]["followers"]) == [0, 1, 3], f["evidence"]
    # the dead incarnation stood in for its successor until that tick judged it; then the successor
    assert [pid for at, pid in shown if 11.5 <= at < 13.0] == [1002] * 6
    assert [pid for at, pid in shown if at > 13.0] and all(pid == 3002 for at, pid in shown if at > 13.0)


def test_the_policy_does_not_restart_a_group_its_launcher_restarted(tmp_path):
    from watchdog.coordinator.journal import event_names as je
    from watchdog.coordinator.policy_file import Policy

    pol = Policy(actions={"dead_rank": "restart"}, min_finding_age_s=0, cooldown_s=0, abort_grace_s=3)
    recs, _ = _replaced_before_judged(tmp_path, pol)
    events = [r["event"] for r in recs]
    # torchrun's restart, counted once, as the launcher's; the finding judged after it holds the
    # policy's restart back, saying why; nothing signalled
    (launcher,) = [r for r in recs if r["event"] == je.LAUNCHER_RESTART]
    assert (launcher["restart"], launcher["by"]) == (1, "launcher"), launcher
    assert je.ACTION not in events and je.RESTART not in events, events
    (held,) = [r for r in recs if r["event"] == je.ACTION_HELD]
    assert "restarted by its launcher already" in held["reason"] and held["kind"] == "dead_rank", held
    assert events.index(je.LAUNCHER_RESTART) < events.index(je.FINDING) < events.index(je.ACTION_HELD)
    assert [r for r in recs if r["event"] == je.COMMAND and r.get("type") == "signal"] == []


def test_the_overlay_shows_the_held_death_with_the_columns_a_view_of_it_builds():
    from watchdog.coordinator import testing as T
    from watchdog.coordinator.view import columns
    from watchdog.coordinator.view.cluster import Folder, empty
    from watchdog.coordinator.view.unjudged import HOLD_MAX_S, Unjudged

    folder = Folder(empty("job", 4))
    folder.fold(T.report("hosta", [_rank(0, 10.0), _rank(1, 10.0)], seq=1), 10.0)
    folder.fold(_hostb(10.0, 1), 10.0)
    folder.fold(_hostb(10.5, 2), 10.5)  # rank 2 and 3 dead
    assert folder.take_replaced() == []
    dead = folder.snapshot().ranks[2]
    folder.fold(_hostb(11.5, 3), 11.5)  # their successors
    assert [rv.rank for rv in folder.take_replaced()] == [2, 3] and folder.take_replaced() == []
    held = Unjudged()
    held.hold([dead], 11.5)
    assert held.overlay(folder.snapshot()).ranks[2].state.pid == 3002  # a death not known to be pending
    held.died(2, 1002, 10.5)
    held.hold([dead], 11.5)
    snap = folder.snapshot()
    shown = held.overlay(snap)
    assert list(shown.ranks) == list(snap.ranks) and shown.ranks[2] is dead and shown.ranks[3] is snap.ranks[3]
    built = columns.build(shown)
    for name in columns.NAMES:
        assert list(getattr(columns.of(shown), name)) == list(getattr(built, name)), name
    assert columns.of(snap).pid[2] == 3002  # the snapshot's own columns untouched
    held.release(shown, 12.0, judged=False)
    assert held.overlay(snap).ranks[2] is dead  # not judged yet: still shown
    held.release(snap, 12.0, judged=True)
    assert held.overlay(snap).ranks[2] is dead  # that view did not show it: not judged by it
    held.release(shown, 12.25, judged=True)
    assert not held and held.overlay(snap) is snap
    held.died(2, 3002, 20.0)  # whatever the ticks say, nothing is held past HOLD_MAX_S
    held.hold([snap.ranks[2]], 20.0)
    held.release(snap, 20.0 + HOLD_MAX_S, judged=False)
    assert not held and held.overlay(snap) is snap
