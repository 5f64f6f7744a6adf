"""Anyone who can create a file in the run dir, against the agent (issue #14,
"local files"): forged identities, FIFOs, symlinks, swapped files, run dirs
created first by another user. Each test was run against the code before the
fix and failed there. The tests run as root in CI (chown to a made-up uid plays
"another user"); where they cannot, they skip."""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import cast

import psutil
import pytest

from watchdog import rundir
from watchdog.agent import testing as atesting
from watchdog.agent.command_channel import handlers as act
from watchdog.agent.command_channel.stacks import StackDumper
from watchdog.agent.slotfiles.tracker import SlotTracker
from watchdog.contracts import commands as c
from watchdog.contracts import slot as wire
from watchdog.contracts.evidence import StackDump
from watchdog.hook import testing
from watchdog.hook.slot import slotfile

S = 1_000_000_000
OTHER_UID = 4242  # "another user" on this host
NO_DUMPER = cast(StackDumper, None)  # these commands never dump stacks
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make files owned by another user")


class Log:
    def __init__(self):
        self.events = []

    def __getattr__(self, level):
        return lambda event, **kw: self.events.append((level, event, kw))

    def named(self, event):
        return [kw for _, e, kw in self.events if e == event]


@pytest.fixture
def sleeper():
    procs = []

    def start():
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait(10)


def ident_of(pid, rank=0, job="job"):
    return wire.Identity(
        job=job,
        host="h",
        rank=rank,
        local_rank=rank,
        world_size=4,
        pid=pid,
        proc_start_us=int(psutil.Process(pid).create_time() * 1e6),
    )


def poll(t):
    now = time.monotonic_ns()
    t.poll(now, time.time_ns())


def poll_within(t, seconds=10.0):
    """Poll on a thread; True if it returned (a FIFO opened without O_NONBLOCK
    blocks it for good)."""
    th = threading.Thread(target=poll, args=(t,), daemon=True)
    th.start()
    th.join(seconds)
    return not th.is_alive()


# -- FIFOs ---------------------------------------------------------------------------


def test_a_fifo_named_slot_never_blocks_the_poll(tmp_path, sleeper):
    fifo = tmp_path / "evil.rank0.pid1.slot"
    os.mkfifo(fifo)
    p = sleeper()
    good = testing.RankSlot(str(tmp_path), ident_of(p.pid, rank=1))
    log = Log()
    t = SlotTracker(str(tmp_path), log=log)
    try:
        assert poll_within(t), "the poll blocked on the FIFO"
        assert [v.identity.rank for v in t.views()] == [1]  # the real rank is still watched
        assert t.read_errors["type"] == 1 and log.named("slot rejected")[0]["reason"] == "type"
        assert poll_within(t) and t.read_errors["type"] == 1  # once per episode
    finally:
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # releases a reader stuck before the fix
        os.close(fd)
        good.close()


def test_read_slot_refuses_anything_but_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "f.slot")
    with pytest.raises(wire.NotRegular):
        wire.read_slot(str(tmp_path / "f.slot"))
    os.mkdir(tmp_path / "d.slot")
    with pytest.raises(wire.NotRegular):
        wire.read_slot(str(tmp_path / "d.slot"))


# -- symlinks and swaps ------------------------------------------------------------------


def test_a_symlinked_slot_is_not_followed(tmp_path, sleeper):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    p = sleeper()
    real = testing.RankSlot(str(elsewhere), ident_of(p.pid))
    os.symlink(real.path, run / "link.rank0.slot")
    log = Log()
    t = SlotTracker(str(run), log=log)
    poll(t)
    assert t.views() == () and t.read_errors["link"] == 1
    with pytest.raises(wire.SymlinkSlot):
        wire.read_slot(str(run / "link.rank0.slot"))
    real.close()


def test_checkpoint_words_go_only_to_the_file_that_was_validated(tmp_path, sleeper):
    """The agent used to read the path, then reopen it to write: a link swapped in
    between made it write 24 bytes into any file it could open."""
    p = sleeper()
    wr = testing.RankSlot(str(tmp_path), ident_of(p.pid))
    victim = tmp_path / "victim.bin"
    # A victim the old code would happily write into: another slot-shaped file.
    victim.write_bytes(Path(wr.path).read_bytes())
    before = victim.read_bytes()
    t = SlotTracker(str(tmp_path))
    poll(t)
    (view,) = t.views()
    ident = view.identity
    # After the agent validated the slot, the path becomes a link to the victim.
    os.replace(wr.path, str(tmp_path / "moved.bin"))
    os.symlink(str(victim), wr.path)
    a = act.Actions("h", lambda job: (view,), NO_DUMPER)
    cmd = c.make(
        job="job",
        type=c.CHECKPOINT,
        host="h",
        issued_wall=time.time(),
        ttl_s=30,
        args={"step": 9, "ranks": [c.target(ident.rank, ident.pid, ident.proc_start_us)]},
    )
    out, _ = a.run(cmd)
    assert victim.read_bytes() == before, "the control words were written through the swapped link"
    assert not out["ok"] and out["ranks"] == []
    wr.close()


def test_a_replaced_slot_file_is_not_written(tmp_path, sleeper):
    p = sleeper()
    wr = testing.RankSlot(str(tmp_path), ident_of(p.pid))
    t = SlotTracker(str(tmp_path))
    poll(t)
    (view,) = t.views()
    # Replaced by a regular file with the same identity (a copy): another inode.
    data = Path(wr.path).read_bytes()
    os.unlink(wr.path)
    with open(wr.path, "wb") as fh:
        fh.write(data)
    expect = wire.SlotSnapshot(view.path, view.header, (), uid=view.uid, inode=view.inode)
    with pytest.raises(wire.ForeignSlot):
        wire.write_control(view.path, None, wire.Command.CHECKPOINT_AT_STEP, 3, expect=expect)
    assert Path(wr.path).read_bytes() == data
    wr.close()


# -- forged identities ---------------------------------------------------------------


@root_only
def test_a_slot_not_owned_by_the_process_user_is_refused(tmp_path, sleeper):
    """pid and start time are public in /proc: a forged slot claimed a process of
    another user, and the agent would dump and (abort policy) signal it."""
    p = sleeper()  # runs as root; the forger is OTHER_UID
    forged = testing.RankSlot(str(tmp_path), ident_of(p.pid))
    os.chown(forged.path, OTHER_UID, OTHER_UID)
    log = Log()
    t = SlotTracker(str(tmp_path), log=log)
    poll(t)
    poll(t)
    assert t.views() == () and t.read_errors["owner"] == 1
    (ev,) = log.named("slot refused")
    assert ev["file_uid"] == OTHER_UID and ev["pid"] == p.pid
    trusting = SlotTracker(str(tmp_path), trusted_uids=frozenset({OTHER_UID}))
    poll(trusting)
    assert [v.identity.pid for v in trusting.views()] == [p.pid]  # --slots.trusted-uids
    forged.close()


@root_only
def test_a_forged_slot_cannot_move_the_start_time_a_rank_is_checked_against(tmp_path, sleeper):
    """A slot's start ticks let the agent know a rank across a step of the clock, and a
    believed slot's start becomes the one its process is checked against. A forged slot
    with the process's ticks and another start must not: it would make every command for
    the real rank fail its identity check (an action against the job refused)."""
    from watchdog import procstart

    p = sleeper()
    real = ident_of(p.pid)
    forged = testing.RankSlot(
        str(tmp_path), dataclasses.replace(real, proc_start_us=real.proc_start_us + 5_000_000,
        proc_start_ticks=procstart.start_ticks(p.pid) or 0),
    )  # fmt: skip
    os.chown(forged.path, OTHER_UID, OTHER_UID)
    t = SlotTracker(str(tmp_path), log=Log())
    poll(t)
    assert t.views() == () and t.read_errors["owner"] == 1
    start = act.process_start_us(p.pid)
    assert start is not None and abs(start - real.proc_start_us) <= 20_000  # unmoved
    forged.close()


@root_only
def test_a_forged_slot_cannot_get_its_process_dumped_or_signalled(tmp_path, sleeper):
    p = sleeper()
    forged = testing.RankSlot(str(tmp_path), ident_of(p.pid))
    os.chown(forged.path, OTHER_UID, OTHER_UID)
    t = SlotTracker(str(tmp_path))
    poll(t)
    sent, dumped = [], []

    def send(pid, signum, check):
        sent.append(pid)
        return True, ""

    class Dumper(StackDumper):  # dumps recorded, py-spy never run
        def __init__(self):
            pass

        def dump(self, host, rank, pid, timeout_s=None):
            dumped.append(pid)
            return StackDump(host=host, rank=rank, pid=pid, ok=True, text="x")

    a = act.Actions("h", t.incarnations, Dumper(), send_signal=send)
    ident = ident_of(p.pid)
    tgt = c.target(0, p.pid, ident.proc_start_us)
    a.run(
        c.make(
            job="job",
            type=c.SIGNAL,
            host="h",
            target=tgt,
            args={"signal": "SIGTERM"},
            issued_wall=time.time(),
            ttl_s=30,
        )
    )
    a.run(c.make(job="job", type=c.DUMP_STACKS, host="h", args={"ranks": [tgt]}, issued_wall=time.time(), ttl_s=30))
    assert sent == [] and dumped == []
    assert p.poll() is None
    forged.close()


# -- signals: never pid 1, only the launcher recorded at registration ----------------


def _signal_actions(view, starts):
    sent = []

    def send(pid, signum, check):  # records instead of signalling: nothing real is ever hit
        ok, why = check()
        if ok:
            sent.append(pid)
        return ok, why

    return act.Actions("h", lambda job: (view,), NO_DUMPER, start_us=starts.get, send_signal=send), sent


def _start_us(pid):
    return int(psutil.Process(pid).create_time() * 1e6)


@pytest.fixture
def orphan():
    """A real orphaned process: its parent exited, so the kernel made init (or a
    subreaper) its parent -- what an orphaned rank looks like."""
    out = subprocess.run(
        ["sh", "-c", "sleep 120 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True, timeout=30
    )
    pid = int(out.stdout.strip())
    yield pid
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def test_an_orphaned_ranks_parent_is_never_signalled(orphan):
    from watchdog.agent.processes.table import ProcSample
    from watchdog.agent.slotfiles import slot_states
    from watchdog.agent.slotfiles.local_rank import LocalRank

    parent = psutil.Process(orphan).ppid()  # 1, or the container's init / a subreaper
    ident = atesting.identity("job", 0, 2, pid=orphan, proc_start_us=_start_us(orphan))
    snap = atesting.snapshot(ident)
    # Its launcher died before it registered: no launcher was recorded.
    view = LocalRank("", snap.header, 0, False, ProcSample(True, "sleeping"), slot_states.ALIVE, 0.0, ())
    a, sent = _signal_actions(view, {orphan: ident.proc_start_us, parent: _start_us(parent)})
    out, refusals = a.run(
        c.make(
            job="job",
            type=c.SIGNAL,
            host="h",
            target=c.target(-1, parent, _start_us(parent)),
            args={"signal": "SIGTERM"},
            issued_wall=time.time(),
            ttl_s=30,
        )
    )
    assert not out["ok"] and refusals == [c.UNKNOWN_TARGET] and sent == []
    # pid 1 itself, named outright, is never a target either.
    a, sent = _signal_actions(view, {orphan: ident.proc_start_us, 1: _start_us(1)})
    out, _ = a.run(
        c.make(
            job="job",
            type=c.SIGNAL,
            host="h",
            target=c.target(-1, 1, _start_us(1)),
            args={"signal": "SIGKILL"},
            issued_wall=time.time(),
            ttl_s=30,
        )
    )
    assert not out["ok"] and sent == []


def test_a_parent_not_recorded_at_registration_is_not_signalled(sleeper):
    """The launcher must be the one recorded (and verified) when the rank
    registered, not whatever the rank's parent is when the command comes (here:
    the test process itself)."""
    from watchdog.agent.processes.table import ProcSample
    from watchdog.agent.slotfiles import slot_states
    from watchdog.agent.slotfiles.local_rank import LocalRank

    p = sleeper()
    ident = atesting.identity("job", 0, 2, pid=p.pid, proc_start_us=_start_us(p.pid))
    snap = atesting.snapshot(ident)
    recorded = LocalRank("", snap.header, 0, False, ProcSample(True, "running"), slot_states.ALIVE, 0.0, (), (4000, 5))
    me = os.getpid()
    a, sent = _signal_actions(recorded, {p.pid: ident.proc_start_us, 4000: 5, me: _start_us(me)})
    out, _ = a.run(
        c.make(
            job="job",
            type=c.SIGNAL,
            host="h",
            target=c.target(-1, me, _start_us(me)),
            args={"signal": "SIGTERM"},
            issued_wall=time.time(),
            ttl_s=30,
        )
    )
    assert not out["ok"] and sent == []
    out, _ = a.run(
        c.make(
            job="job",
            type=c.SIGNAL,
            host="h",
            target=c.target(-1, 4000, 5),
            args={"signal": "SIGTERM"},
            issued_wall=time.time(),
            ttl_s=30,
        )
    )
    assert out["ok"] and sent == [4000]


# -- py-spy through the pidfd identity check ------------------------------------------


def test_a_dump_of_a_process_that_exited_meanwhile_is_discarded(sleeper):
    """Between the identity check and py-spy attaching, the rank can die and its pid
    go to another process: the dump would be of that one. Pinned by pidfd, an exit
    during the dump discards the result."""
    from watchdog.agent.processes.table import ProcSample
    from watchdog.agent.slotfiles import slot_states
    from watchdog.agent.slotfiles.local_rank import LocalRank

    p = sleeper()
    ident = ident_of(p.pid)
    snap = atesting.snapshot(ident)
    view = LocalRank("", snap.header, 0, False, ProcSample(True, "sleeping"), slot_states.ALIVE, 0.0, ())

    class DyingDumper(StackDumper):  # the rank dies while py-spy runs
        def __init__(self):
            pass

        def dump(self, host, rank, pid, timeout_s=None):
            p.kill()
            p.wait(10)
            return StackDump(host=host, rank=rank, pid=pid, ok=True, text="Thread 1 (someone else's)\n")

    a = act.Actions("h", lambda job: (view,), DyingDumper())
    out, _ = a.run(
        c.make(
            job="job",
            type=c.DUMP_STACKS,
            host="h",
            issued_wall=time.time(),
            ttl_s=30,
            args={"ranks": [c.target(0, p.pid, ident.proc_start_us)]},
        )
    )
    (dump,) = out["stacks"]
    assert not dump["ok"] and "exited during the dump" in dump["error"] and dump["text"] == ""


# -- run dirs created first by someone else ---------------------------------------------


@root_only
def test_the_hook_refuses_a_run_dir_another_user_created_first(tmp_path):
    run = tmp_path / "rank-watchdog-0"
    run.mkdir(mode=0o777)
    os.chown(run, OTHER_UID, OTHER_UID)
    m = slotfile.open_slot(str(run), "j.rank0.pid1.slot", wire.slot_size(8))
    assert m.path is None and isinstance(m.error, PermissionError) and "owned by uid 4242" in str(m.error)
    assert os.listdir(run) == []  # nothing planted for the attacker to read or swap
    m.mm.close()


def test_the_hook_refuses_a_world_writable_run_dir_without_the_sticky_bit(tmp_path):
    run = tmp_path / "open"
    run.mkdir()
    os.chmod(run, 0o777)
    m = slotfile.open_slot(str(run), "j.rank0.pid1.slot", wire.slot_size(8))
    assert m.path is None and "sticky" in str(m.error)
    m.mm.close()
    os.chmod(run, 0o1777)  # like /tmp: fine
    m = slotfile.open_slot(str(run), "j.rank0.pid1.slot", wire.slot_size(8))
    assert m.path is not None and m.error is None
    m.mm.close()


def test_the_shared_system_run_dir_shape_is_accepted(tmp_path):
    """/run/rank-watchdog: root-owned, group rank-watchdog, 3770 (sticky, setgid)."""
    run = tmp_path / "system"
    run.mkdir()
    os.chmod(run, 0o3770)
    st = os.stat(run)
    assert rundir.insecure(str(run), trusted=frozenset({st.st_uid})) == ""
    assert "owned by uid" in rundir.insecure(str(run), trusted=frozenset({st.st_uid + 1}))


def test_a_symlink_owned_by_someone_else_is_refused():
    def lstat(path):
        return os.stat_result((stat.S_IFLNK | 0o777, 0, 0, 1, OTHER_UID, OTHER_UID, 0, 0, 0, 0))

    assert "symbolic link owned by uid 4242" in rundir.insecure("/tmp/x", trusted=frozenset({0}), lstat=lstat)


@root_only
def test_the_agent_does_not_read_a_run_dir_another_user_controls(tmp_path, sleeper):
    run = tmp_path / "rank-watchdog-job"
    run.mkdir()
    p = sleeper()
    wr = testing.RankSlot(str(run), ident_of(p.pid))
    os.chown(run, OTHER_UID, OTHER_UID)
    log = Log()
    t = SlotTracker(str(run), log=log)
    poll(t)
    assert t.views() == () and "owned by uid 4242" in log.named("run dir refused")[0]["reason"]
    os.chown(run, 0, 0)  # fixed by an admin: read from the next poll
    poll(t)
    assert len(t.views()) == 1 and log.named("run dir accepted")
    wr.close()


def test_slurm_batch_checks_its_run_dir_before_the_agent_reads_it():

    text = (Path(__file__).parents[1] / "deploy" / "slurm" / "train.sbatch").read_text()
    assert 'mkdir -p -m 0700 "$WATCHDOG_RUN_DIR"' in text and '[ -O "$WATCHDOG_RUN_DIR" ]' in text
