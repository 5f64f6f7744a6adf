"""The report's field table: what an agent tells the coordinator about once a
second, one line a field.

Each field of these dataclasses is a row of the table: its name, its type
(with its range: ``ranges.Count``, ``ranges.Seconds``...), its default (a field
with one may be left out by an older agent). The checks (``checks.py``), both
encodings (``v1.py``, ``rows.py``), the fast paths (``fast.py``, ``plain.py``)
and the typed reader (``typed.py``) are driven by these declarations through
``table.py``: a field of a kind that exists is one line here, nothing else.
``RankState`` holds the per-rank fields, ``HostReport`` the per-report ones.

Adding a per-rank field is one line in ``RankState`` (at its end, with a
default, so an older agent's reports still read): ``frame_step: Count = 0``; a
text of another length ``frame: Annotated[str, Range("text", max_length=44)] = ""``.
The wire forms follow (version 1 by name, version 2 by the field lists), and
so do the checks and the readers; a new kind of range needs its check in
``checks.py`` (and a nested field its parser).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from itertools import starmap
from typing import Any, cast

from .build import twin, twinned
from .ranges import (
    REPORT_VERSION,
    Count,
    Epoch,
    Finite,
    FrameText,
    Int64,
    NeverOrSeconds,
    Percent,
    Pid,
    RankNo,
    Seconds,
    Text32,
    WorldSize,
)


@twinned
@dataclass(frozen=True, slots=True)  # ~256 kept per rank: no dict each (step_samples)
class StepSample:
    step: Count  # the step number that completed
    step_s: Seconds
    data_s: Seconds
    coll_s: Seconds
    phase: str = "train"
    # Bytes of the collectives entered in the step, and the finer split of its
    # compute (mon.watch_model; h2d: wrap_loader(device=)): 0 = not measured.
    coll_bytes: Count = 0
    forward_s: Seconds = 0.0
    backward_s: Seconds = 0.0
    optimizer_s: Seconds = 0.0
    h2d_s: Seconds = 0.0

    @property
    def compute_s(self) -> float:
        return max(0.0, self.step_s - self.data_s - self.coll_s)


def step_sample(*values: Any) -> StepSample:
    """``StepSample(*values)``, built ~3.5x faster: a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__`` (~0.8 us a
    sample), a plain one stores each slot directly (~0.2 us), and a report of 8
    ranks brings ~34 samples. The result is a StepSample like any other: equal,
    hashed and frozen the same (tests/test_report_step_sample.py). For the schema
    paths, which have checked the values' types."""
    out = twin(StepSample)(*values)
    out.__class__ = StepSample
    return cast(StepSample, out)


def step_samples(rows: Iterable[tuple]) -> list[StepSample]:
    """``[step_sample(*values) for values in rows]``, the twins made in C (one
    ``starmap``): ~0.45 us a sample instead of ~1."""
    out = list(starmap(twin(StepSample), rows))
    for x in out:
        x.__class__ = StepSample
    return cast(list[StepSample], out)


@dataclass(frozen=True)
class GpuStep:
    """One step's split on the accelerator's clock (agent/slotfiles/gpusteps.py): step time
    between consecutive GPU step completions, collective wait from the GPU-side
    times of its collectives, data wait from the CPU side. ``lag_s``: how long
    after the CPU ended the step the GPU finished it (its queue's depth)."""

    step: Count
    step_s: Seconds
    data_s: Seconds
    coll_s: Seconds
    lag_s: Seconds = 0.0
    phase: Text32 = "train"

    @property
    def compute_s(self) -> float:
        return max(0.0, self.step_s - self.data_s - self.coll_s)

    def as_step_sample(self) -> StepSample:
        """The same figures where a detector reads a step (its clock said by whoever holds it)."""
        return StepSample(self.step, self.step_s, self.data_s, self.coll_s, self.phase)


GPU_FIELDS = ("step_s", "data_s", "coll_s", "lag_s")


@twinned
@dataclass(frozen=True, slots=True)  # one per rank per report: slots are built ~4x faster (``made``)
class CollectiveState:
    group: Int64 = 0  # wire.group_key of the process group (0 = default)
    seq: Count = 0  # last collective entered on that group (1-based; 0 = none yet)
    done_seq: Count = 0  # last completed
    op: str = "other"
    bytes: Count = 0
    outstanding: Count = 0
    since_s: Seconds = 0.0  # age of the last enter (meaningful while outstanding > 0)

    @property
    def in_progress(self) -> bool:
        return self.outstanding > 0


@dataclass(frozen=True)
class CollSig:
    """One collective as the rank's Flight Recorder recorded it (hook COLL_SIG
    record): what the coordinator compares across ranks at the same (group, seq)."""

    group: int  # wire.group_key
    seq: int  # FR's collective_seq_id on the group: counts collectives issued from C++ too
    op: str
    elements: int  # over all inputs
    dtype: str
    shape: tuple[int, ...] | None  # the first input's; None when it did not fit the slot
    inputs: int = 1
    state: str = "unknown"  # scheduled / started / completed (NCCL moves; gloo stays scheduled)
    age_s: float = 0.0  # since it was created, at send time (agent's reading of the stated clock)
    clock: str = "wall"  # the clock its times came from (wire.Clock)

    def describe(self) -> str:
        """'all_reduce of 6 float32 [6]' — the shape a person compares."""
        shape = f" {list(self.shape)}" if self.shape is not None and self.inputs == 1 else ""
        many = f" in {self.inputs} tensors" if self.inputs != 1 else ""
        return f"{self.op} of {self.elements} {self.dtype}{shape}{many}"


@twinned
@dataclass(frozen=True, slots=True)  # one per rank per report: 0.4 KB, not 1.6-2.3 with a dict; ``made``
class RankState:
    rank: RankNo
    local_rank: Count
    world_size: WorldSize
    pid: Pid
    proc_start_us: Count
    alive: bool  # the (pid, start time) process exists
    status: str  # hook status: starting / running / exited / disabled
    step: Count  # steps completed
    step_age_s: Seconds  # time since the step in progress started
    heartbeat_age_s: Seconds
    phase: str
    phase_age_s: Seconds
    pg_state: str  # none / initializing / joined / destroyed
    pg_age_s: Seconds
    in_data_wait: bool
    data_wait_age_s: Seconds
    coll: CollectiveState
    last_step_s: Seconds
    last_data_s: Seconds
    last_coll_s: Seconds
    hook_errors: Count = 0
    cpu_percent: Percent = 0.0
    rss_bytes: Count = 0
    torn: bool = False
    created_wall: Epoch = 0.0  # when the slot was created (epoch s)
    recent_steps: tuple[StepSample, ...] = ()  # steps completed since the last report
    # Seconds since the agent first saw the process gone (0 while alive or unknown).
    # Orders deaths finer than a report interval: when torchrun tears a group down
    # after the first death, the coordinator can still tell which came first.
    gone_age_s: Seconds = 0.0
    # The OS's view of the process: psutil status ("running", "sleeping", "stopped" for
    # SIGSTOP, "zombie"), or "gone" / "reused" (pid now belongs to another process).
    proc_status: str = ""
    # The rank's parent when the agent first saw it (under torchrun: the elastic
    # agent), so that abort can stop it; 0 = unknown.
    launcher_pid: Count = 0
    launcher_start_us: Count = 0
    # Checkpoint control (wire H_CTRL_*): the step the agent asked to checkpoint at
    # and what the hook acknowledged; 0 = none.
    ctrl_ack_seq: Count = 0
    ctrl_ack_step: Count = 0
    ctrl_ack_ok: bool = True
    # Training health (wire H_LOSS_*), when the script passes mon.step(loss=...):
    # the last loss (0.0 when it is not finite: JSON has no NaN), the step it
    # ended (0 = no loss reported), and the first step / count of NaN-or-inf losses.
    loss: Finite = 0.0
    loss_finite: bool = True
    loss_step: Count = 0
    loss_bad_step: Count = 0
    loss_bad_count: Count = 0
    # Where the time goes (wire H_TOTAL_COLL_BYTES, H_BATCH_PER_RANK): collective
    # bytes entered since the rank started, and its samples per step (0 = unknown).
    coll_bytes_total: Count = 0
    batch_per_rank: Count = 0
    # Collectives the rank's Flight Recorder saw since the last report, oldest first.
    recent_colls: tuple[CollSig, ...] = ()
    # The hook's last Flight Recorder read (wire H_FR_*): seconds since it began
    # (-1 = never read, or an older hook), and the newest (group, seq) it held.
    fr_read_age_s: NeverOrSeconds = -1.0
    fr_newest_group: Int64 = 0
    fr_newest_seq: Count = 0
    # Steps the accelerator finished since the last report, split on its clock
    # (GpuStep), oldest first; and that clock ("gpu"; "" while the rank has no
    # completion source: a CPU-only machine, gloo on CPU).
    recent_gpu: tuple[GpuStep, ...] = ()
    gpu_clock: Text32 = ""
    # Its step statistics as the agent computed them from the samples this
    # coordinator accepted (watchdog.contracts.stepsummary: the wire form); () when the agent
    # sends none (an older agent, or before a reply gave it the settings).
    step_summary: tuple[float, ...] = ()
    # Why the process ended, once it has (agent/processes/deathcause.py): exit_code, signal,
    # oom, exception {type, message, where, function, thread}, traceback, fatal,
    # and ``summary``, the line for a person. Empty while alive or when unknown;
    # already set while a crashing rank (hook status failed) is still shutting down.
    death: dict = field(default_factory=dict, compare=False)
    # Seconds per second its main thread lately ran on a CPU, and waited for one
    # (runnable, not running: the run queue), from the agent's /proc schedstat reads
    # over ~20 s. A noisy neighbour on its core or host shows as the wait. 0.0 = not
    # measured (yet, or no schedstat).
    oncpu_share: Seconds = 0.0
    runq_share: Seconds = 0.0
    # Where its main thread is in the script during the long step it is in (wire
    # P_FRAME_*: ``function (file.py:line)``, sampled by the hook), and that step
    # (steps completed + 1). "" and 0: none (a normal step, or an older hook).
    frame: FrameText = ""
    frame_step: Count = 0

    @property
    def last_compute_s(self) -> float:
        return max(0.0, self.last_step_s - self.last_data_s - self.last_coll_s)


@dataclass(frozen=True)
class HostReport:
    job: str
    host: str
    agent_id: str  # random per agent start; a new id means the agent restarted
    seq: int  # reports sent by this agent
    sent_wall: float  # agent wall clock at send (epoch s), for skew display
    interval_s: float
    ranks: tuple[RankState, ...]
    accelerators: tuple[dict, ...] = ()
    acks: tuple[dict, ...] = ()  # outcomes of commands (coordinator -> agent)
    # The coordinator settings its ranks' step summaries were computed under (as a
    # reply gave them: stepsummary.CONFIG_FIELDS); () when they carry none.
    step_summary_config: tuple[int, ...] = ()
    v: int = REPORT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: Any, dropped: list[tuple[int, Any, str]] | None = None) -> HostReport:
        """The report of a version-1 or version-2 body as JSON decoded it; a
        ReportError naming the field where it cannot be accepted. ``dropped``:
        when given, a rank entry that cannot be accepted is left out and noted
        there as (index, its "rank" field as sent, why) instead of failing the
        whole report: one bad rank must not make its host look lost."""
        from .reader import host_report  # the reader builds HostReports: imported when first needed

        return host_report(obj, dropped)
