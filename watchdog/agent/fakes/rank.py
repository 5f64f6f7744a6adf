"""A fake rank process: writes its slot like the hook would, "training" (steps,
collectives, heartbeats) until killed, or for ``--steps`` steps then a clean exit.

    python -m watchdog.agent.fakes.rank --run-dir D --job J --rank R --world-size W
"""

from __future__ import annotations

import argparse
import signal
import time
from typing import Any

from watchdog import wire
from watchdog.agent.fakes.slotwriter import SlotWriter, identity


def _exit(*_: Any) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="fake rank: writes a slot like the hook would")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--job", default="job")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--step-seconds", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=0, help="exit cleanly after this many (0 = until killed)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit)
    wr = SlotWriter(args.run_dir, identity(args.job, args.rank, args.world_size))
    wr.update({wire.H_PG_STATE: int(wire.PgState.JOINED), wire.H_PG_CHANGE_NS: time.monotonic_ns()})
    wr.status(wire.Status.RUNNING)
    step_ns = int(args.step_seconds * 1e9)
    seq, done = 0, 0
    try:
        while not args.steps or done < args.steps:
            t0 = time.monotonic_ns()
            time.sleep(args.step_seconds * 0.1)  # "data"
            seq += 1
            wr.enter_collective(seq)
            time.sleep(args.step_seconds * 0.3)  # "all-reduce"
            wr.exit_collective()
            wr.heartbeat()
            time.sleep(max(0.0, (t0 + step_ns - time.monotonic_ns()) / 1e9))
            wr.step(time.monotonic_ns() - t0, step_ns // 10, step_ns * 3 // 10)
            done += 1
        wr.status(wire.Status.EXITED)
    except (SystemExit, KeyboardInterrupt):
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
