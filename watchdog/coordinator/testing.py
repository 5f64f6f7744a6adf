"""Builders for tests, ours and users': fake rank states, host reports and
cluster views with sensible healthy defaults, so a test states only what matters.

    from watchdog.coordinator import testing as t
    view = t.view([t.rank(0), t.rank(1, heartbeat_age_s=9.0)], now=100.0)

For behaviour over time (a job that steps, then hangs), ``SimJob`` below
simulates a lock-step job whose hosts report as time, a number, advances.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from watchdog.contracts.journal.record import Record
from watchdog.report import CollectiveState, CollSig, GpuStep, HostReport, RankState, StepSample

from ..contracts.finding import Finding
from .config import DetectorConfig
from .view.cluster import ClusterView, Folder, empty, fold

_agent_ids = itertools.count(1)


def coll(
    seq: int = 0,
    done_seq: int | None = None,
    outstanding: int = 0,
    since_s: float = 0.0,
    group: int = 0,
    op: str = "all_reduce",
    nbytes: int = 0,
) -> CollectiveState:
    """``done_seq`` defaults to ``seq - outstanding``."""
    done = seq - outstanding if done_seq is None else done_seq
    return CollectiveState(
        group=group, seq=seq, done_seq=done, op=op, bytes=nbytes, outstanding=outstanding, since_s=since_s
    )


def sig(
    seq: int,
    *,
    elements: int = 4,
    op: str = "all_reduce",
    dtype: str = "float32",
    group: int = 0,
    age_s: float = 1.0,
    state: str = "scheduled",
) -> CollSig:
    """One Flight Recorder signature, a one-dimensional tensor of ``elements``."""
    return CollSig(
        group=group, seq=seq, op=op, elements=elements, dtype=dtype, shape=(elements,), state=state, age_s=age_s
    )


def steps(
    first: int, n: int, step_s: float = 0.1, data_s: float = 0.0, coll_s: float = 0.02, phase: str = "train"
) -> tuple[StepSample, ...]:
    """``n`` completed steps numbered ``first`` ... ``first + n - 1``."""
    return tuple(StepSample(step=first + i, step_s=step_s, data_s=data_s, coll_s=coll_s, phase=phase) for i in range(n))


def gpu_steps(
    first: int, n: int, step_s: float = 0.1, data_s: float = 0.0, coll_s: float = 0.02, lag_s: float = 0.0
) -> tuple[GpuStep, ...]:
    """``n`` steps the accelerator finished, split on its clock (RankState.recent_gpu)."""
    return tuple(GpuStep(first + i, step_s, data_s, coll_s, lag_s) for i in range(n))


def rank(
    r: int,
    *,
    world_size: int = 8,
    local_rank: int | None = None,
    pid: int | None = None,
    proc_start_us: int = 1_700_000_000_000_000,
    alive: bool = True,
    status: str = "running",
    step: int = 100,
    step_age_s: float = 0.05,
    heartbeat_age_s: float = 0.2,
    phase: str = "train",
    pg_state: str = "joined",
    in_data_wait: bool = False,
    data_wait_age_s: float = 0.0,
    collective: CollectiveState | None = None,
    last_step_s: float = 0.1,
    last_data_s: float = 0.0,
    last_coll_s: float = 0.02,
    recent_steps: Sequence[StepSample] = (),
    cpu_percent: float = 90.0,
    **extra: Any,
) -> RankState:
    """A healthy running rank, between collectives, unless told otherwise."""
    return RankState(
        rank=r,
        local_rank=r % 8 if local_rank is None else local_rank,
        world_size=world_size,
        pid=1000 + r if pid is None else pid,
        proc_start_us=proc_start_us,
        alive=alive,
        status=status,
        step=step,
        step_age_s=step_age_s,
        heartbeat_age_s=heartbeat_age_s,
        phase=phase,
        phase_age_s=extra.pop("phase_age_s", 10.0),
        pg_state=pg_state,
        pg_age_s=extra.pop("pg_age_s", 30.0),
        in_data_wait=in_data_wait,
        data_wait_age_s=data_wait_age_s,
        coll=collective if collective is not None else coll(seq=step, done_seq=step),
        last_step_s=last_step_s,
        last_data_s=last_data_s,
        last_coll_s=last_coll_s,
        cpu_percent=cpu_percent,
        recent_steps=tuple(recent_steps),
        **extra,
    )


def report(
    host: str,
    ranks: Iterable[RankState],
    *,
    job: str = "job",
    agent_id: str | None = None,
    seq: int = 1,
    interval_s: float = 1.0,
    sent_wall: float = 1_700_000_000.0,
) -> HostReport:
    return HostReport(
        job=job,
        host=host,
        agent_id=agent_id or f"agent-{host}",
        seq=seq,
        sent_wall=sent_wall,
        interval_s=interval_s,
        ranks=tuple(ranks),
    )


def finding(kind: str, ranks: Iterable[int], wants: Iterable[int] = (), **evidence: Any) -> Finding:
    """A finding as a detector opens it (no hosts, a placeholder reason): what the
    evidence plan and the service's collection read."""
    return Finding(
        kind=kind,
        ranks=tuple(ranks),
        hosts=(),
        reason="r",
        onset_mono=0.0,
        detected_mono=1.0,
        evidence=evidence,
        wants_stacks=tuple(wants),
    )


def lines(events: Iterable[Record]) -> list[tuple[str, dict[str, Any]]]:
    """Records as the journal writes them: (event, the line's fields after its stamps)."""
    return [(r.event, r.payload()) for r in events]


def with_lines(result: tuple[Any, Iterable[Record]]) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    """A ``(view or requests, records)`` result with its records as ``lines``."""
    return result[0], lines(result[1])


def host_of(r: int, ranks_per_host: int = 4) -> str:
    return f"host{r // ranks_per_host}"


def view(
    ranks: Iterable[RankState],
    now: float = 100.0,
    *,
    ranks_per_host: int = 4,
    job: str = "job",
    world_size: int = 0,
    base: ClusterView | None = None,
    cfg: DetectorConfig = DetectorConfig(),
    seq: int = 1,
    received: dict[str, float] | None = None,
) -> ClusterView:
    """Fold the given rank states, grouped into hosts of ``ranks_per_host``, into
    a view as if every host reported at ``now`` (or at ``received[host]``)."""
    v = base if base is not None else empty(job, world_size)
    by_host: dict[str, list[RankState]] = {}
    for s in ranks:
        by_host.setdefault(host_of(s.rank, ranks_per_host), []).append(s)
    for host, states in sorted(by_host.items()):
        at = (received or {}).get(host, now)
        v, _ = fold(v, report(host, states, job=job, seq=seq), at, cfg)
    return as_folded(v)


def as_folded(view: ClusterView) -> ClusterView:
    """``view`` as the coordinator's Folder gives it (the same view, with the columns
    the Folder keeps as it folds: typed arrays, bools as 0/1), so that what tests
    check is what the coordinator runs; the pure ``fold``'s views build theirs."""
    return Folder(view).snapshot()


def healthy(world_size: int = 8, **kw: Any) -> list[RankState]:
    return [rank(r, world_size=world_size, **kw) for r in range(world_size)]


def with_rank(states: list[RankState], r: int, **changes: Any) -> list[RankState]:
    """Copy of ``states`` with rank ``r`` changed (RankState fields)."""
    return [replace(s, **changes) if s.rank == r else s for s in states]


@dataclass
class _Step:
    k: int  # 0-based; "steps completed" is k while it runs
    start: float
    data: dict[int, float]
    enter: dict[int, float]  # when each rank enters the step's all-reduce (absent: never)
    end: float | None  # None: the step never completes (a hang)
    ckpt_s: float = 0.0  # checkpoint at the end of the step (inside the step time)

    @property
    def ended(self) -> float:
        """``end`` of a step the caller knows completed."""
        assert self.end is not None, f"step {self.k} never completes"
        return self.end


@dataclass
class SimJob:
    """A simulated synchronous data-parallel job, for detector tests without
    processes or sleeps: ranks step in lock-step (load data, compute, all-reduce);
    hosts report every ``report_interval``; faults are injected by step number;
    time is a number you advance.

        sim = SimJob(world_size=8, compute_s=0.1, jitter=0.1)
        sim.hang(rank=3, at_step=50)              # sleeps before the all-reduce
        coord_view = sim.run_until(30.0)          # a ClusterView at t=30 s
        findings = CollectiveHang(cfg).check(sim.now, coord_view)

    ``run_until(t, coordinator=c, tick_s=0.5)`` feeds a real ``Coordinator`` instead
    (accept + tick interleaved in time order), journal and metrics included.
    """

    world_size: int = 8
    ranks_per_host: int = 4
    compute_s: float = 0.1
    comm_s: float = 0.01
    data_s: float = 0.0
    jitter: float = 0.0  # +- fraction on each rank's compute, iid per step
    seed: int = 0
    report_interval: float = 1.0
    heartbeat_s: float = 0.5
    start: float = 0.0
    init_s: float = 2.0  # process-group init before step 0
    job: str = "job"
    checkpoint_every: int = 0
    checkpoint_s: float = 0.0
    agent_poll_s: float | None = 0.05  # the agent's poll period; None: it reports no gone_age_s
    coll_bytes: int = 0  # collective bytes per step, per rank
    # Fractions of each rank's compute spent in forward, backward, optimizer and
    # host-to-device copy (mon.watch_model's finer split); None: not measured.
    split: tuple[float, float, float, float] | None = None
    cfg: DetectorConfig = field(default_factory=DetectorConfig)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.factor: dict[int, float] = {}
        self.rank_data: dict[int, float] = {}
        self.stalls: dict[int, tuple[int, float, int, bool]] = {}  # rank -> (every, extra seconds, from step, on data)
        self.frame_of: dict[int, str] = {}  # rank -> where its stalls are, as its hook samples it
        self.gil: set[int] = set()  # ranks whose stalls hold the GIL: their heartbeat freezes meanwhile
        self.hang_frame: dict[int, str] = {}  # rank -> where it hangs
        self.pause: tuple[float, float] = (0.0, 0.0)  # (chance per rank and step, extra seconds)
        self.faults: dict[int, tuple[str, int]] = {}  # rank -> (kind, step)
        self.victims_die_after: float | None = None
        self.steps: list[_Step] = []
        self.now = self.start
        self.view: ClusterView = empty(self.job, 0)
        self._seq: dict[str, int] = {}
        self._last_report: dict[str, float] = {}
        self._pids = {r: 5000 + r for r in range(self.world_size)}
        self.hosts = sorted({host_of(r, self.ranks_per_host) for r in range(self.world_size)})

    # -- faults ------------------------------------------------------------------
    def slow(self, rank: int, factor: float) -> None:
        self.factor[rank] = factor

    def starve(self, rank: int, data_s: float) -> None:
        self.rank_data[rank] = data_s

    def stall(
        self,
        rank: int,
        every: int,
        extra_s: float,
        from_step: int = 0,
        on_data: bool = False,
        frame: str = "",
        gil: bool = False,
    ) -> None:
        """``extra_s`` more compute (``on_data``: data wait) on every ``every``-th step from
        ``from_step`` on (a periodic save, a GC pause; a shard opened from cold storage).
        ``frame``: where the rank is meanwhile, as its hook samples it (hook/frames.py);
        ``gil``: the stall's compute holds the GIL (its heartbeat is frozen meanwhile)."""
        self.stalls[rank] = (every, extra_s, from_step, on_data)
        if frame:
            self.frame_of[rank] = frame
        if gil:
            self.gil.add(rank)

    def pauses(self, chance: float, extra_s: float) -> None:
        """Every rank, on each step with probability ``chance``, computes ``extra_s`` longer (pauses all over the job)."""
        self.pause = (chance, extra_s)

    def hang(self, rank: int, at_step: int, frame: str = "") -> None:
        """Sleeps (GIL released, heartbeat fresh) just before the all-reduce of ``at_step``
        (``frame``: in that frame of the script, as its hook samples it)."""
        self.faults[rank] = ("hang", at_step)
        if frame:
            self.hang_frame[rank] = frame

    def freeze(self, rank: int, at_step: int) -> None:
        """Holds the GIL for good (its heartbeat frozen, the process running) just
        before the all-reduce of ``at_step``."""
        self.faults[rank] = ("freeze", at_step)

    def kill(self, rank: int, at_step: int, victims_die_after: float | None = None) -> None:
        """SIGKILL at the start of ``at_step``; optionally the others die this long after (gloo error)."""
        self.faults[rank] = ("kill", at_step)
        self.victims_die_after = victims_die_after

    def stop(self, rank: int, at_step: int) -> None:
        """SIGSTOP at the start of ``at_step``: alive, heartbeat stops."""
        self.faults[rank] = ("stop", at_step)

    def exit_early(self, rank: int, at_step: int) -> None:
        """A clean exit before ``at_step`` (uneven inputs): the others wait for it."""
        self.faults[rank] = ("exit", at_step)

    # -- the timeline --------------------------------------------------------------
    def _extend(self, t: float) -> None:
        while True:
            last = self.steps[-1] if self.steps else None
            if last is not None and (last.end is None or last.end > t):
                return
            start = last.ended if last else self.start + self.init_s
            k = last.k + 1 if last else 0
            data = {r: self.rank_data.get(r, self.data_s) for r in range(self.world_size)}
            enter = {}
            for r in range(self.world_size):
                c = self.compute_s * self.factor.get(r, 1.0) * (1 + self.rng.uniform(-self.jitter, self.jitter))
                every, extra, since, on_data = self.stalls.get(r, (0, 0.0, 0, False))
                if every and k >= since and k % every == 0:
                    if on_data:
                        data[r] += extra
                    else:
                        c += extra
                if self.pause[0] and self.rng.random() < self.pause[0]:
                    c += self.pause[1]
                if self.faults.get(r, ("", -1))[1] != k:
                    enter[r] = start + data[r] + c
            ckpt = self.checkpoint_s if self.checkpoint_every and (k + 1) % self.checkpoint_every == 0 else 0.0
            end = max(enter.values()) + self.comm_s + ckpt if len(enter) == self.world_size else None
            self.steps.append(_Step(k, start, data, enter, end, ckpt))

    def _split_of(self, compute_s: float) -> dict[str, float]:
        if self.split is None:
            return {}
        return {k: f * compute_s for k, f in zip(("forward_s", "backward_s", "optimizer_s", "h2d_s"), self.split)}

    def _fault_time(self, r: int) -> float | None:
        kind, at = self.faults.get(r, ("", -1))
        if not kind or at >= len(self.steps):
            return None
        return self.steps[at].start

    def rank_state(self, r: int, t: float, since: float) -> RankState:
        self._extend(t)
        kind, _ = self.faults.get(r, ("", -1))
        fault_t = self._fault_time(r)
        faulted = fault_t is not None and t >= fault_t
        victim_dead = (
            self.victims_die_after is not None
            and r not in self.faults
            and any(
                k == "kill" and (ft := self._fault_time(q)) is not None and t >= ft + self.victims_die_after
                for q, (k, _) in self.faults.items()
            )
        )
        frozen_at = fault_t if faulted and kind in ("kill", "stop", "exit") else None
        if victim_dead:
            q = next(q for q, (k, _) in self.faults.items() if k == "kill")
            killed_at = self._fault_time(q)
            assert killed_at is not None and self.victims_die_after is not None  # victim_dead says so
            frozen_at = killed_at + self.victims_die_after
        view_t = min(t, frozen_at) if frozen_at is not None else t  # a dead/stopped rank's slot stops changing
        cur = next((s for s in reversed(self.steps) if s.start <= view_t), None)
        if cur is None:  # still in init
            return rank(
                r,
                world_size=self.world_size,
                pid=self._pids[r],
                step=0,
                step_age_s=t - self.start,
                heartbeat_age_s=t % self.heartbeat_s,
                phase="init",
                pg_state="initializing",
                collective=coll(),
                last_step_s=0.0,
                last_coll_s=0.0,
            )
        k, seq_base = cur.k, cur.k  # one all-reduce per step: seq k+1 is step k's
        enter = cur.enter.get(r)
        in_data = view_t < cur.start + cur.data[r]
        phase, collective = "train", coll(seq=seq_base, done_seq=seq_base)
        if enter is not None and view_t >= enter:
            done = cur.end is not None and view_t >= cur.end - cur.ckpt_s
            if not done:
                collective = coll(seq=seq_base + 1, outstanding=1, since_s=t - enter)
            else:
                collective = coll(seq=seq_base + 1, done_seq=seq_base + 1)
                if cur.ckpt_s:
                    phase = "checkpoint"
                    if r != 0:  # the others wait in a barrier while rank 0 saves
                        collective = coll(
                            seq=seq_base + 2, outstanding=1, since_s=t - (cur.ended - cur.ckpt_s), op="barrier"
                        )
        hb_last = view_t - (view_t % self.heartbeat_s)
        prev = self.steps[k - 1] if k > 0 else None
        lo = bisect.bisect_right(self.steps, since, key=lambda s: s.end if s.end is not None else float("inf"))
        samples = tuple(
            StepSample(
                step=s.k + 1,
                step_s=s.ended - s.start,
                data_s=s.data[r],
                coll_s=s.ended - s.ckpt_s - s.enter[r] + s.ckpt_s * (r != 0),
                phase="train",
                coll_bytes=self.coll_bytes,
                **self._split_of(s.enter[r] - s.start - s.data[r]),
            )
            for s in itertools.takewhile(lambda s: s.end is not None and s.end <= view_t, self.steps[lo:])
        )
        where = self._frame(r, cur, view_t, t, prev)
        beat_s = t % self.heartbeat_s
        if (faulted and kind in ("stop", "kill", "exit")) or victim_dead:
            beat_s = t - hb_last
        elif (held := self._gil_since(r, cur, view_t, fault_t if faulted and kind == "freeze" else None)) is not None:
            beat_s, where = t - (held - held % self.heartbeat_s), ""
        dead = (faulted and kind in ("kill", "exit")) or victim_dead
        gone_age = 0.0
        if dead and self.agent_poll_s:
            seen = (int(view_t / self.agent_poll_s) + 1) * self.agent_poll_s  # the next poll after the death
            gone_age = max(0.0, t - seen)
        return rank(
            r,
            world_size=self.world_size,
            pid=self._pids[r],
            step=k,
            step_age_s=t - cur.start,
            heartbeat_age_s=beat_s,
            alive=not dead,
            status="exited" if faulted and kind == "exit" else "running",
            phase=phase,
            in_data_wait=in_data,
            data_wait_age_s=(t - cur.start) if in_data else 0.0,
            collective=collective,
            last_step_s=(prev.ended - prev.start) if prev else 0.0,
            last_data_s=prev.data[r] if prev else 0.0,
            last_coll_s=(prev.ended - prev.enter[r]) if prev else 0.0,
            cpu_percent=0.0 if faulted and kind == "stop" else 95.0,
            recent_steps=samples,
            gone_age_s=gone_age,
            proc_status="gone" if dead else ("stopped" if faulted and kind == "stop" else "running"),
            frame=where,
            frame_step=k + 1 if where else 0,
        )

    def _gil_since(self, r: int, cur: _Step, view_t: float, frozen_at: float | None) -> float | None:
        """When rank ``r``'s main thread took the GIL it still holds at ``view_t``
        (a ``freeze`` from ``frozen_at`` on, or a stall of a ``gil`` rank), or None."""
        if frozen_at is not None:
            return frozen_at
        every, _extra, since, on_data = self.stalls.get(r, (0, 0.0, 0, False))
        enter = cur.enter.get(r)
        if r not in self.gil or not every or on_data or cur.k < since or cur.k % every or enter is None:
            return None
        held = cur.start + cur.data[r]
        return held if held <= view_t < enter else None

    def _frame(self, r: int, cur: _Step, view_t: float, t: float, prev: _Step | None) -> str:
        """Rank ``r``'s frame as its hook samples it (frames.should_sample): in a step of
        its stalls (or its hang), out of the collective, run long enough."""
        enter = cur.enter.get(r)
        last = (prev.ended - prev.start) if prev else 0.0
        if (enter is not None and view_t >= enter) or cur.start + cur.data[r] > view_t or cur.k == 0:
            return ""
        if t - cur.start < max(0.25, 2 * last):
            return ""
        if self.faults.get(r) == ("hang", cur.k):
            return self.hang_frame.get(r, "")
        every, _extra, since, _on_data = self.stalls.get(r, (0, 0.0, 0, False))
        return self.frame_of.get(r, "") if every and cur.k >= since and cur.k % every == 0 else ""

    def report(self, host: str, t: float) -> HostReport:
        since = self._last_report.get(host, -1e18)
        ranks = [
            self.rank_state(r, t, since) for r in range(self.world_size) if host_of(r, self.ranks_per_host) == host
        ]
        self._last_report[host] = t
        self._seq[host] = self._seq.get(host, 0) + 1
        return report(host, ranks, job=self.job, seq=self._seq[host], interval_s=self.report_interval)

    # -- driving -------------------------------------------------------------------
    def _report_times(self, until: float) -> list[tuple[float, str]]:
        out = []
        n = len(self.hosts)
        for i, host in enumerate(self.hosts):
            offset = self.report_interval * (i + 0.5) / n  # hosts are not in phase
            last = self._last_report.get(host)
            j = 0 if last is None else round((last - self.start - offset) / self.report_interval) + 1
            while (at := self.start + offset + j * self.report_interval) <= until:
                out.append((at, host))
                j += 1
        return sorted(out)

    def run_until(
        self, until: float, coordinator: Any = None, tick_s: float | None = None, silent_hosts: tuple[str, ...] = ()
    ) -> ClusterView:
        """Advance to ``until``. With a coordinator, reports go to ``accept`` and
        ``tick`` runs every ``tick_s``; the returned view is the coordinator's."""
        events: list[tuple[float, int, str]] = [(at, 0, h) for at, h in self._report_times(until)]
        if coordinator is not None and tick_s:
            t = self.now + tick_s
            while t <= until:
                events.append((t, 1, ""))
                t += tick_s
        for at, kind, host in sorted(events):
            self.now = at
            if kind == 1:
                coordinator.tick(at, 1_700_000_000.0 + at)
            elif host in silent_hosts:
                self._last_report[host] = at  # the agent is gone: nothing arrives
            else:
                rep = self.report(host, at)
                if coordinator is not None:
                    coordinator.accept(rep, at)
                else:
                    self.view, _ = fold(self.view, rep, at, self.cfg)
        self.now = until
        return coordinator.view if coordinator is not None else as_folded(self.view)
