"""``watchdog slots --run-dir DIR [--json]``: one line per slot file, read directly
(no agent needed): what each rank was doing, and whether its process is alive.
For the person paged at 03:00, and for post-mortems: dead ranks' files keep their
last state."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict

from watchdog import flags, rundir
from watchdog.agent.processes.table import ProcessTable
from watchdog.agent.reporting import build as report
from watchdog.agent.slotfiles import slot_states
from watchdog.agent.slotfiles.local_rank import LocalRank
from watchdog.contracts import slot as wire
from watchdog.flags import Flag, FlagError

FLAGS = (
    Flag(
        flags.RUN_DIR, "", f"directory holding the ranks' slot files (empty: the hook's default, {rundir.DEFAULT_RULE})"
    ),
    Flag(flags.JOB_NAME, "", "only this job (empty = all)", old_env=flags.OLD_ENV[flags.JOB_NAME]),
    Flag(
        "stale.after-seconds", 30.0, "mark slots of gone processes with older heartbeats as stale", flags.positive_float
    ),
    Flag("json", False, "print JSON instead of a table (a bare --json works too)", flags.boolean),
)


def collect(
    run_dir: str,
    job: str,
    stale_after_s: float,
    now_mono_ns: int,
    now_wall_ns: int,
    procs: ProcessTable,
    read: Callable = wire.read_slot,
) -> tuple[list[dict], list[dict]]:
    """(rows, errors): a row is a report.RankState as a dict plus job, state and path."""
    found, errors = [], []
    for path in wire.list_slot_files(run_dir):
        try:
            snap = read(path)
        except FileNotFoundError:
            continue
        except (wire.SlotError, OSError) as exc:
            errors.append({"path": path, "reason": getattr(exc, "reason", "io"), "error": str(exc)})
            continue
        ident = snap.header.identity
        if job and ident.job != job:
            continue
        proc = procs.check(
            ident.pid, ident.proc_start_us, now_mono_ns, resources=True, start_ticks=ident.proc_start_ticks
        )
        stale = slot_states.stale_reason(snap.header, proc, now_mono_ns, now_wall_ns, stale_after_s)
        found.append((snap, proc, stale))
    live = [f for f in found if not f[2]]
    # One listing, no history: every file is first seen now; a live process wins over a dead one.
    winners = {id(f) for f in slot_states.speakers(live, _rank_key, _claim).values()}
    rows = []
    for f in found:
        snap, proc, stale = f
        state = slot_states.STALE if stale else slot_states.rank_state(snap.header.status, proc)
        if not stale and id(f) not in winners:
            state = slot_states.SUPERSEDED
        steps = tuple(r for r in snap.records if r.kind == wire.RecordKind.STEP_END)
        view = LocalRank(snap.path, snap.header, snap.header.heartbeat_ns, snap.torn, proc, state, 0.0, steps)
        rs = report.rank_state(view, now_mono_ns)
        row = {"job": snap.header.identity.job, "state": state, "path": snap.path, **asdict(rs)}
        row["recent_steps"] = row["recent_steps"][-5:]
        rows.append(row)
    rows.sort(key=lambda r: (r["job"], r["rank"], r["created_wall"]))
    return rows, errors


COLUMNS = (
    "job",
    "rank",
    "pid",
    "state",
    "proc",
    "step",
    "phase",
    "hb_age",
    "last_step",
    "data",
    "coll",
    "compute",
    "collective",
    "errors",
)


def _rank_key(f: tuple) -> tuple[str, int]:
    return (f[0].header.identity.job, f[0].header.identity.rank)


def _claim(f: tuple) -> slot_states.Claim:
    h, alive = f[0].header, f[1].alive
    return slot_states.Claim(0, alive, alive, (h.created_wall_ns, h.created_mono_ns), f[0].path)


def _cells(r: dict) -> tuple[str, ...]:
    c = r["coll"]
    if c["outstanding"] > 0:
        coll = f"in #{c['seq']} {c['op']} {c['since_s']:.1f}s"
    else:
        coll = f"done #{c['done_seq']}" if c["seq"] else "-"
    compute = max(0.0, r["last_step_s"] - r["last_data_s"] - r["last_coll_s"])
    return (
        r["job"],
        str(r["rank"]),
        str(r["pid"]),
        r["state"],
        r["proc_status"],
        str(r["step"]),
        r["phase"],
        f"{r['heartbeat_age_s']:.1f}s",
        f"{r['last_step_s']:.3f}",
        f"{r['last_data_s']:.3f}",
        f"{r['last_coll_s']:.3f}",
        f"{compute:.3f}",
        coll,
        str(r["hook_errors"]),
    )


def table(rows: list[dict], errors: list[dict]) -> str:
    cells = [COLUMNS] + [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip() for c in cells]
    if not rows:
        lines.append("(no slot files)")
    lines += [f"unreadable: {e['path']}: {e['reason']}: {e['error']}" for e in errors]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    args = ["--json=true" if a == "--json" else a for a in args]  # a bare switch; flags.py flags take values
    try:
        v = flags.parse("watchdog slots", "Print the rank slots in a run directory.", FLAGS, args)
    except FlagError as exc:
        print(f"watchdog slots: {exc}", file=sys.stderr)
        return 2
    for warning in flags.deprecations(FLAGS):
        print(f"watchdog slots: {warning}", file=sys.stderr)
    run_dir = v["run_dir"]
    if not run_dir:
        run_dir = rundir.default_run_dir(os.environ)
        print(f"watchdog slots: no --run-dir, reading the hook's default: {run_dir}", file=sys.stderr)
    rows, errors = collect(
        run_dir, v["job_name"], v["stale_after_seconds"], time.monotonic_ns(), time.time_ns(), ProcessTable()
    )
    print(json.dumps({"ranks": rows, "errors": errors}, indent=1) if v["json"] else table(rows, errors))
    return 0
