"""Collect the ranks' Flight Recorder buffers (the ``dump_flight_recorder`` command).

The agent cannot read another process's Flight Recorder; the rank's hook can.
So the agent writes DUMP_FLIGHT_RECORDER into each target's slot control block
(identity checked, as for a checkpoint request), the hook's background thread
writes ``_dump_fr_trace_json``'s bytes next to the slot (``wire.fr_dump_filename``)
and acknowledges, and the agent reads that file back: JSON only, never a
pickle (a rank's file is untrusted input to a possibly more privileged agent).

All targets are asked first, then awaited together under one deadline: a hang
is when this is asked for, and a frozen rank's hook will never answer (its
entry then says so). Runs on the agent's command worker thread.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from watchdog import sharedfile
from watchdog.contracts import slot as wire
from watchdog.contracts.control_block import ACK_NO_HANDLER, ACK_OK
from watchdog.contracts.evidence import FlightRecorderDump

DEADLINE_S = 3.0  # six heartbeats at the hook's default 0.5 s
POLL_S = 0.05
MAX_FILE_BYTES = 32 << 20  # a 2,000-entry ring with stack frames is a few MB


def read_dump_file(path: str) -> bytes:
    """The whole file, never through a symlink, never a FIFO, never unbounded, and
    only when it belongs to the owner of the slot it sits beside (validated when the
    rank registered): another user's file planted at the name is not evidence."""
    slot = path.removesuffix(wire.FR_DUMP_SUFFIX)
    return sharedfile.read(path, frozenset({os.lstat(slot).st_uid}), MAX_FILE_BYTES)


def collect(
    asks: list[tuple[int, int, str, Callable[[], int]]],
    host: str,
    *,
    ack_of: Callable[[str], tuple[int, int]],
    wall: Callable[[], float] = time.time,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    deadline_s: float = DEADLINE_S,
    read: Callable[[str], bytes] = read_dump_file,
) -> list[FlightRecorderDump]:
    """``asks``: (rank, pid, slot path, request) where ``request()`` writes the
    control word and returns its sequence number (raises on failure). ``ack_of``:
    a slot's (H_CTRL_ACK_SEQ, H_CTRL_ACK_RESULT)."""
    out: dict[int, FlightRecorderDump] = {}
    waiting: dict[int, tuple[int, str, int]] = {}
    for rank, pid, path, request in asks:
        try:
            waiting[rank] = (pid, path, request())
        except (wire.SlotError, OSError) as exc:
            out[rank] = FlightRecorderDump(host, rank, pid, False, f"cannot write the request into {path}: {exc}")
    end = clock() + deadline_s
    while waiting:
        for rank, (pid, path, seq) in list(waiting.items()):
            try:
                got, result = ack_of(path)
            except (wire.SlotError, OSError) as exc:
                out[rank] = FlightRecorderDump(host, rank, pid, False, f"slot unreadable: {exc}")
                del waiting[rank]
                continue
            if got != seq:
                continue
            del waiting[rank]
            out[rank] = _answer(host, rank, pid, path, result, wall(), read)
        if waiting and clock() >= end:
            for rank, (pid, _, _) in waiting.items():
                out[rank] = FlightRecorderDump(
                    host,
                    rank,
                    pid,
                    False,
                    f"no answer from the hook within {deadline_s:g} s (frozen, or no hook thread)",
                )
            break
        if waiting:
            sleep(POLL_S)
    return [out[r] for r in sorted(out)]


def _answer(
    host: str, rank: int, pid: int, path: str, result: int, now: float, read: Callable[[str], Any]
) -> FlightRecorderDump:
    if result == ACK_NO_HANDLER:
        return FlightRecorderDump(host, rank, pid, False, "this rank's torch has no Flight Recorder (or it is off)")
    if result != ACK_OK:
        return FlightRecorderDump(
            host, rank, pid, False, f"the hook could not dump its Flight Recorder (code {result})"
        )
    fr_path = wire.fr_dump_filename(path)
    try:
        return FlightRecorderDump.from_json(read(fr_path), host, rank, pid, now)
    except (OSError, ValueError, TypeError) as exc:
        return FlightRecorderDump(host, rank, pid, False, f"cannot read {fr_path}: {exc}")


def fit(dumps: list[FlightRecorderDump], max_bytes: int) -> list[FlightRecorderDump]:
    """Halve every dump's entries (newest kept) until the lot fits in ``max_bytes``."""
    while dumps and len(json.dumps([d.to_dict() for d in dumps], separators=(",", ":"))) > max_bytes:
        longest = max(len(d.entries) for d in dumps)
        if longest == 0:
            break
        keep = longest // 2
        dumps = [
            replace(
                d, entries=d.entries[-keep:] if keep else [], entries_dropped=d.entries_dropped + len(d.entries) - keep
            )
            if len(d.entries) > keep
            else d
            for d in dumps
        ]
    return dumps
