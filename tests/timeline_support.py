"""Journals for the timeline tests.

Fast tests build journals in-process: slots written by the real hook (FakeClock,
exact times) and read the way the agent reads them
(``SlotEvidence.from_snapshot(wire.read_slot(path))``), findings and events shaped
as the coordinator journals them. The real-run tests use the demo's own journals
(the agent journals the evidence); ``without_evidence`` and ``torn`` derive the
older-coordinator and killed-mid-write variants from them.
"""

from __future__ import annotations

import json
from pathlib import Path

from watchdog.contracts import slot as wire
from watchdog.contracts.evidence import SlotEvidence, StackDump
from watchdog.coordinator.journal import event_names as je


def without_evidence(src: Path, dst: Path) -> Path:
    """The same journal as a coordinator without evidence collection would have left it."""
    lines = [
        x
        for x in src.read_bytes().splitlines(keepends=True)
        if json.loads(x).get("event")
        not in (je.EVIDENCE, je.COMMAND, je.COMMAND_DONE, je.COMMAND_REFUSED, je.COMMAND_EXPIRED)
    ]
    dst.write_bytes(b"".join(lines))
    return dst


def torn(src: Path, dst: Path) -> Path:
    """The journal as a kill in the middle of writing its last record leaves it."""
    data = src.read_bytes().rstrip(b"\n")
    cut = data.rfind(b"\n") + 1
    dst.write_bytes(data[: cut + max(1, (len(data) - cut) // 2)])
    return dst


# -- journals built in-process, for the fast tests ------------------------------------


def hook_slot(
    run_dir: Path,
    rank: int,
    world: int,
    *,
    steps: int,
    end: str,
    host: str = "node-a",
    start_ns: int = 10**12,
    stuck_ns: int = 5 * 10**9,
    wall_offset_s: float = 0.0,
    pid: int | None = None,
) -> SlotEvidence:
    """A real slot written by the real hook (FakeClock: exact times), read the way
    the agent reads it. ``end``: "code" (stopped in its own code after ``steps``
    steps) or "collective" (inside collective #steps+1 since then). The snapshot is
    taken ``stuck_ns`` later; ``wall_offset_s`` skews the agent's wall clock."""
    import dataclasses

    from watchdog.hook.testing import FakeClock, installed

    clock = FakeClock(start_ns)
    with installed(
        run_dir,
        clock=clock,
        rank=rank,
        world_size=world,
        job="unit",
        host=host,
        patch_collectives=False,
        heartbeat_interval_s=3600,
    ) as mon:

        def batches():
            while True:
                clock.advance(1_000_000)  # each fetch waits 1 ms on the "loader"
                yield 0

        it = iter(mon.wrap_loader(batches()))
        for i in range(steps):
            next(it)
            if i == steps // 2:
                with mon.phase("checkpoint"):
                    clock.advance(200_000_000)
            clock.advance(50_000_000)  # forward/backward
            with mon.collective(wire.CollOp.DDP_ALL_REDUCE):
                clock.advance(10_000_000)
            clock.advance(5_000_000)  # optimizer
            mon.step()
        next(it)
        clock.advance(40_000_000)
        scope = mon.collective(wire.CollOp.DDP_ALL_REDUCE) if end == "collective" else None
        if scope is not None:
            scope.__enter__()
        clock.advance(stuck_ns)
        snap = wire.read_slot(mon.slot_path)
        h = snap.header
        wall = (h.created_wall_ns + (clock.now - h.created_mono_ns)) / 1e9 + wall_offset_s
        ev = SlotEvidence.from_snapshot(snap, host, wall, clock.now)
        if scope is not None:
            scope.__exit__(None, None, None)
    return dataclasses.replace(ev, pid=pid) if pid else ev


PY_SPY_TEXT = """Process {pid}: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread {pid} (idle): "MainThread"
    {frame}
    main (train.py:220)
    <module> (train.py:246)
Thread 99 (idle): "watchdog-heartbeat"
    wait (threading.py:331)
"""


def fake_stack(host: str, rank: int, pid: int, frame: str, taken_wall: float) -> StackDump:
    return StackDump(
        host=host, rank=rank, pid=pid, ok=True, text=PY_SPY_TEXT.format(pid=pid, frame=frame), taken_wall=taken_wall
    )


def write_journal(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
    return path


def hang_records(
    tmp: Path, *, world: int = 4, culprit: int = 2, steps: int = 12, evidence: bool = True, pid0: int = 1000
) -> list[dict]:
    """A coordinator journal of a hang (rank ``culprit`` never enters the next
    all-reduce), with the slots the real hook wrote and py-spy-shaped stacks."""
    slots = [
        hook_slot(tmp / f"r{r}", r, world, steps=steps, end="code" if r == culprit else "collective", pid=pid0 + r)
        for r in range(world)
    ]
    taken = max(s.taken_wall for s in slots)
    t0 = min(s.created_wall_ns for s in slots) / 1e9 - 5.0  # the coordinator started before the ranks
    seq = steps + 1
    recs: list[dict] = [{"event": je.START, "t_wall": t0, "t_mono": 1.0, "job": "unit", "world_size": world}]
    recs += [
        {
            "event": je.RANK_JOINED,
            "t_wall": t0 + 1,
            "t_mono": 2.0,
            "rank": r,
            "host": "node-a",
            "pid": pid0 + r,
            "status": "running",
            "pg_state": "joined",
        }
        for r in range(world)
    ]
    waiters = [r for r in range(world) if r != culprit]
    recs.append(
        {
            "event": je.FINDING,
            "t_wall": taken - 0.1,
            "t_mono": 9.0,
            "kind": "collective_hang",
            "ranks": [culprit],
            "hosts": ["node-a"],
            "onset_wall": taken - 5.0,
            "detected_wall": taken - 0.1,
            "reason": f"rank {culprit} (host node-a, pid {pid0 + culprit}) never entered ddp_all_reduce #{seq}",
            "evidence": {
                "group": 0,
                "seq": seq,
                "op": "ddp_all_reduce",
                "waiters": waiters,
                "how": "missing",
                "culprits": {
                    str(culprit): {
                        "host": "node-a",
                        "pid": pid0 + culprit,
                        "step": steps,
                        "phase": "train",
                        "in_data_wait": False,
                        "coll_seq": steps,
                        "coll_outstanding": 0,
                        "heartbeat_age_s": 0.2,
                        "health": "ok",
                    }
                },
            },
            "wants_stacks": [culprit],
        }
    )
    if evidence:
        stacks = [
            fake_stack("node-a", culprit, pid0 + culprit, "stuck_here (train.py:213)", taken),
            fake_stack("node-a", waiters[0], pid0 + waiters[0], "backward (torch/autograd/__init__.py:395)", taken),
        ]
        recs.append(
            {
                "event": je.EVIDENCE,
                "t_wall": taken + 0.2,
                "t_mono": 10.0,
                "host": "node-a",
                "trigger": {"kind": "collective_hang", "ranks": [culprit]},
                "stacks": [s.to_dict() for s in stacks],
                "slots": [s.to_dict() for s in slots],
            }
        )
    recs.append(
        {
            "event": je.STOP,
            "t_wall": taken + 3.0,
            "t_mono": 13.0,
            "reason": "SIGTERM",
            "active_findings": [{"kind": "collective_hang", "ranks": [culprit]}],
        }
    )
    return recs


def check_trace(trace: dict) -> list[dict]:
    """Chrome trace event format, as Perfetto's JSON importer reads it: every event
    has ph/ts/pid/tid; X events carry an integer dur >= 0 and nest properly on each
    thread (no partial overlap); B/E pairs, if any, balance. Returns the events."""
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    stacks: dict[tuple[int, int], list[tuple[int, int]]] = {}
    open_be: dict[tuple[int, int], int] = {}
    for e in events:
        for key in ("ph", "ts", "pid", "tid", "name"):
            assert key in e, (key, e)
        assert isinstance(e["ts"], (int, float)) and isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert e["ph"] in ("X", "i", "I", "M", "B", "E", "C"), e
        if e["ph"] == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 0, e
        if e["ph"] == "i":
            assert e.get("s", "t") in ("g", "p", "t"), e
        if e["ph"] in ("B", "E"):
            k = (e["pid"], e["tid"])
            open_be[k] = open_be.get(k, 0) + (1 if e["ph"] == "B" else -1)
            assert open_be[k] >= 0, e
    assert all(v == 0 for v in open_be.values()), open_be
    xs = sorted((e for e in events if e["ph"] == "X"), key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
    for e in xs:
        stack = stacks.setdefault((e["pid"], e["tid"]), [])
        start, end = e["ts"], e["ts"] + e["dur"]
        while stack and stack[-1][1] <= start:
            stack.pop()
        if stack:
            assert end <= stack[-1][1], f"{e} overlaps its parent {stack[-1]} without nesting"
        stack.append((start, end))
    return events
