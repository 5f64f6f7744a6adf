"""One rank on this host as the agent last read it: the immutable value the slot
tracker hands out (``SlotTracker.views``) to the exporter, the report builder and
the command handlers."""

from __future__ import annotations

from dataclasses import dataclass, field

from watchdog.agent.processes.table import ProcSample
from watchdog.contracts import slot as wire
from watchdog.report import GpuStep


@dataclass(frozen=True)
class LocalRank:
    """One rank on this host as the agent last read it: its decoded slot and its
    process. What the exporter and the report builder see; immutable. (The
    coordinator's cluster-side record of a rank is ``coordinator.view.FoldedRank``.)"""

    path: str
    header: wire.SlotHeader  # last good (consistent) header
    heartbeat_ns: int  # from the latest read, torn or not
    torn: bool
    proc: ProcSample
    state: str  # slot_states.ALIVE / DEAD / EXITED
    cpu_percent: float
    step_records: tuple[wire.Record, ...]  # STEP_END records, oldest first, at most MAX_STEPS_PER_RANK
    # (pid, start us) of the rank's parent when first seen: under torchrun the
    # elastic agent, which abort must stop (or it restarts the workers). (0, 0) = unknown.
    launcher: tuple[int, int] = (0, 0)
    # The rank's pid in this agent's pid namespace when it differs from the one it
    # recorded (a hostPID agent, a training pod without hostPID); 0 = the same.
    host_pid: int = 0
    # The file as validated at first sight: a control write goes only to this very
    # file (wire.write_control's ``expect``). -1 / 0 = unknown (tests, fakes).
    uid: int = -1
    inode: int = 0
    # Why it died (deathcause.explain), once dead; empty while alive or unknown.
    death: dict = field(default_factory=dict)
    # COLL_SIG records (the hook's Flight Recorder reads), oldest first, at most MAX_COLLS_PER_RANK:
    # from the step ring of a version-1 slot (older hooks), numbered with the step records.
    coll_records: tuple[wire.Record, ...] = ()
    # The same from the event ring of a version-2 slot, numbered on their own (wire.read_slot's events_since).
    event_colls: tuple[wire.Record, ...] = ()
    # Steps split on the accelerator's clock (agent/slotfiles/gpusteps.py), each with the event-ring
    # index of the completion that ended it, oldest first, at most MAX_STEPS_PER_RANK.
    gpu_steps: tuple[tuple[int, GpuStep], ...] = ()
    gpu_clock: str = ""  # "gpu" once the rank's completion source reported a step; "" never
    gpu_totals_ns: tuple[int, int, int] = (0, 0, 0)  # step, data, collective ns over those steps
    speaks: bool = True  # the slot that speaks for its (job, rank) (slot_states.speakers); False: superseded
    # Seconds per second its main thread lately ran on a CPU, and waited for one (slot_states.runq_shares).
    oncpu_share: float = 0.0
    runq_share: float = 0.0

    @property
    def identity(self) -> wire.Identity:
        return self.header.identity

    @property
    def pid_here(self) -> int:
        """The pid to signal, dump or match against NVML's process list on this host."""
        return self.host_pid or self.header.identity.pid
