"""What a timeline shows, independent of how it is rendered (text, HTML, Perfetto).

Every time here is wall-clock seconds since the epoch: slot times (a host's
CLOCK_MONOTONIC) are mapped through each slot's own (created_wall, created_mono)
pair when the model is built, so renderers never see a monotonic clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from watchdog.contracts.finding import ADVISORY_KINDS
from watchdog.contracts.journal.record import Record


@dataclass(frozen=True)
class StepSpan:
    """One completed step from a STEP_END record. Only the durations inside a
    step are recorded, not their order."""

    step: int
    start: float
    end: float
    data_s: float
    coll_s: float
    n_coll: int
    last_seq: int  # sequence number of the step's last collective (0: none yet)
    phase: str

    @property
    def compute_s(self) -> float:
        return max(0.0, (self.end - self.start) - self.data_s - self.coll_s)

    @property
    def seqs(self) -> range:
        """The collective sequence numbers completed in this step."""
        return range(self.last_seq - self.n_coll + 1, self.last_seq + 1) if self.n_coll > 0 else range(0)


@dataclass(frozen=True)
class Span:
    """Something with a start and (maybe) an end: a phase, or the activity a
    rank was in when its slot was read (``open``: still in it then)."""

    kind: str  # phase name, or "data" / "collective" / "code" for the in-flight activity
    start: float
    end: float
    label: str
    open: bool = False
    seq: int = 0  # collective sequence number for kind "collective"


@dataclass(frozen=True)
class Mark:
    """A point on one rank's lane: PG state change, control ack, hook error, heartbeat."""

    t: float
    kind: str  # "pg" / "control" / "error" / "heartbeat" / "phase"
    label: str


@dataclass(frozen=True)
class RankNow:
    """Where a rank was at ``t``: from its slot header when slot evidence exists,
    else from what the coordinator journaled about it (``source``)."""

    t: float | None
    source: str  # "slot" | "coordinator"
    step: int | None = None
    phase: str = ""
    where: str = ""  # a phrase for a person: "in ddp_all_reduce #31 on the default group for 8.2 s at step 30"
    brief: str = ""  # the same for a table cell: "in ddp_all_reduce #31 for 8.2 s"
    activity: str = ""  # "collective" | "data" | "code" | "init" | "exited" | "gone" | ""
    coll_op: str = ""
    coll_group: int = 0
    coll_seq: int | None = None  # last collective entered
    coll_done_seq: int | None = None
    coll_outstanding: int = 0
    heartbeat_age_s: float | None = None
    alive: bool | None = None
    status: str = ""


@dataclass(frozen=True)
class Stack:
    rank: int
    host: str
    pid: int
    ok: bool
    text: str
    error: str
    method: str
    taken_wall: float

    def main_thread(self) -> str:
        """The block of the thread named MainThread (py-spy prints one block per
        thread): the training loop is there; heartbeat and gloo threads are noise."""
        blocks: list[list[str]] = []
        cur: list[str] = []
        for line in self.text.splitlines():
            if line.startswith("Thread ") and cur:
                blocks.append(cur)
                cur = []
            if line.startswith("Thread ") or cur:
                cur.append(line)
        if cur:
            blocks.append(cur)
        for b in blocks:
            if '"MainThread"' in b[0]:
                return "\n".join(b)
        return "\n".join(blocks[0]) if blocks else self.text


def brief(now: RankNow | None) -> str:
    return "?" if now is None else (now.brief or now.where)


@dataclass
class Lane:
    rank: int
    host: str = ""
    pid: int = 0
    steps: list[StepSpan] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)  # phases, and the in-flight activity at the end
    marks: list[Mark] = field(default_factory=list)
    now: RankNow | None = None
    stacks: list[Stack] = field(default_factory=list)
    torn: bool = False  # header read while the writer was mid-update
    incarnations: int = 1  # pids seen for this rank in this section

    @property
    def last_step(self) -> StepSpan | None:
        return self.steps[-1] if self.steps else None


@dataclass(frozen=True)
class Event:
    """A journal event drawn as a marker across all lanes."""

    t: float
    kind: str  # "finding" | "resolved" | "action" | "command" | "evidence" | "host_lost" | "rank_restarted" | ...
    label: str
    ranks: tuple[int, ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClockNote:
    host: str
    offset_s: float  # agent wall clock minus coordinator wall clock, upper bound (includes report delay)
    slot_drift_s: float  # largest |slot mapping - agent wall| when read: wall clock stepped since slot creation
    agree: bool


@dataclass
class StackSet:
    """Every rank's stack for one trigger (a hang's evidence, an abort), grouped
    (``watchdog.stackgroups``): which ranks are where."""

    trigger: dict[str, Any]
    label: str  # "collective_hang rank 2", "abort a-1 (collective_hang rank 2)"
    taken: float  # when the first of its stacks was taken (wall)
    grouping: Any  # stackgroups.Grouping
    culprits: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list)  # what is missing: late ranks, silent hosts, the per-host cap
    source: str = "evidence"  # "evidence" (regrouped from the stacks) | "record" (the coordinator's stack_groups)


@dataclass
class Section:
    """One coordinator session or one worker-group restart."""

    index: int
    start: float
    end: float
    opened_by: str  # "start" (coordinator started) | "restart" (ranks restarted) | "journal"
    job: str = ""
    world_size: int = 0
    findings: list[dict] = field(default_factory=list)  # journal records, in order
    events: list[Event] = field(default_factory=list)
    actions: list[Record] = field(default_factory=list)  # journal "action" / "command" records
    lanes: dict[int, Lane] = field(default_factory=dict)
    evidence_events: int = 0
    clocks: list[ClockNote] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stop: dict | None = None
    stack_sets: list[StackSet] = field(default_factory=list)  # every rank's stack, grouped, per trigger
    verdicts: list[dict] = field(default_factory=list)  # journal "verdict" records: the bottleneck as it changed
    goodput: dict | None = None  # the section's last "goodput" record (the final one at a clean stop)

    @property
    def root(self) -> dict | None:
        """The root cause: the finding with the earliest onset (detection order on ties)."""
        faults = [f for f in self.findings if f.get("kind") not in ADVISORY_KINDS]  # advice is never the root cause
        if not faults:
            return None
        return min(enumerate(faults), key=lambda p: (_onset(p[1]), p[0]))[1]

    @property
    def has_slots(self) -> bool:
        return any(lane.now is not None and lane.now.source == "slot" for lane in self.lanes.values())

    def culprits(self) -> tuple[int, ...]:
        root = self.root
        return tuple(root.get("ranks") or ()) if root else ()

    def waiter(self) -> int | None:
        """A rank that was waiting on the culprits (for the second stack)."""
        culprits = set(self.culprits())
        lanes = [lane for r, lane in sorted(self.lanes.items()) if r not in culprits]
        for lane in lanes:
            if lane.now and lane.now.activity == "collective":
                return lane.rank
        root = self.root or {}
        for r in (root.get("evidence") or {}).get("waiters") or ():
            if r not in culprits:
                return int(r)
        return None  # nobody known to wait (a straggler, a crash): no second stack to show


def _onset(finding: dict) -> float:
    for key in ("onset_wall", "detected_wall", "t_wall"):
        v = finding.get(key)
        if isinstance(v, (int, float)) and v > 0:
            return float(v)
    return float("inf")


@dataclass
class Timeline:
    path: str
    sections: list[Section]
    skipped_lines: int = 0  # lines that did not parse (a kill mid-write tears the last one)
