"""A host's dumps run in parallel within one deadline (``watchdog.agent.command_channel.dumpall``).
Time is a number the jobs move; threads are real, waits are on events."""

from __future__ import annotations

import threading

from watchdog.agent.command_channel import dumpall


def late(i, why):
    return ("late", i, why)


def test_up_to_parallel_dumps_run_at_once_and_results_keep_the_jobs_order():
    barrier = threading.Barrier(4, timeout=30)  # breaks (and fails the test) unless 4 run together
    active, peak, lock = [0], [0], threading.Lock()

    def job(i):
        def run(left_s):
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            barrier.wait()
            with lock:
                active[0] -= 1
            return ("ok", i, left_s)

        return run

    out = dumpall.run([job(i) for i in range(8)], late, parallel=4, deadline_s=60.0)
    assert [r[:2] for r in out.results] == [("ok", i) for i in range(8)] and out.late == []
    assert peak[0] == 4 and all(0 < r[2] <= 60.0 for r in out.results)


def test_a_dump_not_started_by_the_deadline_is_reported_late_not_run():
    now = [100.0]
    ran = []

    def job(i):
        def run(left_s):
            ran.append((i, left_s))
            now[0] += 4.0  # each dump takes 4 s of the 10 s deadline
            return ("ok", i)

        return run

    out = dumpall.run([job(i) for i in range(4)], late, parallel=1, deadline_s=10.0, mono=lambda: now[0])
    assert ran == [(0, 10.0), (1, 6.0), (2, 2.0)]  # each gets only the time left as its timeout
    assert out.results[3][0] == "late" and "deadline of 10 s" in out.results[3][2]
    assert out.late == [3] and out.duration_s == 12.0


def test_a_crashing_or_stuck_dump_becomes_a_late_result_never_an_exception():
    release = threading.Event()

    def crash(left_s):
        raise RuntimeError("boom")

    def stuck(left_s):
        release.wait(30)
        return ("ok", 1)

    try:
        out = dumpall.run([crash, stuck, lambda left: ("ok", 2)], late, parallel=3, deadline_s=0.2, grace_s=0.2)
    finally:
        release.set()
    assert out.results[0][0] == "late" and "RuntimeError: boom" in out.results[0][2]
    assert out.results[1][0] == "late" and "still running 0.4 s after the start" in out.results[1][2]
    assert out.results[2] == ("ok", 2) and out.late == [0, 1]


def test_no_jobs_is_no_pool():
    out = dumpall.run([], late)
    assert out.results == [] and out.late == []
