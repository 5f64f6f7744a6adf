"""Simulated hosts for the scale benchmark: what N agents would send, as plain
report dicts in the real wire format (``watchdog.report``), computed from the
wall clock so several generator processes agree on one job without talking.

The job is synchronous data parallel: step k starts at ``t0 + k * wall_s`` on
every rank; each rank loads data, computes for ``compute_s x factor x (1 +-
jitter)`` (deterministic per rank and step), then waits in all-reduce #k+1 until
the step ends. A straggler has ``factor > 1`` (the step wall time covers the
slowest rank, as in real synchronous training). A frozen rank stops at
``freeze_at``: its heartbeat goes stale and it never enters the next all-reduce,
so every other rank waits in it: a collective hang whose culprit is that rank.
A suspended job (``suspend_at``: a scheduler's SIGSTOP to every rank) stops
where it is: no rank's heartbeat, step or collective moves after that instant.

A host sends version-1 reports (an object per rank) or, with ``version = 2``,
the same content as rows under field lists (``watchdog.report.as_rows``), as an
agent does once the coordinator's reply said it reads them. Once a reply gave the
step-summary settings (``"step_summary_config"``), each rank also carries its step
statistics, computed by the agent's own code (``watchdog.agent.reporting.stepsummaries``)
from the samples the coordinator accepted, as an agent does; ``summaries=False``
sends none (an older agent's reports).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from watchdog.agent.reporting.sender import advised_steps, first_batch_mark, reads_rows, steps_due_by_time
from watchdog.agent.reporting.stepsummaries import StepSummaries
from watchdog.report import ROWS_VERSION, StepSample, as_rows

RANKS_PER_HOST = 8
HEARTBEAT_S = 0.5


@dataclass(frozen=True)
class Job:
    world_size: int
    t0: float  # wall clock of step 0's start
    compute_s: float = 0.2
    data_s: float = 0.005
    comm_s: float = 0.02
    jitter: float = 0.05
    straggler: int = -1  # rank computing ``straggler_factor`` x slower from step 0
    straggler_factor: float = 1.1
    frozen: int = -1  # rank frozen at wall time ``freeze_at``
    freeze_at: float = float("inf")
    suspend_at: float = float("inf")  # every rank stopped at this wall time
    job: str = "scale"

    @property
    def wall_s(self) -> float:
        """Step wall time: the slowest rank's compute plus data and all-reduce."""
        slow = self.straggler_factor if self.straggler >= 0 else 1.0
        return self.data_s + self.compute_s * slow * (1 + self.jitter) + self.comm_s

    def factor(self, r: int) -> float:
        return self.straggler_factor if r == self.straggler else 1.0

    def compute(self, r: int, k: int) -> float:
        u = ((r * 2654435761 + k * 40503) & 0xFFFF) / 32768.0 - 1.0  # cheap deterministic jitter in [-1, 1)
        return self.compute_s * self.factor(r) * (1 + self.jitter * u)

    def loss(self, r: int, k: int) -> float:
        """The training loss rank ``r`` reports after step ``k`` (as a script passing
        ``mon.step(loss=...)``, or the Lightning / Hugging Face callbacks, does): falling, noisy."""
        u = ((r * 40503 + k * 2654435761) & 0xFFFF) / 32768.0 - 1.0
        return 2.0 + 8.0 / (1 + k / 50) + 0.05 * u

    def freeze_step(self) -> int:
        return int((self.freeze_at - self.t0) // self.wall_s)


class Host:
    """One simulated agent: its ranks, its report sequence, and the steps it has
    already reported (a report carries the steps completed since the last one)."""

    def __init__(self, job: Job, index: int, agent_id: str, summaries: bool = True, wanted: int = ROWS_VERSION) -> None:
        self.job, self.name, self.agent_id = job, f"sim{index:05d}", agent_id
        first = index * RANKS_PER_HOST
        self.ranks = list(range(first, min(first + RANKS_PER_HOST, job.world_size)))
        self.seq = 0
        self.reported = dict.fromkeys(self.ranks, 0)  # rank -> steps completed already reported
        self.created = job.t0 - 5.0
        self.version = 1  # the report version sent; ``wanted`` once the coordinator said it reads rows
        self.wanted = wanted
        self.summaries, self.summarise = StepSummaries(), summaries
        # The reply's "steps_interval_s", as the agent follows it (agent.sender): step samples
        # that often, liveness in every report; when samples were last delivered.
        self.steps_interval_s, self.steps_sent_at = 0.0, None
        self.bare = False  # the last report made carries no step samples
        self.interval_s = 1.0  # as the last report was made with
        # Where within the interval its first batch goes (the agent's rand()): hosts not in step.
        self.steps_phase = ((index * 2654435761) & 0xFFFF) / 65536.0

    def report(self, now: float, interval_s: float) -> dict:
        self.interval_s = interval_s
        self.bare = not steps_due_by_time(self.steps_interval_s, interval_s, self.steps_sent_at, now)
        self.seq += 1
        body = {
            "v": 1,
            "job": self.job.job,
            "host": self.name,
            "agent_id": self.agent_id,
            "seq": self.seq,
            "sent_wall": now,
            "interval_s": interval_s,
            "ranks": [self._rank(r, now) for r in self.ranks],
        }
        if self.summaries.config:
            self._summarise(body)
        return as_rows(body) if self.version == ROWS_VERSION else body

    def _summarise(self, body: dict) -> None:
        """Each rank's step summary, by the agent's code (``StepSummaries``) on the
        agent's objects (StepSamples): the costly part of a simulated host, ~40 us a
        rank, in the generator's processes, not the coordinator's."""
        self.summaries.begin()
        for rank in body["ranks"]:
            samples = tuple(StepSample(**x) for x in rank["recent_steps"])
            summary = self.summaries.summary((body["job"], rank["rank"], rank["pid"], rank["proc_start_us"]), samples)
            rank["step_summary"] = list(summary)  # [] where none: every rank has the field, as v2 wants
        body["step_summary_config"] = list(self.summaries.config)

    def delivered(self, report: dict, reply: Any = None) -> None:
        """The coordinator accepted ``report`` with ``reply``: its steps are not sent again."""
        self.summaries.accepted(self.job.job, reply if self.summarise else None)  # no settings: none sent
        # Version negotiation, as the agent does: rows once a reply says they are read.
        self.version = (
            ROWS_VERSION if self.wanted == ROWS_VERSION and isinstance(reply, dict) and reads_rows(reply) else 1
        )
        every = advised_steps(reply) if isinstance(reply, dict) else 0.0
        first_advice, self.steps_interval_s = every and not self.steps_interval_s, every
        if self.bare:
            return  # its ranks' steps go in a later report
        self.steps_sent_at = report["sent_wall"]
        if first_advice:  # the first batch due steps_phase * every from now, as agent.sender's
            self.steps_sent_at = first_batch_mark(report["sent_wall"], every, self.interval_s, self.steps_phase)
        if report["v"] == ROWS_VERSION:
            at_rank, at_step = report["rank_fields"].index("rank"), report["rank_fields"].index("step")
            for row in report["ranks"]:
                self.reported[row[at_rank]] = row[at_step]
            return
        for rs in report["ranks"]:
            self.reported[rs["rank"]] = rs["step"]

    def _rank(self, r: int, now: float) -> dict:
        j = self.job
        now = max(now, j.t0)  # agents start up to a second before step 0: nothing to report yet but ages
        at = min(now, j.suspend_at)  # where the ranks are: a suspended job's stay where the suspend found them
        suspended = now > j.suspend_at
        alone = r == j.frozen and now >= j.freeze_at  # this rank frozen, the others waiting for it
        frozen = alone or suspended
        hang = j.frozen >= 0 and now >= j.freeze_at
        w = j.wall_s
        k = int((at - j.t0) // w) if not hang else j.freeze_step()
        start = j.t0 + k * w
        enter = start + j.data_s + j.compute(r, k)
        # Since the last beat: the beat's phase as of ``at``, plus the time stopped since.
        hb = now - j.freeze_at if alone else (at - j.t0 + r * 0.013) % HEARTBEAT_S + now - at
        in_coll = at >= enter and not alone
        since = max(0.0, now - enter) if in_coll else 0.0
        done = self.reported[r]
        first = k if self.bare else max(done, k - 64)  # a bare report: its samples wait
        steps = [
            {
                "step": x,
                "step_s": w,
                "data_s": j.data_s,
                "coll_s": max(0.0, w - j.data_s - j.compute(r, x)),
                "phase": "train",
            }
            for x in range(first, k)
        ]
        last_c = j.compute(r, k - 1) if k else 0.0
        return {
            "rank": r,
            "local_rank": r % RANKS_PER_HOST,
            "world_size": j.world_size,
            "pid": 10000 + r,
            "proc_start_us": 1_700_000_000_000_000 + r,
            "alive": True,
            "status": "running",
            "step": k,
            "step_age_s": max(0.0, now - start),
            "heartbeat_age_s": hb,
            "phase": "train",
            "phase_age_s": now - j.t0,
            "pg_state": "joined",
            "pg_age_s": now - j.t0,
            "in_data_wait": False,
            "data_wait_age_s": 0.0,
            "coll": {
                "group": 0,
                "seq": k + 1 if in_coll else k,
                "done_seq": k,
                "op": "all_reduce",
                "bytes": 104857600,
                "outstanding": 1 if in_coll else 0,
                "since_s": since,
            },
            "last_step_s": w if k else 0.0,
            "last_data_s": j.data_s if k else 0.0,
            "last_coll_s": max(0.0, w - j.data_s - last_c) if k else 0.0,
            "hook_errors": 0,
            "cpu_percent": 3.0 if frozen else 98.0,
            "rss_bytes": 4 << 30,
            "torn": False,
            "created_wall": self.created,
            "recent_steps": steps,
            "gone_age_s": 0.0,
            "proc_status": "stopped" if suspended else "sleeping" if frozen else "running",
            "launcher_pid": 9000 + r // RANKS_PER_HOST,
            "launcher_start_us": 1_700_000_000_000_000,
            "ctrl_ack_seq": 0,
            "ctrl_ack_step": 0,
            "loss": j.loss(r, k - 1) if k else 0.0,
            "loss_step": k,
            "ctrl_ack_ok": True,
        }
