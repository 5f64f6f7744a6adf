"""What a verified command does on this host. Runs on the agent's command worker
thread, never on the poll loop. Each ``run`` returns the ack for the coordinator
and the refusals found at execution time (identity checks need the live process,
so they happen here, right before acting).

Targets are checked against the slots this agent tracks: a command can only touch
a process that wrote a slot for the job (its file owned by that process's user,
checked when it registered: agent/slotfiles/tracker.py) or, for ``signal``, the launcher
recorded and verified when such a rank registered -- never an arbitrary pid on
the host, never pid 1 (an orphaned rank's parent), whoever holds the token.
Dumps pin the process with a pidfd before the identity check (``pidpin``), as
signals do, and a dump of a process that exited meanwhile is discarded.

A rank target carries the pid the rank recorded, in its own pid namespace; what
is read, dumped or signalled here is that process's pid in the agent's namespace
(``LocalRank.pid_here``). A launcher target is already the agent's own pid.
"""

from __future__ import annotations

import functools
import json
import os
import signal as _signal
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from watchdog import sharedfile
from watchdog.agent.command_channel import dumpall, flight_recorder_dump
from watchdog.agent.command_channel.stacks import StackDumper
from watchdog.agent.processes import steadystart
from watchdog.agent.processes.pidpin import Pin
from watchdog.agent.processes.table import START_TOLERANCE_US
from watchdog.agent.slotfiles.local_rank import LocalRank
from watchdog.contracts import commands as c
from watchdog.contracts import slot as wire
from watchdog.contracts.evidence import SlotEvidence, StackDump

MAX_SLOT_RECORDS = 1024  # newest kept; ~170 B each as JSON
MAX_ACK_BYTES = 1536 << 10  # well below the coordinator's 4 MiB report limit


def process_start_us(pid: int) -> int | None:
    """None when there is no such process (or it cannot be read: identity unprovable)."""
    return steadystart.start_us(pid)  # /proc/<pid>/stat as psutil reads it, but not moved by a clock step


def _pidfd_signal(pid: int, signum: int, check: Callable[[], tuple[bool, str]]) -> tuple[bool, str]:
    """Pin the process with a pidfd, *then* check its identity, then signal through
    the pidfd: a pid reused after the check cannot receive the signal."""
    fd = None
    if hasattr(os, "pidfd_open") and hasattr(_signal, "pidfd_send_signal"):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False, f"pid {pid} is gone"
        except OSError:
            fd = None  # ENOSYS / EPERM in a sandbox: os.kill right after the check
    try:
        ok, why = check()
        if not ok:
            return False, why
        if fd is not None:
            _signal.pidfd_send_signal(fd, signum)
        else:
            os.kill(pid, signum)
        return True, ""
    except ProcessLookupError:
        return False, f"pid {pid} is gone"
    except PermissionError as exc:
        return False, f"not permitted to signal pid {pid}: {exc.strerror}"
    finally:
        if fd is not None:
            os.close(fd)


def _request_fr_dump(path: str, expect: wire.SlotSnapshot | None) -> int:
    return wire.write_control(path, None, wire.Command.DUMP_FLIGHT_RECORDER, 0, expect=expect)


class Actions:
    def __init__(
        self,
        host: str,
        incarnations: Callable[[str], tuple[LocalRank, ...]],
        dumper: StackDumper,
        *,
        read: Callable[[str, int], wire.SlotSnapshot] = wire.read_slot,
        start_us: Callable[[int], int | None] = process_start_us,
        send_signal: Callable[[int, int, Callable[[], tuple[bool, str]]], tuple[bool, str]] = _pidfd_signal,
        wall: Callable[[], float] = time.time,
        mono_ns: Callable[[], int] = time.monotonic_ns,
        tolerance_us: int = START_TOLERANCE_US,
        max_records: int = MAX_SLOT_RECORDS,
        max_ack_bytes: int = MAX_ACK_BYTES,
        dump_parallel: int = dumpall.PARALLEL,
        dump_deadline_s: float = dumpall.HOST_DEADLINE_S,
        pin: Callable[[int], Pin] = Pin,
        run_dir: str = "",
    ) -> None:
        self.host = host
        self._incarnations, self._dumper, self._read = incarnations, dumper, read
        self._start_us, self._send_signal = start_us, send_signal
        self._wall, self._mono_ns = wall, mono_ns
        self._tol, self._max_records, self._max_ack_bytes = tolerance_us, max_records, max_ack_bytes
        self._dump_parallel, self._dump_deadline_s = dump_parallel, dump_deadline_s
        self._pin = pin
        self.run_dir = run_dir

    def run(self, cmd: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        kind = cmd["type"]
        if kind == c.DUMP_STACKS:
            return self.dump_stacks(cmd)
        if kind == c.SNAPSHOT_SLOTS:
            return self.snapshot_slots(cmd), []
        if kind == c.SIGNAL:
            return self.signal(cmd)
        if kind == c.CHECKPOINT:
            return self.checkpoint(cmd)
        if kind == c.ROLLBACK:
            return self.rollback(cmd), []
        if kind == c.DUMP_FLIGHT_RECORDER:
            return self.dump_flight_recorder(cmd)
        return ack(cmd, False, f"unknown type {kind!r}"), []  # verify() lets none through

    # -- evidence --------------------------------------------------------------

    def _slot(self, job: str, t: dict[str, int]) -> LocalRank | None:
        """The slot of the target's incarnation; pid 0: the rank's current slot."""
        mine = [v for v in self._incarnations(job) if v.identity.rank == t["rank"]]
        if t["pid"] == 0:
            return max(mine, key=lambda v: (v.speaks, v.header.created_wall_ns), default=None)
        return next(
            (
                v
                for v in mine
                if v.identity.pid == t["pid"] and abs(v.identity.proc_start_us - t["proc_start_us"]) <= self._tol
            ),
            None,
        )

    def dump_stacks(self, cmd: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Every target at once (``dumpall``: at most ``dump_parallel`` py-spy at a
        time, the whole command within ``dump_deadline_s``); identity is checked
        right before each dump, on the dump's own thread."""
        targets = cmd["args"]["ranks"]
        refusals: list[str] = []

        def job(t: dict[str, int]) -> Callable[[float], StackDump]:
            def run(left_s: float) -> StackDump:
                return self._dump_one(cmd["job"], t, left_s, refusals)

            return run

        def late(i: int, why: str) -> StackDump:
            return self._no_stack(targets[i], why)

        done = dumpall.run(
            [job(t) for t in targets], late, parallel=self._dump_parallel, deadline_s=self._dump_deadline_s
        )
        stacks = done.results
        errors = [f"rank {s.rank}: {s.error}" for s in stacks if not s.ok]
        out = ack(cmd, any(s.ok for s in stacks), "; ".join(errors), stacks=[s.to_dict() for s in stacks])
        # Added to the ack (and journaled with the evidence): the bound this host
        # worked under, and which ranks it could not dump within it.
        out["bound"] = {
            "parallel": self._dump_parallel,
            "deadline_s": self._dump_deadline_s,
            "duration_s": done.duration_s,
            "late": [targets[i]["rank"] for i in done.late],
        }
        return out, sorted(refusals)

    def _dump_one(self, job: str, t: dict[str, int], left_s: float, refusals: list[str]) -> StackDump:
        view = self._slot(job, t) if t["pid"] else None
        if view is None:
            refusals.append(c.UNKNOWN_TARGET)
            return self._no_stack(
                t,
                f"refused ({c.UNKNOWN_TARGET}): rank {t['rank']} pid {t['pid']} has no slot of job {job} on this host",
            )
        pid = view.pid_here
        if pid <= 1:
            refusals.append(c.UNKNOWN_TARGET)
            return self._no_stack(t, f"refused ({c.UNKNOWN_TARGET}): pid {pid} is never a rank")
        with self._pin(pid) as pin:  # before the identity check: a match then proves the pin is the rank
            start = None if pin.gone else self._start_us(pid)
            if start is None:  # not a refusal: a rank can die between the finding and the dump
                return self._no_stack(t, "process gone: no stack to take")
            ok, why = c.identity_ok(t, start, self._tol)
            if not ok:
                refusals.append(c.WRONG_IDENTITY)
                return self._no_stack(t, f"refused ({c.WRONG_IDENTITY}): {why}")
            dump = self._dumper.dump(self.host, t["rank"], pid, timeout_s=left_s)
            after = None if pin.pinned else self._start_us(pid)
            if pin.exited() or (not pin.pinned and (after is None or abs(after - start) > self._tol)):
                return self._no_stack(
                    t,
                    "process exited during the dump: its pid may belong to another process "
                    "now, so the stack is discarded",
                )
        # The evidence names the rank's process as the rank recorded it (its namespace).
        return replace(dump, pid=t["pid"]) if dump.pid != t["pid"] else dump

    def _no_stack(self, t: dict[str, int], error: str) -> StackDump:
        return StackDump(
            host=self.host, rank=t["rank"], pid=t["pid"], ok=False, text="", error=error, taken_wall=self._wall()
        )

    def snapshot_slots(self, cmd: dict[str, Any]) -> dict[str, Any]:
        slots, errors = [], []
        for t in cmd["args"]["ranks"]:
            view = self._slot(cmd["job"], t)
            if view is None:
                errors.append(f"rank {t['rank']}: no slot of job {cmd['job']} for pid {t['pid']} on this host")
                continue
            try:
                snap = self._read(view.path, 0)  # the whole ring; works on a dead rank's file too
            except (wire.SlotError, OSError) as exc:
                errors.append(f"rank {t['rank']}: cannot read {view.path}: {exc}")
                continue
            ev = SlotEvidence.from_snapshot(snap, self.host, self._wall(), self._mono_ns())
            slots.append(trim(ev, self._max_records))
        slots = fit(slots, self._max_ack_bytes)
        return ack(cmd, bool(slots), "; ".join(errors), slots=[s.to_dict() for s in slots])

    def dump_flight_recorder(self, cmd: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Ask each target's hook for its Flight Recorder through the slot, then
        collect the files (``flight_recorder_dump``). Identity is checked as for a checkpoint."""
        asks: list[tuple[int, int, str, Callable[[], int]]] = []
        errors: list[str] = []
        refusals: list[str] = []
        for t in cmd["args"]["ranks"]:
            view = self._slot(cmd["job"], t) if t["pid"] else None
            if view is None:
                refusals.append(c.UNKNOWN_TARGET)
                errors.append(
                    f"rank {t['rank']}: refused ({c.UNKNOWN_TARGET}): no slot of job {cmd['job']} for pid {t['pid']}"
                )
                continue
            ok, why = c.identity_ok(t, self._start_us(view.pid_here), self._tol)
            if not ok:
                errors.append(f"rank {t['rank']}: {why}")
                continue
            expect = (
                wire.SlotSnapshot(view.path, view.header, (), uid=view.uid, inode=view.inode) if view.inode else None
            )

            asks.append((t["rank"], t["pid"], view.path, functools.partial(_request_fr_dump, view.path, expect)))
        dumps = flight_recorder_dump.collect(asks, self.host, ack_of=self._ack_of, wall=self._wall)
        dumps = flight_recorder_dump.fit(dumps, self._max_ack_bytes)
        errors += [f"rank {d.rank}: {d.error}" for d in dumps if not d.ok]
        out = ack(cmd, any(d.ok for d in dumps), "; ".join(errors))
        out["flight_recorder"] = [d.to_dict() for d in dumps]
        return out, refusals

    def _ack_of(self, path: str) -> tuple[int, int]:
        h = self._read(path, 1 << 62).header  # header only: no record is that new
        return h[wire.H_CTRL_ACK_SEQ], h[wire.H_CTRL_ACK_RESULT]

    # -- checkpoint (for checkpoint_restart) ---------------------------------------

    def checkpoint(self, cmd: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Write CHECKPOINT_AT_STEP into each target's slot; the hook acks in the
        slot, and that ack reaches the coordinator in the next reports."""
        step, errors, refusals, written = cmd["args"]["step"], [], [], []
        for t in cmd["args"]["ranks"]:
            view = self._slot(cmd["job"], t)
            if view is None:
                refusals.append(c.UNKNOWN_TARGET)
                errors.append(
                    f"rank {t['rank']}: refused ({c.UNKNOWN_TARGET}): no slot of job {cmd['job']} "
                    f"for pid {t['pid']} on this host"
                )
                continue
            ok, why = c.identity_ok(t, self._start_us(view.pid_here), self._tol)
            if not ok:
                errors.append(f"rank {t['rank']}: {why}")
                continue
            try:
                # One open, by fd, no symlinks; written only if it is still the file
                # validated when the rank registered, naming the same process.
                expect = (
                    wire.SlotSnapshot(view.path, view.header, (), uid=view.uid, inode=view.inode)
                    if view.inode
                    else None
                )
                wire.write_control(view.path, None, wire.Command.CHECKPOINT_AT_STEP, step, expect=expect)
                written.append(t["rank"])
            except (wire.SlotError, OSError) as exc:
                errors.append(f"rank {t['rank']}: cannot write {view.path}: {exc}")
        out = ack(cmd, len(written) == len(cmd["args"]["ranks"]), "; ".join(errors))
        out["ranks"] = written
        return out, refusals

    # -- rollback (for rollback_restart) -------------------------------------------

    def rollback(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Write the job's rollback file into the run directory, atomically
        (``sharedfile.write``): the restarted ranks read it (watchdog.hook.rollback).
        In a sticky run dir another user's file at that name cannot be replaced: the
        ack says so, and the ranks do not believe that file anyway."""
        if not self.run_dir:
            return ack(cmd, False, "this agent has no run directory to write the rollback file into")
        doc = {
            "job": cmd["job"],
            "before_step": cmd["args"]["before_step"],
            "action": cmd["args"].get("action", ""),
            "command_id": cmd["id"],
            "written_wall": self._wall(),
        }
        name = wire.rollback_filename(cmd["job"])
        try:  # the run dir is shared: through its fd, an unpredictable temporary name, no links followed
            sharedfile.write(self.run_dir, name, json.dumps(doc).encode())
        except OSError as exc:
            return ack(cmd, False, f"cannot write {os.path.join(self.run_dir, name)}: {exc.strerror or exc}")
        return ack(cmd, True)

    # -- signal (for abort / restart actions) ------------------------------------

    def signal(self, cmd: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        t, name = cmd["target"], cmd["args"]["signal"]
        every = self._incarnations(cmd["job"])
        # pid here -> start time as recorded: live ranks, and the launchers recorded
        # (and verified) when a rank registered -- abort's SIGKILL must still reach a
        # launcher whose workers are already gone. Never a parent looked up now: an
        # orphaned rank's parent is pid 1 (or a subreaper).
        allowed = {v.pid_here: v.identity.proc_start_us for v in every if v.proc.alive}
        allowed.update({v.launcher[0]: v.launcher[1] for v in every if v.launcher[0] > 1})
        # A rank target names the pid the rank recorded; act on that process's pid here.
        pid = next(
            (
                v.pid_here
                for v in every
                if v.identity.pid == t["pid"] and abs(v.identity.proc_start_us - t["proc_start_us"]) <= self._tol
            ),
            t["pid"],
        )
        if pid <= 1 or pid not in allowed:
            return ack(
                cmd,
                False,
                f"refused ({c.UNKNOWN_TARGET}): pid {t['pid']} is neither a live rank of job "
                f"{cmd['job']} on this host nor the launcher recorded when a rank registered",
                refused=c.UNKNOWN_TARGET,
            ), [c.UNKNOWN_TARGET]
        if abs(allowed[pid] - t["proc_start_us"]) > self._tol:
            return ack(
                cmd,
                False,
                f"refused ({c.WRONG_IDENTITY}): pid {t['pid']} started at {allowed[pid]} when it "
                f"registered, the command names {t['proc_start_us']}",
                refused=c.WRONG_IDENTITY,
            ), [c.WRONG_IDENTITY]
        checked: list[str] = []

        def check() -> tuple[bool, str]:
            start = self._start_us(pid)
            if start is None:
                return False, f"pid {t['pid']} is gone"
            ok, why = c.identity_ok(t, start, self._tol)
            if not ok:
                checked.append(c.WRONG_IDENTITY)
            return ok, why

        ok, why = self._send_signal(pid, int(getattr(_signal, name)), check)
        if checked:
            return ack(cmd, False, f"refused ({c.WRONG_IDENTITY}): {why}", refused=c.WRONG_IDENTITY), checked
        return ack(cmd, ok, why), []


def ack(
    cmd: dict[str, Any],
    ok: bool,
    error: str = "",
    *,
    stacks: list | None = None,
    slots: list | None = None,
    refused: str = "",
) -> dict[str, Any]:
    out = {
        "id": cmd.get("id", ""),
        "type": cmd.get("type", ""),
        "ok": ok,
        "error": error[:2000],
        "stacks": stacks or [],
        "slots": slots or [],
    }
    if refused:
        out["refused"] = refused
    return out


def trim(ev: SlotEvidence, max_records: int) -> SlotEvidence:
    if len(ev.records) <= max_records:
        return ev
    drop = len(ev.records) - max_records
    return replace(ev, records=ev.records[drop:], records_dropped=ev.records_dropped + drop)


def fit(slots: list[SlotEvidence], max_bytes: int) -> list[SlotEvidence]:
    """Halve every slot's records (newest kept) until the lot fits in ``max_bytes``."""
    while slots and len(json.dumps([s.to_dict() for s in slots], separators=(",", ":"))) > max_bytes:
        longest = max(len(s.records) for s in slots)
        if longest == 0:
            break
        slots = [trim(s, longest // 2) for s in slots]
    return slots
