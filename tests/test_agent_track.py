"""Pure decisions of the agent: staleness, rank state, newest-wins, windowed stats."""

import pytest

from watchdog.agent import testing
from watchdog.agent.processes.table import GONE, ProcSample
from watchdog.agent.slotfiles import slot_states
from watchdog.contracts import slot as wire

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
    reason = slot_states.stale_reason(h, proc, NOW_MONO, NOW_WALL, stale_after_s=30)
    assert bool(reason) is stale, reason


def test_rank_state_exited_is_not_dead():
    assert slot_states.rank_state(wire.Status.EXITED, GONE) == slot_states.EXITED
    assert slot_states.rank_state(wire.Status.RUNNING, GONE) == slot_states.DEAD
    assert slot_states.rank_state(wire.Status.RUNNING, ALIVE) == slot_states.ALIVE
    assert slot_states.rank_state(wire.Status.DISABLED, ALIVE) == slot_states.ALIVE


def claim(first_seen, seen_alive, alive, created=0, path="/x"):
    return slot_states.Claim(first_seen, seen_alive, alive, (created, 0), path)


@pytest.mark.parametrize(
    "claims, winner",
    [
        # later first sight wins, whatever creation time the writer put in the file
        ({"old": claim(1, True, True, created=900), "new": claim(5, True, True, created=100)}, "new"),
        # a torchrun restart: the old worker dead, the new one alive
        ({"old": claim(1, True, False), "new": claim(5, True, True)}, "new"),
        # a slot never seen alive, however late and however "new", cannot hide a live rank
        ({"live": claim(1, True, True), "forged": claim(9, False, False, created=10**18)}, "live"),
        # ... but after the live one died it is the latest word (a crash loop's incarnation)
        ({"dead": claim(1, True, False), "never": claim(9, False, False)}, "never"),
        # first seen in the same poll (an agent's first): the live one, then the writer's time
        ({"a": claim(1, False, False, created=900), "b": claim(1, True, True, created=100)}, "b"),
        ({"a": claim(1, True, True, created=100), "b": claim(1, True, True, created=900)}, "b"),
        ({"a": claim(1, False, False, path="/a"), "b": claim(1, False, False, path="/b")}, "b"),
    ],
)
def test_speaker_is_the_latest_first_seen_and_never_a_never_alive_over_a_live(claims, winner):
    won = slot_states.speakers(claims, lambda name: ("j", 0), claims.__getitem__)
    assert won == {("j", 0): winner}


def test_speakers_are_per_job_and_rank():
    claims = {"r0": claim(1, True, True), "r1": claim(2, True, True), "r0b": claim(3, True, True)}
    ranks = {"r0": ("j", 0), "r1": ("j", 1), "r0b": ("j", 0)}
    assert slot_states.speakers(claims, ranks.__getitem__, claims.__getitem__) == {("j", 0): "r0b", ("j", 1): "r1"}


TRUSTED = frozenset({7})


@pytest.mark.parametrize(
    "owner, uid, admitted",
    [
        (None, 1000, True),  # no live rank claimed the job yet
        (1000, 1000, True),
        (1000, 65534, False),  # another user's slot for someone else's job, whatever its pid
        (0, 65534, False),
        (1000, 0, False),  # root is a user like any other for a job it does not own
        (1000, 7, True),  # a trusted uid writes for others
        (1000, -1, True),  # unknown (fakes)
    ],
)
def test_job_admits_only_its_owner_and_trusted_uids(owner, uid, admitted):
    assert slot_states.job_admits(owner, uid, TRUSTED) is admitted


@pytest.mark.parametrize(
    "owner, uid, alive, after",
    [
        (None, 1000, True, 1000),  # the first live rank fixes the owner
        (None, 1000, False, None),  # a dead slot proves nothing (anyone can name a dead pid)
        (None, 7, True, None),  # a trusted uid writes for others: fixes nothing
        (None, -1, True, None),
        (1000, 2000, True, 1000),  # fixed once
    ],
)
def test_job_owner_is_fixed_by_the_first_live_rank(owner, uid, alive, after):
    assert slot_states.job_owner(owner, uid, alive, TRUSTED) == after


def test_window_mean_uses_last_32_steps():
    recs = [testing.step_record(i, i + 1, step_ns=(1 if i < 8 else 2) * S // 10) for i in range(40)]
    assert slot_states.window_mean_s(recs) == pytest.approx(0.2)
    assert slot_states.window_mean_s(recs[:4]) == pytest.approx(0.1)
    assert slot_states.window_mean_s([]) == 0.0


def test_cpu_percent_between_samples():
    a = ProcSample(True, "running", cpu_seconds=10.0, sampled_ns=100 * S)
    b = ProcSample(True, "running", cpu_seconds=10.5, sampled_ns=101 * S)
    assert slot_states.cpu_percent(a, b) == pytest.approx(50.0)
    assert slot_states.cpu_percent(None, b) == 0.0
    assert slot_states.cpu_percent(b, a) == 0.0


def test_labels_are_bounded():
    assert slot_states.label(wire.Phase, 2, "other") == "checkpoint"
    assert slot_states.label(wire.Phase, 99, "other") == "other"
    assert slot_states.step_sample(testing.step_record(0, 7, S, S // 4, S // 2, phase=wire.Phase.EVAL)).phase == "eval"


def test_age_never_negative_and_zero_for_never():
    assert slot_states.age_s(10 * S, 0) == 0.0
    assert slot_states.age_s(10 * S, 11 * S) == 0.0
    assert slot_states.age_s(10 * S, 8 * S) == 2.0
