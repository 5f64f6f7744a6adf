"""SlotTracker: slot tracking across polls with a fake run dir, fake processes and an
explicit clock; survival of bad input with real files."""

import dataclasses
import errno
import os
import time
from types import SimpleNamespace

import psutil
import pytest

from watchdog import report as wire_report
from watchdog.agent import testing
from watchdog.agent.processes.table import ProcessTable
from watchdog.agent.reporting import build as agent_report
from watchdog.agent.slotfiles import slot_states
from watchdog.agent.slotfiles.listing import CachedLister
from watchdog.agent.slotfiles.tracker import READ_ERROR_REASONS, SlotTracker
from watchdog.agent.testing import FakeProcess, FakeProcesses
from watchdog.contracts import slot as wire

S = 1_000_000_000
T0 = 5_000 * S  # monotonic
W0 = 1_800_000_000 * S  # wall, same instant


class Log:
    def __init__(self):
        self.events = []

    def _rec(self, level):
        return lambda event, **kw: self.events.append((level, event, kw))

    def __getattr__(self, level):
        return self._rec(level)

    def named(self, event):
        return [kw for _, e, kw in self.events if e == event]


class World:
    """A fake run dir: path -> SlotSnapshot or an exception to raise on read."""

    def __init__(self):
        self.files, self.inodes, self.reads = {}, {}, []
        self._next_inode = 1

    def put(self, path, value):
        if path not in self.files:
            self.inodes[path], self._next_inode = self._next_inode, self._next_inode + 1
        self.files[path] = value

    def remove(self, path):
        del self.files[path], self.inodes[path]

    def lister(self, run_dir, now_ns):
        return dict(self.inodes)

    def read(self, path, since=0):
        self.reads.append((path, since))
        value = self.files[path]
        if isinstance(value, BaseException):
            raise value
        return dataclasses.replace(value, records=tuple(r for r in value.records if r.index >= since))


def slot(
    path,
    rank=0,
    pid=100,
    *,
    hb=T0,
    created_wall=None,
    job="j",
    status=wire.Status.RUNNING,
    words=None,
    records=(),
    torn=False,
):
    ident = testing.identity(job, rank, 4, pid=pid, proc_start_us=int(1000.0 * 1e6))
    created_mono = hb - S
    w = {wire.H_HEARTBEAT_NS: hb, **(words or {})}
    return testing.snapshot(
        ident,
        w,
        path=path,
        mono_ns=created_mono,
        wall_ns=W0 - (T0 - created_mono) if created_wall is None else created_wall,
        records=records,
        torn=torn,
        status=status,
    )


def tracker(world, *procs, **kw):
    log = Log()
    t = SlotTracker(
        "/run", procs=ProcessTable(FakeProcesses(*procs)), read=world.read, lister=world.lister, log=log, **kw
    )
    return t, log


def proc(pid=100, **kw):
    return FakeProcess(pid, 1000.0, **kw)


def test_live_rank_is_exported():
    w = World()
    w.put("/run/a.slot", slot("/run/a.slot"))
    t, log = tracker(w, proc())
    t.poll(T0, W0)
    (v,) = t.views()
    assert v.state == slot_states.ALIVE and v.proc.alive and v.identity.rank == 0
    assert log.named("rank appeared")[0]["state"] == "alive"
    assert t.state_counts()[slot_states.ALIVE] == 1


def test_stale_at_first_sight_is_ignored_and_logged_once():
    w = World()
    w.put("/run/old.slot", slot("/run/old.slot", pid=555, hb=T0 - 60 * S))
    t, log = tracker(w)  # pid 555 does not exist
    for i in range(3):
        t.poll(T0 + i * S // 10, W0 + i * S // 10)
    assert t.views() == ()
    assert t.state_counts()[slot_states.STALE] == 1
    assert len(log.named("slot stale")) == 1
    assert len(w.reads) == 1  # not re-read every poll


def test_dead_at_first_sight_with_fresh_heartbeat_is_a_post_mortem():
    w = World()
    w.put("/run/a.slot", slot("/run/a.slot", pid=555, hb=T0 - 2 * S))
    t, _ = tracker(w)
    t.poll(T0, W0)
    (v,) = t.views()
    assert v.state == slot_states.DEAD and not v.proc.alive


def test_pid_reuse_is_not_alive():
    w = World()
    w.put("/run/a.slot", slot("/run/a.slot", pid=100))
    t, _ = tracker(w, FakeProcess(100, 1000.0 + 5.0))  # pid 100 now belongs to a later process
    t.poll(T0, W0)
    (v,) = t.views()
    assert not v.proc.alive and v.proc.status == "reused" and v.state == slot_states.DEAD


def test_newest_wins_and_older_becomes_history():
    w = World()
    w.put("/run/old.slot", slot("/run/old.slot", pid=100, created_wall=W0 - 100 * S))
    w.put("/run/new.slot", slot("/run/new.slot", pid=101, created_wall=W0 - 10 * S))
    t, log = tracker(w, proc(100), proc(101))
    t.poll(T0, W0)
    (v,) = t.views()
    assert v.path == "/run/new.slot"
    assert t.state_counts()[slot_states.SUPERSEDED] == 1
    assert log.named("slot superseded")[0]["path"] == "/run/old.slot"
    w.remove("/run/new.slot")  # its file goes: the older one speaks for the rank again
    t.poll(T0 + S, W0 + S)
    assert [v.path for v in t.views()] == ["/run/old.slot"]


def test_dead_after_alive_stays_dead_until_a_newer_slot():
    w = World()
    p = proc(100)
    w.put("/run/a.slot", slot("/run/a.slot", pid=100, words={wire.H_STEP: 41}))
    t, log = tracker(w, p, proc(200))
    t.poll(T0, W0)
    p.running = False  # SIGKILL
    w.put("/run/a.slot", slot("/run/a.slot", pid=100, words={wire.H_STEP: 42}))
    for i in range(1, 5):
        t.poll(T0 + i * S, W0 + i * S)  # long after --stale.after-seconds: still exported
    (v,) = t.views()
    assert v.state == slot_states.DEAD and not v.proc.alive
    assert v.header[wire.H_STEP] == 42  # the read after the death shows the final state
    assert len(log.named("rank died")) == 1
    assert len([r for r in w.reads if r[0] == "/run/a.slot"]) == 2  # frozen after the final read
    w.put("/run/b.slot", slot("/run/b.slot", pid=200, hb=T0 + 5 * S, created_wall=W0 + 5 * S))
    t.poll(T0 + 5 * S, W0 + 5 * S)
    (v,) = t.views()
    assert v.path == "/run/b.slot" and v.state == slot_states.ALIVE


def test_clean_exit_is_exited_not_dead():
    w = World()
    p = proc(100)
    w.put("/run/a.slot", slot("/run/a.slot"))
    t, log = tracker(w, p)
    t.poll(T0, W0)
    w.put("/run/a.slot", slot("/run/a.slot", status=wire.Status.EXITED))
    p.running = False
    t.poll(T0 + S, W0 + S)
    (v,) = t.views()
    assert v.state == slot_states.EXITED and not v.proc.alive
    assert log.named("rank exited") and not log.named("rank died")


def test_step_records_accumulate_and_since_advances():
    w = World()
    recs = [testing.step_record(i, i + 1, S // 10) for i in range(3)]
    w.put("/run/a.slot", slot("/run/a.slot", words={wire.H_RING_HEAD: 3}, records=recs))
    t, _ = tracker(w, proc())
    t.poll(T0, W0)
    recs += [testing.step_record(i, i + 1, S // 5) for i in range(3, 5)]
    w.put("/run/a.slot", slot("/run/a.slot", words={wire.H_RING_HEAD: 5}, records=recs))
    t.poll(T0 + S // 10, W0)
    assert w.reads == [("/run/a.slot", 0), ("/run/a.slot", 3)]
    (v,) = t.views()
    assert [r.index for r in v.step_records] == [0, 1, 2, 3, 4]


def test_torn_read_keeps_last_good_header_but_takes_the_heartbeat():
    w = World()
    w.put("/run/a.slot", slot("/run/a.slot", words={wire.H_STEP: 7}))
    t, _ = tracker(w, proc())
    t.poll(T0, W0)
    w.put("/run/a.slot", slot("/run/a.slot", hb=T0 + S, words={wire.H_STEP: 999}, torn=True))
    t.poll(T0 + S, W0 + S)
    t.poll(T0 + 2 * S, W0 + 2 * S)
    (v,) = t.views()
    assert v.torn and v.header[wire.H_STEP] == 7 and v.heartbeat_ns == T0 + S
    assert t.read_errors["torn"] == 1  # one episode, however many torn reads


def test_a_torn_read_takes_only_the_records_its_kept_header_counts():
    """A rank preempted inside its step-end bracket: the torn header's ring head is one past
    the last good header's step. Taking that record with the old step made the coordinator's
    resumed step one short; it is taken once the next read is whole."""
    w = World()
    recs = [testing.step_record(i, 149 + i, S // 10) for i in range(2)]
    w.put("/run/a.slot", slot("/run/a.slot", words={wire.H_STEP: 149, wire.H_RING_HEAD: 1}, records=recs[:1]))
    t, _ = tracker(w, proc())
    t.poll(T0, W0)
    w.put("/run/a.slot", slot("/run/a.slot", words={wire.H_STEP: 149, wire.H_RING_HEAD: 2}, records=recs, torn=True))
    t.poll(T0 + S // 10, W0)
    (v,) = t.views()
    assert v.header[wire.H_STEP] == 149 and [r.index for r in v.step_records] == [0]
    w.put("/run/a.slot", slot("/run/a.slot", words={wire.H_STEP: 150, wire.H_RING_HEAD: 2}, records=recs))
    t.poll(T0 + 2 * S // 10, W0)
    (v,) = t.views()
    assert v.header[wire.H_STEP] == 150 and [r.index for r in v.step_records] == [0, 1]


def test_other_jobs_are_filtered_and_not_reread():
    w = World()
    w.put("/run/a.slot", slot("/run/a.slot", job="mine"))
    w.put("/run/b.slot", slot("/run/b.slot", job="theirs", pid=101))
    t, _ = tracker(w, proc(100), proc(101), job="mine")
    t.poll(T0, W0)
    t.poll(T0 + S, W0)
    assert [v.identity.job for v in t.views()] == ["mine"]
    assert t.state_counts()[slot_states.OTHER_JOB] == 1
    assert [r for r in w.reads if r[0] == "/run/b.slot"] == [("/run/b.slot", 0)]


def test_bad_files_are_counted_once_per_episode_and_good_ranks_survive():
    w = World()
    w.put("/run/good.slot", slot("/run/good.slot"))
    w.put("/run/garbage.slot", wire.CorruptSlot("bad magic"))
    w.put("/run/future.slot", wire.UnsupportedVersion("slot version 9"))
    w.put("/run/eio.slot", OSError(errno.EIO, "I/O error"))
    w.put("/run/gone.slot", FileNotFoundError(errno.ENOENT, "deleted between listdir and open"))
    t, log = tracker(w, proc())
    for i in range(3):
        t.poll(T0 + i * S // 10, W0)
    assert [v.path for v in t.views()] == ["/run/good.slot"]
    assert t.read_errors == {
        "corrupt": 1,
        "version": 1,
        "torn": 0,
        "io": 1,
        "type": 0,
        "link": 0,
        "owner": 0,
        "record": 0,
        "job_owner": 0,
    }
    assert sorted(kw["reason"] for kw in log.named("slot rejected")) == ["corrupt", "io", "version"]
    assert t.state_counts()[slot_states.INVALID] == 3
    w.put("/run/garbage.slot", slot("/run/garbage.slot", rank=1, pid=100))  # formatted later: recovers
    t.poll(T0 + S, W0 + S)
    assert [v.identity.rank for v in t.views()] == [0, 1]


def test_a_tracked_slot_turning_bad_keeps_its_last_state():
    w = World()
    w.put("/run/a.slot", slot("/run/a.slot", words={wire.H_STEP: 3}))
    t, _ = tracker(w, proc())
    t.poll(T0, W0)
    w.put("/run/a.slot", wire.CorruptSlot("bad magic"))
    t.poll(T0 + S, W0)
    t.poll(T0 + 2 * S, W0)
    (v,) = t.views()
    assert v.header[wire.H_STEP] == 3 and v.proc.alive
    assert t.read_errors["corrupt"] == 1


@pytest.mark.parametrize("fail_at", [1, 2, 3, 4])
def test_process_vanishing_mid_read_keeps_the_loop_going(fail_at):
    w = World()
    w.put("/run/a.slot", slot("/run/a.slot", pid=100))
    w.put("/run/b.slot", slot("/run/b.slot", rank=1, pid=101))
    flaky = FakeProcess(100, 1000.0, fail_at=fail_at, exc=psutil.NoSuchProcess(100))
    t, _ = tracker(w, flaky, proc(101))
    for i in range(3):
        t.poll(T0 + i * S, W0 + i * S)
    a, b = t.views()
    assert not a.proc.alive and a.state == slot_states.DEAD
    assert b.proc.alive and b.state == slot_states.ALIVE


def test_replaced_file_is_a_new_slot():
    w = World()
    w.put("/run/a.slot", slot("/run/a.slot", pid=100))
    t, log = tracker(w, proc(100), proc(101))
    t.poll(T0, W0)
    w.remove("/run/a.slot")
    w.put("/run/a.slot", slot("/run/a.slot", pid=101))  # new inode
    t.poll(T0 + S, W0 + S)
    (v,) = t.views()
    assert v.identity.pid == 101
    assert log.named("slot removed")


def test_missing_run_dir_is_logged_once_and_survived(tmp_path):
    log = Log()
    t = SlotTracker(str(tmp_path / "nope"), log=log)
    t.poll(T0, W0)
    t.poll(T0 + S, W0)
    assert t.views() == () and len(log.named("run dir unreadable")) == 1


# -- real files ---------------------------------------------------------------------


def test_real_garbage_files_and_a_live_writer(tmp_path):
    run = str(tmp_path)
    (tmp_path / "random.slot").write_bytes(os.urandom(3000))
    (tmp_path / "empty.slot").write_bytes(b"")
    wr = testing.RankSlot(run, testing.identity("j", 0, 2))
    wr.step(S // 10, S // 100, S // 50)
    good = open(wr.path, "rb").read()
    (tmp_path / "trunc.slot").write_bytes(good[:300])
    future = bytearray(good)
    future[wire.H_VERSION * 8 : wire.H_VERSION * 8 + 8] = (wire.VERSION + 1).to_bytes(8, "little")
    (tmp_path / "future.slot").write_bytes(bytes(future))
    (tmp_path / "not-a-slot.txt").write_bytes(b"ignored")
    log = Log()
    t = SlotTracker(run, log=log)
    mono, wall = wr.words[wire.H_HEARTBEAT_NS] + S // 10, time.time_ns()
    t.poll(mono, wall)
    (v,) = t.views()
    assert v.proc.alive and v.header[wire.H_STEP] == 1 and len(v.step_records) == 1
    # Just-written files that do not parse may be a hook formatting its slot: not errors yet.
    none = dict.fromkeys(READ_ERROR_REASONS, 0)
    assert t.read_errors == {**none, "version": 1}
    t.poll(mono + 3 * S, wall + 3 * S)
    assert t.read_errors == {**none, "corrupt": 3, "version": 1}
    assert t.state_counts()[slot_states.INVALID] == 4
    wr.close()


def test_a_slot_being_formatted_is_not_an_error():
    w = World()
    w.put("/run/new.slot", wire.CorruptSlot("bad magic (not formatted yet)"))
    mtime = {"/run/new.slot": W0 - S // 2}
    log = Log()
    t = SlotTracker(
        "/run",
        procs=ProcessTable(FakeProcesses(proc())),
        read=w.read,
        lister=w.lister,
        log=log,
        stat=lambda p: SimpleNamespace(st_mtime_ns=mtime[p]),
    )
    t.poll(T0, W0)
    assert t.read_errors["corrupt"] == 0 and not log.events and t.state_counts()[slot_states.INVALID] == 0
    w.put("/run/new.slot", slot("/run/new.slot"))  # formatted now
    t.poll(T0 + S // 10, W0 + S // 10)
    assert len(t.views()) == 1 and t.read_errors["corrupt"] == 0 and not log.named("slot rejected")


def test_cached_lister_scans_only_when_the_directory_changes(tmp_path):
    scans = []

    def scan(run_dir):
        scans.append(run_dir)
        return {"x": 1}

    lister = CachedLister(rescan_s=1.0, scan=scan)
    run = str(tmp_path)
    for i in range(5):
        assert lister(run, T0 + i * S // 10) == {"x": 1}
    assert len(scans) == 1
    (tmp_path / "new.slot").write_bytes(b"")  # bumps the directory's mtime
    lister(run, T0 + S // 2)
    assert len(scans) == 2
    lister(run, T0 + 2 * S)  # and a full rescan every second regardless
    assert len(scans) == 3


def test_a_deleted_tracked_file_is_forgotten_even_if_the_listing_is_stale():
    w = World()
    w.put("/run/a.slot", slot("/run/a.slot"))
    t, log = tracker(w, proc())
    t.poll(T0, W0)
    w.files["/run/a.slot"] = FileNotFoundError(errno.ENOENT, "gone")  # listing still shows it
    t.poll(T0 + S // 10, W0)
    assert t.views() == () and log.named("slot removed")


def test_an_unexpected_exception_on_one_slot_does_not_starve_the_others():
    w = World()
    w.put("/run/a.slot", slot("/run/a.slot", pid=100))
    w.put("/run/b.slot", slot("/run/b.slot", rank=1, pid=101))
    t, log = tracker(w, proc(100), proc(101))
    t.poll(T0, W0)
    w.put("/run/a.slot", ZeroDivisionError("a bug"))  # not a SlotError/OSError: a bug somewhere
    w.put("/run/b.slot", slot("/run/b.slot", rank=1, pid=101, words={wire.H_STEP: 5}))
    t.poll(T0 + S // 10, W0)
    t.poll(T0 + S // 5, W0)
    assert {v.identity.rank: v.header[wire.H_STEP] for v in t.views()} == {0: 0, 1: 5}
    assert len(log.named("slot poll failed")) == 1


# -- abandoned jobs expire; no slots is said out loud ------------------------------


def _dead_job(w, t, job="gone", ranks=(0, 1)):
    for r in ranks:
        w.put(f"/run/{job}{r}.slot", slot(f"/run/{job}{r}.slot", rank=r, pid=600 + r, job=job, hb=T0 - 2 * S))
    t.poll(T0, W0)


def test_abandoned_job_expires_after_the_stated_time_and_is_logged_once():
    w = World()
    t, log = tracker(w, job_expiry_s=900.0)
    _dead_job(w, t)  # processes 600, 601 do not exist: dead, post-mortem kept
    assert {v.state for v in t.views()} == {slot_states.DEAD}
    t.poll(T0 + 899 * S, W0 + 899 * S)
    assert len(t.views()) == 2 and not log.named("job expired")  # the alert keeps firing until then
    reads = len(w.reads)
    for i in range(3):
        t.poll(T0 + (901 + i) * S, W0 + (901 + i) * S)
    assert t.views() == ()  # their series leave /metrics: RankWatchdogRankDead resolves
    (ev,) = log.named("job expired")
    assert (ev["job"], ev["slots"], ev["after_s"]) == ("gone", 2, 900.0) and ev["gone_for_s"] >= 900
    assert t.state_counts()[slot_states.EXPIRED] == 2
    assert len(w.reads) == reads  # expired files are not read again


def test_a_dead_rank_of_a_job_with_a_live_rank_never_expires():
    w = World()
    w.put("/run/live.slot", slot("/run/live.slot", rank=0, pid=100, job="j"))
    w.put("/run/dead.slot", slot("/run/dead.slot", rank=1, pid=601, job="j", hb=T0 - 2 * S))
    t, log = tracker(w, proc(100), job_expiry_s=60.0)
    t.poll(T0, W0)
    t.poll(T0 + 3600 * S, W0 + 3600 * S)
    assert sorted(v.state for v in t.views()) == [slot_states.ALIVE, slot_states.DEAD]
    assert not log.named("job expired")


def test_expiry_counts_from_the_last_death_and_spares_other_jobs():
    w = World()
    t, log = tracker(w, proc(100), job_expiry_s=60.0)
    w.put("/run/other.slot", slot("/run/other.slot", pid=100, job="other"))
    _dead_job(w, t)
    t.poll(T0 + 61 * S, W0 + 61 * S)
    assert [v.identity.job for v in t.views()] == ["other"]
    assert [e["job"] for e in log.named("job expired")] == ["gone"]


def test_a_restarted_job_after_expiry_is_tracked_again():
    w = World()
    t, _ = tracker(w, proc(100), job_expiry_s=60.0)
    _dead_job(w, t, job="j")
    t.poll(T0 + 61 * S, W0 + 61 * S)
    assert t.views() == ()
    w.put("/run/j0-new.slot", slot("/run/j0-new.slot", rank=0, pid=100, job="j", hb=T0 + 62 * S))
    t.poll(T0 + 62 * S, W0 + 62 * S)
    (v,) = t.views()
    assert v.state == slot_states.ALIVE and v.path == "/run/j0-new.slot"


def test_no_slots_for_a_minute_says_where_it_looks_once_and_when_they_come():
    w = World()
    t, log = tracker(w, proc())
    for i in range(0, 200, 10):
        t.poll(T0 + i * S, W0 + i * S)
    (ev,) = log.named("no rank slots found")
    assert ev["run_dir"] == "/run" and ev["waited_s"] == 60 and ev["files"] == 0
    assert "WATCHDOG_RUN_DIR" in ev["detail"] and "/run/rank-watchdog" in ev["detail"]
    w.put("/run/a.slot", slot("/run/a.slot", hb=T0 + 200 * S))
    t.poll(T0 + 200 * S, W0 + 200 * S)
    assert log.named("rank slots found")[0]["slots"] == 1


def test_a_run_dir_with_ranks_never_says_it_has_none():
    w = World()
    w.put("/run/a.slot", slot("/run/a.slot"))
    t, log = tracker(w, proc())
    for i in range(0, 200, 10):
        t.poll(T0 + i * S, W0 + i * S)
    assert not log.named("no rank slots found")


def test_a_burst_of_collective_records_does_not_push_out_unreported_steps(tmp_path):
    """FSDP-like: 600 Flight Recorder signatures between two agent polls, more than
    twice the step ring. The steps written before them still reach the report, the
    signatures too (the newest, capped), and neither is reported twice."""
    from watchdog.agent.reporting.build import build_report, marks

    run = str(tmp_path)
    wr = testing.RankSlot(run, testing.identity("j", 0, 2))
    now = wr.words[wire.H_HEARTBEAT_NS]
    for _ in range(3):
        wr.step(S // 10, S // 100, S // 50, now_ns=now)
    shape = wire.pack_shape((4,))
    for seq in range(1, 601):
        wr.event(wire.RecordKind.COLL_SIG, now, 3, 0, seq, int(wire.CollOp.ALL_REDUCE), 4, 1, 1, shape, now, 0, 0, 1, 1)
    t = SlotTracker(run, log=Log())
    t.poll(now + S // 10, time.time_ns())
    (v,) = t.views()
    (r,) = build_report("j", "h", "a", 1, [v], now + S // 10, time.time(), 1.0).ranks
    delivered = marks([v])
    assert [x.step for x in r.recent_steps] == [1, 2, 3]
    assert [c.seq for c in r.recent_colls] == list(range(601 - wire_report.MAX_COLLS_PER_RANK, 601))
    wr.step(S // 10, now_ns=now + S)
    wr.event(wire.RecordKind.COLL_SIG, now, 4, 0, 601, int(wire.CollOp.ALL_REDUCE), 4, 1, 1, shape, now, 0, 0, 1, 1)
    t.poll(now + 2 * S, time.time_ns())
    (v,) = t.views()
    (r,) = build_report("j", "h", "a", 2, [v], now + 2 * S, time.time(), 1.0, since=delivered).ranks
    assert [x.step for x in r.recent_steps] == [4] and [c.seq for c in r.recent_colls] == [601]
    wr.close()


def test_gpu_completions_in_the_slot_become_the_reports_gpu_split_and_hostile_ones_a_counter(tmp_path):
    from watchdog.agent.reporting.build import build_report
    from watchdog.agent.slotfiles.gpusteps import COLLECTIVE, STEP

    gpu, ms = int(wire.Clock.GPU_EVENT), 1_000_000
    wr = testing.RankSlot(str(tmp_path), testing.identity("j", 0, 2))
    t0 = wr.words[wire.H_HEARTBEAT_NS]
    wr.step(10 * ms, 2 * ms, ms // 20, now_ns=t0)
    wr.event(wire.RecordKind.COMPLETION, t0, 1, STEP, 0, 1, t0, t0 + 5 * ms, gpu, 0)
    wr.step(10 * ms, 2 * ms, ms // 20, now_ns=t0 + 10 * ms)
    wr.event(wire.RecordKind.COMPLETION, t0, 1, COLLECTIVE, 0, 1, t0 + 9 * ms, t0 + 145 * ms, gpu, t0 + 105 * ms)
    wr.event(
        wire.RecordKind.COMPLETION, t0, 1, COLLECTIVE, 0, 2, t0, t0 + ms, gpu, t0 + 9 * ms
    )  # ends before it starts
    wr.event(wire.RecordKind.COMPLETION, t0, 2, STEP, 0, 2, t0 + 10 * ms, t0 + 146 * ms, gpu, 0)
    t = SlotTracker(str(tmp_path), log=Log())
    t.poll(t0 + 200 * ms, time.time_ns())
    (v,) = t.views()
    (r,) = build_report("j", "h", "a", 1, [v], t0 + 200 * ms, time.time(), 1.0).ranks
    (g,) = r.recent_gpu
    assert r.gpu_clock == "gpu" and g.step == 2
    assert (g.step_s, g.coll_s, g.data_s) == pytest.approx((0.141, 0.040, 0.002))
    assert t.read_errors["record"] == 1
    wr.close()


def test_an_older_hooks_version_1_slot_is_still_tracked_and_reported(tmp_path):
    """One ring for every kind, no event ring: steps and Flight Recorder
    signatures still reach the report, each once."""
    from watchdog.agent.reporting.build import build_report, marks

    wr = testing.RankSlot(str(tmp_path), testing.identity("j", 0, 2), name="new.slot")
    now = wr.words[wire.H_HEARTBEAT_NS]
    wr.step(S // 10, now_ns=now)
    shape = wire.pack_shape((4,))
    wr.record(wire.RecordKind.COLL_SIG, now, 1, 0, 1, int(wire.CollOp.ALL_REDUCE), 4, 1, 1, shape, now, 0, 0, 1, 1)
    raw = bytearray(open(wr.path, "rb").read()[: wire.event_ring_offset(wire.DEFAULT_RING_CAPACITY)])
    wr.close()
    os.unlink(wr.path)
    for word, value in ((wire.H_VERSION, 1), (wire.H_EVENT_RING_OFFSET, 0), (wire.H_EVENT_RING_CAPACITY, 0)):
        raw[word * 8 : word * 8 + 8] = value.to_bytes(8, "little")
    (tmp_path / "old.slot").write_bytes(bytes(raw))
    t = SlotTracker(str(tmp_path), log=Log())
    t.poll(now + S // 10, time.time_ns())
    (v,) = t.views()
    assert v.header.version == 1 and t.read_errors == dict.fromkeys(t.read_errors, 0)
    (r,) = build_report("j", "h", "a", 1, [v], now + S // 10, time.time(), 1.0).ranks
    assert [x.step for x in r.recent_steps] == [1] and [c.seq for c in r.recent_colls] == [1]
    assert marks([v]) == {v.path: 2}  # one ring, one numbering
    (r,) = build_report("j", "h", "a", 2, [v], now + S // 10, time.time(), 1.0, since=marks([v])).ranks
    assert r.recent_steps == () and r.recent_colls == ()


class ExitStatusTable(ProcessTable):
    """The process table, with the wait status the deathwatch would have read from the zombie."""

    def __init__(self, procs, statuses):
        super().__init__(procs)
        self.statuses = statuses

    def exit_status(self, pid, start_us):
        return self.statuses.get(pid)


@pytest.mark.parametrize(
    "wait,state", [(1 << 8, slot_states.DEAD), (0, slot_states.EXITED), (None, slot_states.EXITED)]
)
def test_a_clean_looking_exit_with_a_nonzero_status_is_a_death_reported_before_its_successor(wait, state):
    # raise SystemExit(1) after the hook's atexit said "exited": the exit status decides
    w = World()
    p = proc(100)
    w.put("/run/a.slot", slot("/run/a.slot"))
    log = Log()
    t = SlotTracker(
        "/run",
        procs=ExitStatusTable(FakeProcesses(p, proc(200)), {100: wait}),
        read=w.read,
        lister=w.lister,
        log=log,
    )
    t.poll(T0, W0)
    w.put("/run/a.slot", slot("/run/a.slot", status=wire.Status.EXITED))
    p.running = False
    t.poll(T0 + S, W0 + S)
    (v,) = t.views()
    assert v.state == state
    rep = agent_report.build_report("j", "h", "a", 1, [v], T0 + S, (W0 + S) / 1e9, 1.0).ranks[0]
    assert rep.status == ("failed" if state == slot_states.DEAD else "exited")
    if state == slot_states.DEAD:
        assert v.death["exit_code"] == 1 and v.death["summary"].startswith("exit 1 (a SystemExit"), v.death
    # torchrun restarts the rank before the next report: the death stays to be told
    w.put("/run/b.slot", slot("/run/b.slot", pid=200, hb=T0 + 2 * S, created_wall=W0 + 2 * S))
    t.poll(T0 + 2 * S, W0 + 2 * S)
    assert [d.path for d in t.replaced_deaths()] == (["/run/a.slot"] if state == slot_states.DEAD else [])


def _owned(snap, uid):
    return dataclasses.replace(snap, uid=uid)


def test_another_users_slot_cannot_take_a_rank_of_a_job_with_a_live_rank():
    """The takeover: another user's file for rank 0 of root's job, naming a dead pid
    and a creation time a day ahead. Refused and counted, the real rank 0 stays."""
    w = World()
    w.put("/run/real0.slot", _owned(slot("/run/real0.slot", rank=0, pid=100), 0))
    w.put("/run/real1.slot", _owned(slot("/run/real1.slot", rank=1, pid=101), 0))
    t, log = tracker(w, proc(100), proc(101), owner=lambda pid: frozenset({0}))
    t.poll(T0, W0)
    forged = slot("/run/forged.slot", rank=0, pid=555, hb=T0 + S, created_wall=W0 + 86_400 * S)
    w.put("/run/forged.slot", _owned(forged, 65534))
    for i in range(1, 4):
        t.poll(T0 + i * S, W0 + i * S)
    assert [(v.identity.rank, v.path, v.state) for v in t.views()] == [
        (0, "/run/real0.slot", slot_states.ALIVE),
        (1, "/run/real1.slot", slot_states.ALIVE),
    ]
    assert t.read_errors["job_owner"] == 1  # once per file, not per poll
    (refused,) = log.named("slot refused")
    assert refused["reason"] == "job_owner" and refused["file_uid"] == 65534 and refused["job_uid"] == 0
    assert not any(v.path == "/run/forged.slot" for v in t.incarnations("j"))


def test_a_dead_slot_taken_before_the_job_had_an_owner_goes_when_its_live_rank_comes():
    w = World()
    w.put("/run/planted.slot", _owned(slot("/run/planted.slot", rank=0, pid=555, created_wall=W0 + 86_400 * S), 65534))
    t, _ = tracker(w, proc(100), owner=lambda pid: frozenset({0}))
    t.poll(T0, W0)
    assert [v.path for v in t.views()] == ["/run/planted.slot"]  # dead, unowned job: reported, never acted on
    w.put("/run/real0.slot", _owned(slot("/run/real0.slot", rank=0, pid=100, hb=T0 + S), 0))
    t.poll(T0 + S, W0 + S)
    assert [(v.path, v.state) for v in t.views()] == [("/run/real0.slot", slot_states.ALIVE)]
    assert t.read_errors["job_owner"] == 1
    assert [v.path for v in t.incarnations("j")] == ["/run/real0.slot"]


def test_a_slot_never_seen_alive_cannot_supersede_a_live_rank_of_the_same_user():
    w = World()
    w.put("/run/real0.slot", _owned(slot("/run/real0.slot", rank=0, pid=100), 1000))
    t, _ = tracker(w, proc(100), owner=lambda pid: frozenset({1000}))
    t.poll(T0, W0)
    w.put(
        "/run/late.slot", _owned(slot("/run/late.slot", rank=0, pid=555, hb=T0 + S, created_wall=W0 + 86_400 * S), 1000)
    )
    t.poll(T0 + S, W0 + S)
    (v,) = t.views()
    assert v.path == "/run/real0.slot" and v.state == slot_states.ALIVE
