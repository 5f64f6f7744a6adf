"""Pure decisions of the agent: staleness, rank state, newest-wins, windowed stats."""

import pytest

from watchdog import wire
from watchdog.agent import testing, track
from watchdog.agent.procs import GONE, ProcSample

S = 1_000_000_000
NOW_MONO = 10_000 * S
NOW_WALL = 1_800_000_000 * S
ALIVE = ProcSample(True, "sleeping")


def header(hb_mono, *, created_mono=None, created_wall=None, status=wire.Status.RUNNING, rank=0, job="j"):
    created_mono = hb_mono - S if created_mono is None else created_mono
    # By default the wall clock agrees with the monotonic one (no reboot in between).
    created_wall = NOW_WALL - (NOW_MONO - created_mono) if created_wall is None else created_wall
    snap = testing.snapshot(
        testing.identity(job, rank, 4, pid=123, proc_start_us=1),
        {wire.H_HEARTBEAT_NS: hb_mono},
        mono_ns=created_mono,
        wall_ns=created_wall,
        status=status,
    )
    return snap.header


@pytest.mark.parametrize(
    "proc, hb_age_s, kw, stale",
    [
        (ALIVE, 3600, {}, False),  # alive is never stale, however old the heartbeat (SIGSTOPped for an hour)
        (GONE, 5, {}, False),  # died 5 s ago: a post-mortem, not a leftover
        (GONE, 31, {}, True),
        (ProcSample(False, "reused"), 31, {}, True),
        (GONE, -5, {}, True),  # heartbeat in the future: written before a reboot
        (GONE, 5, {"created_wall": NOW_WALL - 3600 * S}, True),  # recent by mono, old by wall: a reboot
    ],
)
def test_stale_at_first_sight(proc, hb_age_s, kw, stale):
    h = header(NOW_MONO - hb_age_s * S, **kw)
    reason = track.stale_reason(h, proc, NOW_MONO, NOW_WALL, stale_after_s=30)
    assert bool(reason) is stale, reason


def test_rank_state_exited_is_not_dead():
    assert track.rank_state(wire.Status.EXITED, GONE) == track.EXITED
    assert track.rank_state(wire.Status.RUNNING, GONE) == track.DEAD
    assert track.rank_state(wire.Status.RUNNING, ALIVE) == track.ALIVE
    assert track.rank_state(wire.Status.DISABLED, ALIVE) == track.ALIVE


def test_newest_per_rank_wins_by_created_wall_time():
    old = testing.snapshot(testing.identity("j", 0, 2, pid=10, proc_start_us=1), wall_ns=100 * S, path="/a")
    new = testing.snapshot(testing.identity("j", 0, 2, pid=11, proc_start_us=1), wall_ns=200 * S, path="/b")
    other = testing.snapshot(testing.identity("j", 1, 2, pid=12, proc_start_us=1), wall_ns=50 * S, path="/c")
    won = track.newest_per_rank([new, old, other], lambda s: s.header, lambda s: s.path)
    assert won == {("j", 0): new, ("j", 1): other}
    won = track.newest_per_rank([old, new], lambda s: s.header, lambda s: s.path)
    assert won[("j", 0)] is new


def test_window_mean_uses_last_32_steps():
    recs = [testing.step_record(i, i + 1, step_ns=(1 if i < 8 else 2) * S // 10) for i in range(40)]
    assert track.window_mean_s(recs) == pytest.approx(0.2)
    assert track.window_mean_s(recs[:4]) == pytest.approx(0.1)
    assert track.window_mean_s([]) == 0.0


def test_cpu_percent_between_samples():
    a = ProcSample(True, "running", cpu_seconds=10.0, sampled_ns=100 * S)
    b = ProcSample(True, "running", cpu_seconds=10.5, sampled_ns=101 * S)
    assert track.cpu_percent(a, b) == pytest.approx(50.0)
    assert track.cpu_percent(None, b) == 0.0
    assert track.cpu_percent(b, a) == 0.0


def test_labels_are_bounded():
    assert track.label(wire.Phase, 2, "other") == "checkpoint"
    assert track.label(wire.Phase, 99, "other") == "other"
    assert track.step_sample(testing.step_record(0, 7, S, S // 4, S // 2, phase=wire.Phase.EVAL)).phase == "eval"


def test_age_never_negative_and_zero_for_never():
    assert track.age_s(10 * S, 0) == 0.0
    assert track.age_s(10 * S, 11 * S) == 0.0
    assert track.age_s(10 * S, 8 * S) == 2.0
