"""Simulated journals of a hang at scale, for tests and ``benchmarks/stacks_scale.py``:
N ranks on N/ranks_per_host hosts, every rank's py-spy-shaped stack in the
evidence (one record per host, as the coordinator journals them), most ranks
waiting in the gradient all-reduce under ``backward`` and a few elsewhere, plus
the coordinator's ``stack_groups`` record built by the real gatherer."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from watchdog.contracts.evidence import StackDump
from watchdog.contracts.journal import names as je
from watchdog.coordinator.evidence.stack_gather import StackGather

HEAD = "Process {pid}: /usr/bin/python3.11 -u train.py --steps 100000\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
MAIN = 'Thread {pid} (idle): "MainThread"\n'
OTHERS = (
    'Thread {t1} (idle): "watchdog-heartbeat"\n'
    "    wait (threading.py:331)\n"
    "    wait (threading.py:629)\n"
    "    _run (watchdog/hook/slot/heartbeat.py:61)\n"
    "    run (threading.py:982)\n"
    "    _bootstrap_inner (threading.py:1045)\n"
    "    _bootstrap (threading.py:1002)\n"
    'Thread {t2} (idle): "pin_memory"\n'
    "    get (queue.py:180)\n"
    "    _pin_memory_loop (torch/utils/data/_utils/pin_memory.py:54)\n"
    "    run (threading.py:982)\n"
)
TP = "torch/"  # py-spy prints paths relative to sys.path, as here
WAITING = (
    f"    _engine_run_backward ({TP}autograd/graph.py:825)\n"
    f"    backward ({TP}autograd/__init__.py:347)\n"
    f"    backward ({TP}_tensor.py:581)\n"
    "    main (train.py:212)\n"
)
IN_LOADER = (
    "    _recv_bytes (multiprocessing/connection.py:430)\n"
    f"    _try_get_data ({TP}utils/data/dataloader.py:1133)\n"
    f"    _next_data ({TP}utils/data/dataloader.py:1327)\n"
    f"    __next__ ({TP}utils/data/dataloader.py:701)\n"
    "    main (train.py:190)\n"
)
IN_CHECKPOINT = (
    f"    _save ({TP}serialization.py:1124)\n"
    f"    save ({TP}serialization.py:967)\n"
    "    save_checkpoint (train.py:150)\n"
    "    main (train.py:230)\n"
)
OUTER = "    <module> (train.py:246)\n"


def stack_text(pid: int, frames: str) -> str:
    return HEAD.format(pid=pid) + MAIN.format(pid=pid) + frames + OUTER + OTHERS.format(t1=pid + 1, t2=pid + 2)


def hang_journal(
    path: Path,
    ranks: int,
    *,
    ranks_per_host: int = 8,
    culprit: int = 1,
    odd: Mapping[int, str] | None = None,
    t0: float = 1.7e9,
    with_record: bool = True,
) -> Path:
    """``odd``: rank -> its innermost frames (default: ``culprit`` in a data
    loader and the middle rank in a checkpoint write); everyone else waits."""
    odd = dict(odd) if odd is not None else {culprit: IN_LOADER, ranks // 2 + 1: IN_CHECKPOINT}
    host = [f"node-{r // ranks_per_host:05d}" for r in range(ranks)]
    trigger = {"kind": "collective_hang", "ranks": [culprit]}
    recs: list[dict[str, Any]] = [{"event": je.START, "t_wall": t0, "t_mono": 1.0, "job": "sim", "world_size": ranks}]
    recs += [
        {
            "event": je.RANK_JOINED,
            "t_wall": t0 + 1,
            "t_mono": 2.0,
            "rank": r,
            "host": host[r],
            "pid": 10_000 + r,
            "status": "running",
            "pg_state": "joined",
            "world_size": ranks,
        }
        for r in range(ranks)
    ]
    recs.append(
        {
            "event": je.FINDING,
            "t_wall": t0 + 60,
            "t_mono": 61.0,
            "kind": "collective_hang",
            "ranks": [culprit],
            "hosts": [host[culprit]],
            "onset_wall": t0 + 55,
            "detected_wall": t0 + 60,
            "reason": f"rank {culprit} never entered ddp_all_reduce #501 on the default group; "
            f"{ranks - 1} ranks waiting 5.0 s",
            "evidence": {"waiters": []},
            "wants_stacks": [culprit],
        }
    )
    gather = StackGather()
    by_host: dict[str, list[int]] = {}
    for r in range(ranks):
        by_host.setdefault(host[r], []).append(r)
    gather.expect(trigger, by_host, now=61.0)
    for i, (h, members) in enumerate(sorted(by_host.items())):
        stacks = [
            StackDump(
                host=h,
                rank=r,
                pid=10_000 + r,
                ok=True,
                text=stack_text(10_000 + r, odd.get(r, WAITING)),
                taken_wall=t0 + 61,
                duration_s=0.05,
            ).to_dict()
            for r in members
        ]
        ev = {
            "event": je.EVIDENCE,
            "t_wall": t0 + 61 + i * 1e-4,
            "t_mono": 62.0,
            "command_id": f"c-{i}",
            "type": "dump_stacks",
            "host": h,
            "trigger": trigger,
            "ok": True,
            "error": "",
            "stacks": stacks,
            "slots": [],
            "bound": {"parallel": 8, "deadline_s": 10.0, "duration_s": 0.4, "late": []},
        }
        gather.note(je.EVIDENCE, ev)
        recs.append(ev)
    if with_record:
        [grouped] = gather.due(63.0)
        recs.append(replace(grouped, t_wall=t0 + 63, t_mono=63.0).to_dict())
    recs.append({"event": je.STOP, "t_wall": t0 + 70, "t_mono": 70.0, "reason": "SIGTERM"})
    with open(path, "w", encoding="utf-8") as fh:
        for rec in recs:
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
    return path
