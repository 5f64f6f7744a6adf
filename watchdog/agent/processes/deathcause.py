"""Why a rank's process ended, from what this host can still see.

Only a process's parent reaps its exit status, and under torchrun the parent is
the elastic agent, not us. What stays observable, each source optional:

- **The wait status of the zombie.** Between its exit and the parent's reaping,
  a process is a zombie whose ``/proc/<pid>/stat`` field 52 (``exit_code``,
  Linux >= 3.5) holds the wait status. Our deathwatch thread wakes on the pidfd
  at the exit itself, typically milliseconds before torchrun's monitor loop
  (polling every 0.1-5 s) reaps it, and reads it then (``zombie_status``).
- **An OOM kill.** The oom_kill counter of the rank's memory cgroup (cgroup v2
  ``memory.events``, v1 ``memory.oom_control``), read at first sight and again
  at death; and the kernel's own line ``Killed process <pid> (...)`` in
  ``/dev/kmsg`` where readable (root, no container restriction).
- **The hook's last words** (``watchdog.contracts.crash_record``): the uncaught
  exception with its traceback, the fatal-signal stack dump.

``explain`` composes them into a small dict for the report, with a one-line
``summary`` the coordinator puts in the dead_rank finding. Every reader here
is bounded and returns None/"" on any error: a post-mortem detail must never
cost the agent its loop.
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass
from typing import Any

from watchdog import procstart
from watchdog.agent.processes import steadystart
from watchdog.contracts import crash_record as crashrecord

MAX_KMSG_RECORDS = 20000  # the kernel ring is 128 KiB - a few MiB: bounded either way
MAX_DETAIL = 2000  # traceback / fatal dump tail carried in every report while the rank is exported


def zombie_status(pid: int, proc_root: str = "/proc", start_us: int = 0, tolerance_us: int = 20_000) -> int | None:
    """The raw wait status of ``pid`` if it is a zombie now, else None. With
    ``start_us`` (the rank's recorded start time), only if the zombie is that
    process and not a reused pid's."""
    rest = procstart.stat_fields(procstart.read_text(f"{proc_root}/{pid}/stat") or "")
    # rest[0] is field 3 (state); field 22 (starttime) is rest[19]; field 52 (exit_code) is rest[49].
    if len(rest) < 50 or rest[0] != "Z":
        return None
    try:
        if start_us:
            # As the process table first read it (a step of the wall clock since moved btime)
            read = steadystart.first_us(pid, int(rest[19]), proc_root)
            if read is None or abs(read - start_us) > tolerance_us:
                return None
        return int(rest[49])
    except (ValueError, OSError):
        return None


def decode(status: int) -> tuple[int | None, str]:
    """(exit code, signal name): torchrun's convention, a signal is a negative code."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return -sig, signal_name(sig)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), ""
    return None, ""


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def oom_counter_file(pid: int, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> str:
    """The file holding the oom_kill count of ``pid``'s memory cgroup, or ""."""
    try:
        with open(f"{proc_root}/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            lines = fh.read(8192).splitlines()
    except OSError:
        return ""
    candidates = []
    for line in lines:
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        path = path.lstrip("/")
        if hier == "0" and controllers == "":  # v2 (unified) hierarchy
            candidates += [
                os.path.join(cgroup_root, path, "memory.events"),
                os.path.join(cgroup_root, "unified", path, "memory.events"),
            ]
        elif "memory" in controllers.split(","):  # v1
            candidates.append(os.path.join(cgroup_root, "memory", path, "memory.oom_control"))
    return next((c for c in candidates if os.path.isfile(c)), "")


def oom_kills(counter_file: str) -> int | None:
    if not counter_file:
        return None
    try:
        with open(counter_file, encoding="ascii", errors="replace") as fh:
            for line in fh.read(4096).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def kernel_oom_line(pid: int, kmsg: str = "/dev/kmsg") -> str:
    """The kernel's "Killed process <pid> (comm) ..." line, or ""."""
    needle = f"Killed process {pid} ("
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ""
    found = ""
    try:
        for _ in range(MAX_KMSG_RECORDS):
            try:
                rec = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # a record was overwritten while we read: go on
                    continue
                break  # EAGAIN: the end
            if not rec:
                break
            text = rec.decode("utf-8", "replace")
            if needle in text:
                found = text.partition(";")[2].strip()[:500]
    finally:
        os.close(fd)
    return found


@dataclass(frozen=True)
class OomBaseline:
    """The rank's memory cgroup counter as first seen (while alive)."""

    counter_file: str = ""
    kills: int | None = None

    @classmethod
    def read(cls, pid: int, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> OomBaseline:
        path = oom_counter_file(pid, proc_root, cgroup_root)
        return cls(path, oom_kills(path))


SUMMARY_MESSAGE = 160  # an exception message in the one-line summary (the evidence keeps it whole)


def brief(message: str) -> str:
    """First line, bounded: gloo and torch wrap whole tracebacks into their messages."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    return first if len(first) <= SUMMARY_MESSAGE else first[: SUMMARY_MESSAGE - 1] + "…"


def exit_phrase(code: int, sig: str, call: str, hook_status: str) -> str:
    """How the process ended, for the summary: the status, the signal, and how it
    asked for it where the hook saw the call."""
    if sig:
        return f"exit {code} ({sig})"
    if call:
        return f"exit {code} by {call}"
    if code and hook_status == "exited":
        # The hook saw a normal interpreter shutdown: a SystemExit raised with that code, or a C exit().
        return f"exit {code} (a SystemExit or C-level exit with a nonzero status)"
    return f"exit {code}"


def in_main_thread(crash: dict[str, Any]) -> bool:
    """The crash record's exception was raised in the main thread (an old hook's record names none)."""
    return crash["thread"] in ("", "MainThread")


def uncaught_in_main(crash: dict[str, Any] | None, hook_status: str, fatal: str) -> bool:
    """The rank ended on an uncaught exception in its main thread and nothing after it
    chose another status: CPython then exits 1 (a KeyboardInterrupt re-raises SIGINT
    instead; an exit call or a fatal signal in the shutdown is recorded by the hook)."""
    return (
        crash is not None
        and bool(crash["type"])
        and crash["type"] != "KeyboardInterrupt"
        and in_main_thread(crash)
        and crash.get("exit") is None
        and hook_status == "failed"
        and not fatal
    )


def explain(
    *,
    wait_status: int | None,
    hook_status: str,
    slot_path: str,
    oom: OomBaseline | None = None,
    host_pid: int = 0,
    kmsg: str = "/dev/kmsg",
) -> dict[str, Any]:
    """What is known about one death; ``summary`` is the line for a person."""
    out: dict[str, Any] = {}
    parts: list[str] = []
    crash = crashrecord.read_crash(slot_path) if slot_path else None
    fatal = crashrecord.read_fatal(slot_path) if slot_path else ""
    exit_call = crash.get("exit") if crash is not None else None
    if crash is not None and crash["type"]:
        where = f" at {crash['where']}" if crash["where"] else ""
        thread = "" if in_main_thread(crash) else f" (in thread {crash['thread']})"
        out["exception"] = {k: crash[k] for k in ("type", "message", "where", "function", "thread")}
        out["traceback"] = crash["traceback"][-MAX_DETAIL:]
        line = f"{crash['type']}: {brief(crash['message'])}" if crash["message"] else crash["type"]
        # An exception in the main thread is why it died; one in another thread is a clue.
        parts.append(
            f"{line}{where}{thread}"
            if not thread or hook_status == "failed"
            else f"last exception {line}{where}{thread}"
        )
    if fatal:
        out["fatal"] = fatal[-MAX_DETAIL:]
        parts.append(fatal.splitlines()[0][:200])
    code, sig = decode(wait_status) if wait_status is not None else (None, "")
    if exit_call is not None:
        out["exit_call"] = exit_call["call"]
        if code is None:  # the zombie was reaped first: the status the rank asked for
            code = exit_call["status"]
    inferred = code is None and uncaught_in_main(crash, hook_status, fatal)
    if inferred:
        code = 1  # the zombie was reaped first, but the interpreter's status is set by then
    if code is not None:
        out["exit_code"] = code
        if sig:
            out["signal"] = sig
        parts.append(
            f"exit {code} (as Python exits after an uncaught exception; its launcher reaped it before this"
            " host read the status)"
            if inferred
            else exit_phrase(code, sig, exit_call["call"] if exit_call else "", hook_status)
        )
    elif hook_status == "failed" and crash is None:
        parts.append("uncaught exception (hook status failed)")
    if code is None or sig == "SIGKILL":  # the OOM killer sends SIGKILL; nothing else needs the look
        kernel = kernel_oom_line(host_pid, kmsg) if host_pid > 0 else ""
        counted = ""
        if oom is not None and oom.counter_file:
            now = oom_kills(oom.counter_file)
            if now is not None and oom.kills is not None and now > oom.kills:
                counted = f"cgroup {os.path.basename(oom.counter_file)} oom_kill {oom.kills} -> {now}"
        evidence = [e for e in (counted, f"kernel: {kernel[:200]}" if kernel else "") if e]
        if kernel or (counted and sig == "SIGKILL"):
            out["oom"] = "; ".join(evidence)
            parts.append(f"OOM-killed by the kernel ({out['oom']})")
        elif counted:
            # Ranks often share a cgroup (one container): an OOM kill counted there may
            # have been another process's. Said as a possibility, never as the cause.
            out["oom"] = counted
            parts.append(f"its memory cgroup recorded an OOM kill ({counted}), possibly of another process")
    if parts:
        out["summary"] = ", ".join(parts)
    return out
