"""Reports made before the run and sent on time: the scale benchmark's
generator with its own CPU taken out of the run (``scale.py --replay``).

A simulated host costs ~0.5 ms of CPU a report at 16,384 ranks (its ranks'
rows, their step summaries by the agent's own code, the JSON): 2,048 hosts a
second need a core of their own, which a 2-core machine with the coordinator
pinned to the other one does not have; there the live generator delivered
~400-1,700 reports a second (by the machine's other load), so a 16,384-rank
run measured the generator. Here
each worker process first makes every report its hosts will send in the run
(before the coordinator starts), then sends each at its time, one kept-alive
connection per host: what is left in the run is writing bytes and reading
replies.

What a replay cannot do is listen. Each report is made as if every earlier one
was answered as a coordinator that keeps up answers (``assumed_reply``: version 2
read, the step-summary settings of the default detector settings, step samples
every ``STEPS_INTERVAL_S`` from ``STEPS_FROM_RATE`` reports a second, as
``intake/backpressure.py`` advises). A reply that asks for a longer interval is counted
(``slowed``), not followed: the replay measures whether the coordinator holds
the nominal rate; the live generator measures how it degrades when it does not.
A reply in the steady window that says otherwise than assumed is counted too
(``unlike``): the run then replayed what no agent would have sent.

The reports are made in a frame of their own (the job's clock when they were
made) and sent ``offset`` seconds later. Their ages are relative to sending,
so they hold as long as each goes on time (``late``: how late each went, the
replay's own check); their ``sent_wall`` is then an agent clock ``offset``
behind the coordinator's, which it takes as any agent's clock offset (it reads
differences of ``sent_wall`` only)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import time
from typing import Any

import scalehttp
import scalesim

from watchdog.coordinator.config import DetectorConfig
from watchdog.coordinator.intake.backpressure import STEPS_FROM_RATE, STEPS_INTERVAL_S
from watchdog.report import REPORT_VERSIONS
from watchdog.stepstats.steps import summary_config

Plan = list[tuple[float, bytes]]  # one host's reports: (when to send, in the job's frame; the body)


def assumed_reply(n_hosts: int, interval: float) -> dict[str, Any]:
    """What each report is made assuming the previous one was answered with (a
    host made with ``summaries=False`` ignores the settings, as an older agent)."""
    reply: dict[str, Any] = {
        "report_versions": list(REPORT_VERSIONS),
        "step_summary_config": list(summary_config(DetectorConfig())),
    }
    if n_hosts / interval >= STEPS_FROM_RATE:
        reply["steps_interval_s"] = STEPS_INTERVAL_S
    return reply


def plan(host: scalesim.Host, first: float, interval: float, t_end: float, reply: dict[str, Any]) -> Plan:
    """Every report ``host`` sends from ``first`` until ``t_end``, each made on
    the reply assumed to the one before (the first as the live agent's first:
    version 1, before any reply)."""
    out: Plan = []
    t = first
    while t < t_end:
        rep = host.report(t, interval)
        out.append((t, scalehttp.dumps(rep)))
        host.delivered(rep, reply)
        t += interval
    return out


def worker(
    job: scalesim.Job,
    hosts: list[int],
    interval: float,
    t_end: float,
    window: tuple[float, float],
    reply: dict[str, Any],
    wanted: int,
    summaries: bool,
    q: mp.Queue,
    go: mp.Queue,
) -> None:
    """Make the reports of ``hosts``, say so on ``q``, wait for (address, offset,
    cores) on ``go``, send them, and put what was measured on ``q``."""
    plans = [
        plan(scalesim.Host(job, i, f"agent-{i}-{os.getpid()}", summaries, wanted), t0, interval, t_end, reply)
        for i, t0 in ((i, job.t0 + random.uniform(0, interval)) for i in hosts)  # start-up jitter
    ]
    q.put(("ready", sum(len(p) for p in plans), sum(len(b) for p in plans for _, b in p)))
    addr, offset, cores = go.get()
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    out: dict = {"lat": [], "bytes": [], "late": [], "errors": 0, "slowed": 0, "unlike": 0}

    async def main() -> None:
        res = await asyncio.gather(
            *(_send(p, addr, offset, interval, window, reply, out) for p in plans), return_exceptions=True
        )
        out["errors"] += sum(1 for r in res if isinstance(r, BaseException))

    asyncio.run(main())
    q.put(("done", out))


async def _send(
    reports: Plan,
    addr: tuple[str, int],
    offset: float,
    interval: float,
    window: tuple[float, float],
    assumed: dict[str, Any],
    out: dict,
) -> None:
    if not reports:
        return
    await asyncio.sleep(max(0.0, reports[0][0] + offset - time.time()))
    link = scalehttp.Link(addr)
    await link.open()
    try:
        for t, body in reports:
            at = t + offset
            now = time.time()
            if at > now:
                await asyncio.sleep(at - now)
                now = time.time()
            ok, reply, lat = await link.post(body)
            out["errors"] += not ok
            if window[0] <= t < window[1]:
                out["lat"].append(lat)
                out["bytes"].append(len(body))
                out["late"].append(max(0.0, now - at))
                # The replay's other check: the replies it made the reports on were the ones given.
                if not isinstance(reply, dict) or any(reply.get(k) != v for k, v in assumed.items()):
                    out["unlike"] += 1
            if scalehttp.asked_interval(reply, interval) > interval:
                out["slowed"] += 1  # not followed: see the module's docstring
    finally:
        link.close()
