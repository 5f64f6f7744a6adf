"""Builders for tests, ours and users': fake rank states, host reports and
cluster views with sensible healthy defaults, so a test states only what matters.

    from watchdog.coordinator import testing as t
    view = t.view([t.rank(0), t.rank(1, heartbeat_age_s=9.0)], now=100.0)

For behaviour over time (a job that steps, then hangs) see ``simjob.SimJob``.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Iterable, Sequence

from watchdog.report import CollectiveState, HostReport, RankState, StepSample

from .config import DetectorConfig
from .view import ClusterView, empty, fold

_agent_ids = itertools.count(1)


def coll(seq: int = 0, done_seq: int | None = None, outstanding: int = 0, since_s: float = 0.0,
         group: int = 0, op: str = "all_reduce", nbytes: int = 0) -> CollectiveState:
    """``done_seq`` defaults to ``seq - outstanding``."""
    done = seq - outstanding if done_seq is None else done_seq
    return CollectiveState(group=group, seq=seq, done_seq=done, op=op, bytes=nbytes, outstanding=outstanding, since_s=since_s)


def steps(first: int, n: int, step_s: float = 0.1, data_s: float = 0.0, coll_s: float = 0.02,
          phase: str = "train") -> tuple[StepSample, ...]:
    """``n`` completed steps numbered ``first`` ... ``first + n - 1``."""
    return tuple(StepSample(step=first + i, step_s=step_s, data_s=data_s, coll_s=coll_s, phase=phase) for i in range(n))


def rank(r: int, *, world_size: int = 8, local_rank: int | None = None, pid: int | None = None,
         proc_start_us: int = 1_700_000_000_000_000, alive: bool = True, status: str = "running", step: int = 100,
         step_age_s: float = 0.05, heartbeat_age_s: float = 0.2, phase: str = "train", pg_state: str = "joined",
         in_data_wait: bool = False, data_wait_age_s: float = 0.0, collective: CollectiveState | None = None,
         last_step_s: float = 0.1, last_data_s: float = 0.0, last_coll_s: float = 0.02,
         recent_steps: Sequence[StepSample] = (), cpu_percent: float = 90.0, **extra: Any) -> RankState:
    """A healthy running rank, between collectives, unless told otherwise."""
    return RankState(
        rank=r, local_rank=r % 8 if local_rank is None else local_rank, world_size=world_size,
        pid=1000 + r if pid is None else pid, proc_start_us=proc_start_us, alive=alive, status=status, step=step,
        step_age_s=step_age_s, heartbeat_age_s=heartbeat_age_s, phase=phase, phase_age_s=extra.pop("phase_age_s", 10.0),
        pg_state=pg_state, pg_age_s=extra.pop("pg_age_s", 30.0), in_data_wait=in_data_wait,
        data_wait_age_s=data_wait_age_s, coll=collective if collective is not None else coll(seq=step, done_seq=step),
        last_step_s=last_step_s, last_data_s=last_data_s, last_coll_s=last_coll_s, cpu_percent=cpu_percent,
        recent_steps=tuple(recent_steps), **extra,
    )


def report(host: str, ranks: Iterable[RankState], *, job: str = "job", agent_id: str | None = None, seq: int = 1,
           interval_s: float = 1.0, sent_wall: float = 1_700_000_000.0) -> HostReport:
    return HostReport(job=job, host=host, agent_id=agent_id or f"agent-{host}", seq=seq, sent_wall=sent_wall,
                      interval_s=interval_s, ranks=tuple(ranks))


def host_of(r: int, ranks_per_host: int = 4) -> str:
    return f"host{r // ranks_per_host}"


def view(ranks: Iterable[RankState], now: float = 100.0, *, ranks_per_host: int = 4, job: str = "job",
         world_size: int = 0, base: ClusterView | None = None, cfg: DetectorConfig = DetectorConfig(),
         seq: int = 1, received: dict[str, float] | None = None) -> ClusterView:
    """Fold the given rank states, grouped into hosts of ``ranks_per_host``, into
    a view as if every host reported at ``now`` (or at ``received[host]``)."""
    v = base if base is not None else empty(job, world_size)
    by_host: dict[str, list[RankState]] = {}
    for s in ranks:
        by_host.setdefault(host_of(s.rank, ranks_per_host), []).append(s)
    for host, states in sorted(by_host.items()):
        at = (received or {}).get(host, now)
        v, _ = fold(v, report(host, states, job=job, seq=seq), at, cfg)
    return v


def healthy(world_size: int = 8, **kw: Any) -> list[RankState]:
    return [rank(r, world_size=world_size, **kw) for r in range(world_size)]


def with_rank(states: list[RankState], r: int, **changes: Any) -> list[RankState]:
    """Copy of ``states`` with rank ``r`` changed (RankState fields)."""
    return [replace(s, **changes) if s.rank == r else s for s in states]
