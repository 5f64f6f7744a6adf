"""The per-host report: what an agent tells the coordinator about once a second.

The agent builds it from its slot snapshots (``watchdog.agent.report.build_report``);
the coordinator validates it with ``HostReport.from_dict`` and folds it into its
cluster view. Ages are computed by the agent against its own monotonic clock at
send time (monotonic clocks are not comparable across hosts); the coordinator adds
the time since it received the report.

JSON over HTTP, one object, ``"v": REPORT_VERSION``. Unknown keys are ignored (a
newer agent can add fields); missing or mistyped required keys are a ReportError
with a message naming the field.

Version 2 (``"v": 2``, ``as_rows``) is the same content with each rank, its
collective and each step sample as a JSON array under a field list sent once
per report (``rank_fields``, ``coll_fields``, ``step_fields``): JSON decoding
then builds lists, not one dict per rank and per step (half the bytes, ~0.6x
the decode time), and the schema reads values by position. It decodes to
exactly the ``HostReport`` of the version-1 body. An agent sends it only once
a coordinator's reply listed 2 in ``"report_versions"`` (``REPORT_VERSIONS``);
the coordinator reads both.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import MISSING, asdict, dataclass, field, fields, make_dataclass
from itertools import chain, islice, repeat, starmap
from operator import add, attrgetter, itemgetter, lt
from typing import Any, TypeVar, cast

from . import stepsummary
from .wire import FRAME_TEXT_BYTES as FRAME_TEXT
from .wire import Phase

REPORT_VERSION = 1  # HostReport.to_dict()'s form: an object per rank and per step
ROWS_VERSION = 2  # the same content as arrays under field lists (as_rows)
REPORT_VERSIONS = (REPORT_VERSION, ROWS_VERSION)  # what this coordinator reads; its replies say so
MAX_FIELDS = 128  # names in one version-2 field list
MAX_FIELD_NAME = 64
MAX_RANKS_PER_REPORT = 4096
MAX_STEPS_PER_RANK = 256
MAX_COLLS_PER_RANK = 32  # collective signatures (Flight Recorder) per rank per report
MAX_ACKS_PER_REPORT = 256  # acks beyond this are dropped (counted), not journaled one by one
MAX_WORLD_SIZE = 1 << 20  # every per-rank structure is sized by it
MAX_COUNT = 1 << 62  # steps, sequence numbers, bytes, pids, start times: int64 words, never negative
MAX_SECONDS = 1e9  # ages and durations (31 years)
MIN_INTERVAL_S = 0.05  # a report interval below this would make every "k intervals" deadline meaningless
MAX_INTERVAL_S = 3600.0


_T = TypeVar("_T")


class ReportError(ValueError):
    """A report that cannot be accepted; str() is the message sent back (4xx)."""


@dataclass(frozen=True, slots=True)  # ~256 kept per rank: no dict each (see _step_of)
class StepSample:
    step: int  # the step number that completed
    step_s: float
    data_s: float
    coll_s: float
    phase: str = "train"
    # Bytes of the collectives entered in the step, and the finer split of its
    # compute (mon.watch_model; h2d: wrap_loader(device=)): 0 = not measured.
    coll_bytes: int = 0
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    h2d_s: float = 0.0

    @property
    def compute_s(self) -> float:
        return max(0.0, self.step_s - self.data_s - self.coll_s)


def _unfrozen_twin(cls: type) -> type:
    """A plain (mutable) slots dataclass with the fields of the frozen slots
    dataclass ``cls``, in the same order: the same instance layout, so an
    instance of it may become a ``cls`` by ``__class__`` assignment."""
    spec = [(f.name, f.type, field(default=f.default, default_factory=f.default_factory)) for f in fields(cls)]
    twin = make_dataclass(f"_{cls.__name__}Unfrozen", spec, slots=True, eq=False, repr=False)
    assert twin.__dict__["__slots__"] == cls.__dict__["__slots__"], (twin, cls)
    return twin


_TWINS: dict[type, type] = {}


def twinned(cls: type[_T]) -> type[_T]:
    """Class decorator: ``cls`` (a frozen slots dataclass) gets its unfrozen twin
    now, for ``made``. At import, not at the first report: a slots dataclass
    leaves the class it first built as cyclic garbage, and one made after the
    daemon froze its heap stayed for the periodic full collection to find (the
    only unreachable objects it found in a real coordinator under load)."""
    _TWINS[cls] = _unfrozen_twin(cls)
    return cls


def made(cls: type[_T], *values: Any) -> _T:
    """``cls(*values)`` for a frozen slots dataclass with every field given, in
    order, built ~4x faster: a frozen dataclass's ``__init__`` sets each field
    through ``object.__setattr__``; its unfrozen twin stores each slot directly,
    then the instance becomes a ``cls`` (the same layout). The result is a
    ``cls`` like any other: equal, hashed and frozen the same. For values already
    checked, of ``twinned`` classes without a ``__post_init__``, that the
    coordinator builds per rank per report (RankState, FoldedRank, StepStats)."""
    out = _TWINS[cls](*values)
    out.__class__ = cls
    return cast(_T, out)


_StepSampleUnfrozen = _unfrozen_twin(StepSample)


def step_sample(*values: Any) -> StepSample:
    """``StepSample(*values)``, built ~3.5x faster: a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__`` (~0.8 us a
    sample), a plain one stores each slot directly (~0.2 us), and a report of 8
    ranks brings ~34 samples. The result is a StepSample like any other: equal,
    hashed and frozen the same (tests/test_report_step_sample.py). For the schema
    paths, which have checked the values' types."""
    out = _StepSampleUnfrozen(*values)
    out.__class__ = StepSample
    return cast(StepSample, out)


def step_samples(rows: Iterable[tuple]) -> list[StepSample]:
    """``[step_sample(*values) for values in rows]``, the twins made in C (one
    ``starmap``): ~0.45 us a sample instead of ~1."""
    out = list(starmap(_StepSampleUnfrozen, rows))
    for x in out:
        x.__class__ = StepSample
    return cast(list[StepSample], out)


@dataclass(frozen=True)
class GpuStep:
    """One step's split on the accelerator's clock (agent/gpusteps.py): step time
    between consecutive GPU step completions, collective wait from the GPU-side
    times of its collectives, data wait from the CPU side. ``lag_s``: how long
    after the CPU ended the step the GPU finished it (its queue's depth)."""

    step: int
    step_s: float
    data_s: float
    coll_s: float
    lag_s: float = 0.0
    phase: str = "train"

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
    group: int = 0  # wire.group_key of the process group (0 = default)
    seq: int = 0  # last collective entered on that group (1-based; 0 = none yet)
    done_seq: int = 0  # last completed
    op: str = "other"
    bytes: int = 0
    outstanding: int = 0
    since_s: float = 0.0  # age of the last enter (meaningful while outstanding > 0)

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
    rank: int
    local_rank: int
    world_size: int
    pid: int
    proc_start_us: int
    alive: bool  # the (pid, start time) process exists
    status: str  # hook status: starting / running / exited / disabled
    step: int  # steps completed
    step_age_s: float  # time since the step in progress started
    heartbeat_age_s: float
    phase: str
    phase_age_s: float
    pg_state: str  # none / initializing / joined / destroyed
    pg_age_s: float
    in_data_wait: bool
    data_wait_age_s: float
    coll: CollectiveState
    last_step_s: float
    last_data_s: float
    last_coll_s: float
    hook_errors: int = 0
    cpu_percent: float = 0.0
    rss_bytes: int = 0
    torn: bool = False
    created_wall: float = 0.0  # when the slot was created (epoch s)
    recent_steps: tuple[StepSample, ...] = ()  # steps completed since the last report
    # Seconds since the agent first saw the process gone (0 while alive or unknown).
    # Orders deaths finer than a report interval: when torchrun tears a group down
    # after the first death, the coordinator can still tell which came first.
    gone_age_s: float = 0.0
    # The OS's view of the process: psutil status ("running", "sleeping", "stopped" for
    # SIGSTOP, "zombie"), or "gone" / "reused" (pid now belongs to another process).
    proc_status: str = ""
    # The rank's parent when the agent first saw it (under torchrun: the elastic
    # agent), so that abort can stop it; 0 = unknown.
    launcher_pid: int = 0
    launcher_start_us: int = 0
    # Checkpoint control (wire H_CTRL_*): the step the agent asked to checkpoint at
    # and what the hook acknowledged; 0 = none.
    ctrl_ack_seq: int = 0
    ctrl_ack_step: int = 0
    ctrl_ack_ok: bool = True
    # Training health (wire H_LOSS_*), when the script passes mon.step(loss=...):
    # the last loss (0.0 when it is not finite: JSON has no NaN), the step it
    # ended (0 = no loss reported), and the first step / count of NaN-or-inf losses.
    loss: float = 0.0
    loss_finite: bool = True
    loss_step: int = 0
    loss_bad_step: int = 0
    loss_bad_count: int = 0
    # Where the time goes (wire H_TOTAL_COLL_BYTES, H_BATCH_PER_RANK): collective
    # bytes entered since the rank started, and its samples per step (0 = unknown).
    coll_bytes_total: int = 0
    batch_per_rank: int = 0
    # Collectives the rank's Flight Recorder saw since the last report, oldest first.
    recent_colls: tuple[CollSig, ...] = ()
    # The hook's last Flight Recorder read (wire H_FR_*): seconds since it began
    # (-1 = never read, or an older hook), and the newest (group, seq) it held.
    fr_read_age_s: float = -1.0
    fr_newest_group: int = 0
    fr_newest_seq: int = 0
    # Steps the accelerator finished since the last report, split on its clock
    # (GpuStep), oldest first; and that clock ("gpu"; "" while the rank has no
    # completion source: a CPU-only machine, gloo on CPU).
    recent_gpu: tuple[GpuStep, ...] = ()
    gpu_clock: str = ""
    # Its step statistics as the agent computed them from the samples this
    # coordinator accepted (watchdog.stepsummary: the wire form); () when the agent
    # sends none (an older agent, or before a reply gave it the settings).
    step_summary: tuple[float, ...] = ()
    # Why the process ended, once it has (agent/deathcause.py): exit_code, signal,
    # oom, exception {type, message, where, function, thread}, traceback, fatal,
    # and ``summary``, the line for a person. Empty while alive or when unknown;
    # already set while a crashing rank (hook status failed) is still shutting down.
    death: dict = field(default_factory=dict, compare=False)
    # Seconds per second its main thread lately ran on a CPU, and waited for one
    # (runnable, not running: the run queue), from the agent's /proc schedstat reads
    # over ~20 s. A noisy neighbour on its core or host shows as the wait. 0.0 = not
    # measured (yet, or no schedstat).
    oncpu_share: float = 0.0
    runq_share: float = 0.0
    # Where its main thread is in the script during the long step it is in (wire
    # P_FRAME_*: ``function (file.py:line)``, sampled by the hook), and that step
    # (steps completed + 1). "" and 0: none (a normal step, or an older hook).
    frame: str = ""
    frame_step: int = 0

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
        """``dropped``: when given, a rank entry that cannot be accepted is left out and
        noted there as (index, its "rank" field as sent, why) instead of failing the
        whole report: one bad rank must not make its host look lost."""
        if not isinstance(obj, dict):
            raise ReportError("report must be a JSON object")
        v = obj.get("v")
        if v != REPORT_VERSION and v != ROWS_VERSION:
            raise ReportError(f"unsupported report version {v!r}; this coordinator reads {_VERSIONS_TEXT}")
        ranks_raw = _get(obj, "ranks", list, "report")
        if len(ranks_raw) > MAX_RANKS_PER_REPORT:
            raise ReportError(f"report has {len(ranks_raw)} ranks, limit {MAX_RANKS_PER_REPORT}")
        lay = _layout(obj) if v == ROWS_VERSION else None
        plain = lay.plain(ranks_raw) if lay is not None else None
        if plain is not None:  # every row plainly fine: what the per-row path below gives, in one go
            ranks = plain
        elif dropped is None:
            parse = _rank_from_dict if lay is None else lay.rank
            ranks = tuple(parse(r, i) for i, r in enumerate(ranks_raw))
        elif lay is None:
            ranks = tuple(_tolerant_ranks(ranks_raw, dropped))
        else:
            ranks = tuple(_tolerant_ranks(ranks_raw, dropped, lay.checked_rank, lay.named))
        return cls(
            job=_get(obj, "job", str, "report"),
            host=_get(obj, "host", str, "report"),
            agent_id=_get(obj, "agent_id", str, "report"),
            seq=_get(obj, "seq", int, "report"),
            sent_wall=float(_get(obj, "sent_wall", (int, float), "report")),
            interval_s=float(_get(obj, "interval_s", (int, float), "report")),
            ranks=ranks,
            accelerators=tuple(_opt_list_of_dicts(obj, "accelerators")),
            acks=tuple(_opt_list_of_dicts(obj, "acks")),
            step_summary_config=_summary_config(obj),
        )


def _summary_config(obj: dict) -> tuple[int, ...]:
    val = obj.get("step_summary_config", [])
    if val == []:
        return ()
    problem = stepsummary.config_problem(val)
    if problem:
        raise ReportError(f"report: {problem}")
    return tuple(val)


def _get(obj: dict, key: str, typ, where: str):
    if key not in obj:
        raise ReportError(f"{where}: missing field {key!r}")
    val = obj[key]
    # bool is an int in Python; a bool where a number is expected is a type error.
    if isinstance(val, bool) and typ is not bool and (typ is int or (isinstance(typ, tuple) and bool not in typ)):
        raise ReportError(f"{where}: field {key!r} must be {_tname(typ)}, got bool")
    if not isinstance(val, typ):
        raise ReportError(f"{where}: field {key!r} must be {_tname(typ)}, got {type(val).__name__}")
    return val


def _tname(typ) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return typ.__name__


def _opt_list_of_dicts(obj: dict, key: str) -> list[dict]:
    val = obj.get(key, [])
    if not isinstance(val, list) or not all(isinstance(x, dict) for x in val):
        raise ReportError(f"report: field {key!r} must be a list of objects")
    return val


_NUM = (int, float)
_FINER = ("forward_s", "backward_s", "optimizer_s", "h2d_s")
_RANK_TYPES = {
    f.name: {"int": int, "float": _NUM, "bool": bool, "str": str}.get(str(f.type)) for f in fields(RankState)
}


def _rank_from_dict(raw: Any, i: int) -> RankState:
    # The common case first: every field present with exactly its JSON type. At
    # 16,384 ranks this runs 16,384 times a second; anything unusual (a missing
    # field, a subclass, a wrong type) takes the checking path below, which
    # accepts the same inputs and names the field in its error.
    fast = _fast_rank(raw) if type(raw) is dict else None
    if fast is not None:
        return fast
    where = f"ranks[{i}]"
    if not isinstance(raw, dict):
        raise ReportError(f"{where} must be an object")
    kw: dict[str, Any] = {}
    for name, typ in _RANK_TYPES.items():
        if typ is None:
            continue
        if name not in raw and name in _RANK_DEFAULTS:
            continue
        val = _get(raw, name, typ, where)
        kw[name] = float(val) if typ is _NUM else val
    coll = _get(raw, "coll", dict, where)
    try:
        kw["coll"] = CollectiveState(**{f.name: coll[f.name] for f in fields(CollectiveState) if f.name in coll})
    except TypeError as exc:  # pragma: no cover - defensive
        raise ReportError(f"{where}.coll: {exc}") from None
    for f in fields(CollectiveState):
        val = getattr(kw["coll"], f.name)
        ok = isinstance(val, str) if f.name == "op" else isinstance(val, (int, float)) and not isinstance(val, bool)
        if not ok:
            raise ReportError(f"{where}.coll: field {f.name!r} has the wrong type")
    steps = raw.get("recent_steps", [])
    if not isinstance(steps, list) or len(steps) > MAX_STEPS_PER_RANK:
        raise ReportError(f"{where}: recent_steps must be a list of at most {MAX_STEPS_PER_RANK}")
    samples = []
    for j, s in enumerate(steps):
        sw = f"{where}.recent_steps[{j}]"
        if not isinstance(s, dict):
            raise ReportError(f"{sw} must be an object")
        finer = {k: float(_get(s, k, _NUM, sw)) for k in _FINER if k in s}  # absent from an older agent
        samples.append(
            StepSample(
                step=_get(s, "step", int, sw),
                step_s=float(_get(s, "step_s", _NUM, sw)),
                data_s=float(_get(s, "data_s", _NUM, sw)),
                coll_s=float(_get(s, "coll_s", _NUM, sw)),
                phase=str(s.get("phase", "train")),
                coll_bytes=_get(s, "coll_bytes", int, sw) if "coll_bytes" in s else 0,
                **finer,
            )
        )
    kw["recent_steps"] = tuple(samples)
    kw["recent_colls"] = _colls_from_dict(raw.get("recent_colls", []), where)
    kw["recent_gpu"] = _gpu_from_dict(raw.get("recent_gpu", []), where)
    kw["step_summary"] = _summary_from(raw.get("step_summary", []), where)
    kw["death"] = _death_from_dict(raw.get("death", {}), where)
    if not 0 <= kw["rank"] < kw["world_size"]:
        raise ReportError(f"{where}: rank {kw['rank']} outside world size {kw['world_size']}")
    return RankState(**kw)


_SIG_TEXT = 32
_SIG_DIMS = 8


def _colls_from_dict(val: Any, where: str) -> tuple[CollSig, ...]:
    """Hostile values become a ReportError naming the field, never a crash or a
    number out of range in a detector."""
    if not isinstance(val, list) or len(val) > MAX_COLLS_PER_RANK:
        raise ReportError(f"{where}: recent_colls must be a list of at most {MAX_COLLS_PER_RANK}")
    out = []
    for j, c in enumerate(val):
        cw = f"{where}.recent_colls[{j}]"
        if not isinstance(c, dict):
            raise ReportError(f"{cw} must be an object")
        group = _get(c, "group", int, cw)
        if not -(1 << 63) <= group < (1 << 63):
            raise ReportError(f"{cw}: group out of range")
        counts = {k: _get(c, k, int, cw) for k in ("seq", "elements")}
        counts["inputs"] = _get(c, "inputs", int, cw) if "inputs" in c else 1
        if not all(_count_ok(v) for v in counts.values()) or counts["seq"] <= 0:
            raise ReportError(f"{cw}: seq, elements and inputs must be integers in 0..2^62 (seq > 0)")
        texts = {k: _get(c, k, str, cw) for k in ("op", "dtype")}
        for k in ("state", "clock"):
            if k in c:
                texts[k] = _get(c, k, str, cw)
        if any(len(v) > _SIG_TEXT for v in texts.values()):
            raise ReportError(f"{cw}: op, dtype, state and clock are at most {_SIG_TEXT} characters")
        shape = c.get("shape")
        if shape is not None and (
            not isinstance(shape, list) or len(shape) > _SIG_DIMS or not all(_count_ok(d) for d in shape)
        ):
            raise ReportError(f"{cw}: shape must be null or a list of at most {_SIG_DIMS} counts")
        age = c.get("age_s", 0.0)
        if not _seconds_ok(age):
            raise ReportError(f"{cw}: age_s must be a finite number of seconds >= 0")
        out.append(
            CollSig(group=group, shape=None if shape is None else tuple(shape), age_s=float(age), **counts, **texts)
        )
    return tuple(out)


def _gpu_from_dict(val: Any, where: str) -> tuple[GpuStep, ...]:
    if not isinstance(val, list) or len(val) > MAX_STEPS_PER_RANK:
        raise ReportError(f"{where}: recent_gpu must be a list of at most {MAX_STEPS_PER_RANK}")
    out = []
    for j, g in enumerate(val):
        gw = f"{where}.recent_gpu[{j}]"
        if not isinstance(g, dict):
            raise ReportError(f"{gw} must be an object")
        step = _get(g, "step", int, gw)
        secs = {k: _get(g, k, _NUM, gw) for k in GPU_FIELDS if k != "lag_s" or k in g}
        phase = _get(g, "phase", str, gw) if "phase" in g else "train"
        if not _count_ok(step) or not all(_seconds_ok(v) for v in secs.values()) or len(phase) > _SIG_TEXT:
            raise ReportError(f"{gw}: step must be a count and durations finite seconds >= 0")
        out.append(GpuStep(step=step, phase=phase, **{k: float(v) for k, v in secs.items()}))
    return tuple(out)


def _summary_from(val: Any, where: str) -> tuple[float, ...]:
    """A rank's step summary (``stepsummary``), ints made floats; a ReportError
    naming what is wrong with it."""
    if type(val) is not list:
        raise ReportError(f"{where}: step_summary must be a list of numbers")
    if not val:
        return ()
    if not all(type(x) in (int, float) for x in val):
        raise ReportError(f"{where}: step_summary must hold numbers only")
    out = tuple(map(float, val))
    problem = stepsummary.problem(out)
    if problem:
        raise ReportError(f"{where}: {problem}")
    return out


def _summary_fast(val: Any) -> tuple[float, ...] | None:
    """``_summary_from`` for a list of floats in range; None for anything else."""
    if type(val) is not list:
        return None
    if not val:
        return ()
    out = tuple(val)
    return None if stepsummary.problem(out) else out


def _named(raw: Any) -> Any:
    """A version-1 rank entry's "rank" as sent, to name it when it is dropped."""
    return raw.get("rank") if isinstance(raw, dict) else None


def _unchecked(raw: Any, i: int) -> tuple[RankState, bool]:
    return _rank_from_dict(raw, i), False


def _tolerant_ranks(ranks_raw: list, dropped: list[tuple[int, Any, str]], parse=_unchecked, named_of=_named):
    """``parse(raw, i)``: (the rank, whether its values are known to be in range)."""
    seen: set[int] = set()
    for i, raw in enumerate(ranks_raw):
        named = named_of(raw)
        try:
            r, fine = parse(raw, i)
        except (ReportError, TypeError, ValueError, OverflowError) as exc:
            dropped.append((i, named, str(exc)[:300]))
            continue
        problem = "" if fine else rank_problem(r)
        if not problem and r.rank in seen:
            problem = f"rank {r.rank} appears twice in one report"
        if problem:
            dropped.append((i, named, f"ranks[{i}]: {problem}"))
            continue
        seen.add(r.rank)
        yield r


def _count_ok(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_COUNT


def _seconds_ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v < MAX_SECONDS


_COUNTS = (
    "local_rank",
    "pid",
    "proc_start_us",
    "step",
    "hook_errors",
    "rss_bytes",
    "launcher_pid",
    "launcher_start_us",
    "ctrl_ack_seq",
    "ctrl_ack_step",
    "coll_bytes_total",
    "batch_per_rank",
    "fr_newest_seq",
    "loss_step",
    "loss_bad_step",
    "loss_bad_count",
    "frame_step",
)
_AGES = (
    "step_age_s",
    "heartbeat_age_s",
    "phase_age_s",
    "pg_age_s",
    "data_wait_age_s",
    "last_step_s",
    "last_data_s",
    "last_coll_s",
    "gone_age_s",
    "oncpu_share",  # seconds per second: ranged as seconds are
    "runq_share",
)


def rank_problem(r: RankState) -> str:
    """Why one rank entry is out of range ("" if it is fine). The agent drops such a
    rank before sending and the coordinator drops it on receipt; either way only
    that rank is lost, never its host's report."""
    if _plainly_fine(r):
        return ""
    if not 0 < r.world_size <= MAX_WORLD_SIZE:
        return f"world_size {r.world_size} outside 1..{MAX_WORLD_SIZE}"
    if not 0 <= r.rank < r.world_size:
        return f"rank {r.rank} outside world size {r.world_size}"
    for name in _COUNTS:
        if not _count_ok(getattr(r, name)):
            return f"{name} must be an integer in 0..2^62, got {getattr(r, name)!r}"
    if r.pid <= 0:
        return f"pid must be > 0, got {r.pid}"
    for name in _AGES:
        if not _seconds_ok(getattr(r, name)):
            return f"{name} must be a finite number of seconds >= 0, got {getattr(r, name)!r}"
    if not (math.isfinite(r.cpu_percent) and 0 <= r.cpu_percent < 1e7):
        return f"cpu_percent out of range: {r.cpu_percent!r}"
    if not (isinstance(r.loss, (int, float)) and math.isfinite(r.loss)):
        return f"loss must be a finite number (a NaN or infinite loss is sent as loss_finite false), got {r.loss!r}"
    if not (math.isfinite(r.created_wall) and 0 <= r.created_wall < 1e11):
        return f"created_wall out of range: {r.created_wall!r}"
    if r.fr_read_age_s != -1.0 and not _seconds_ok(r.fr_read_age_s):
        return f"fr_read_age_s must be -1 (never read) or finite seconds >= 0, got {r.fr_read_age_s!r}"
    if not -(1 << 63) <= r.fr_newest_group < (1 << 63):
        return f"fr_newest_group out of range: {r.fr_newest_group!r}"
    c = r.coll
    for name in ("seq", "done_seq", "bytes", "outstanding"):
        if not _count_ok(getattr(c, name)):
            return f"coll.{name} must be an integer in 0..2^62, got {getattr(c, name)!r}"
    if not (isinstance(c.group, int) and -(1 << 63) <= c.group < (1 << 63)):
        return f"coll.group out of range: {c.group!r}"
    if not _seconds_ok(c.since_s):
        return f"coll.since_s must be a finite number of seconds >= 0, got {c.since_s!r}"
    for j, x in enumerate(r.recent_steps):
        if not _count_ok(x.step) or not _count_ok(x.coll_bytes):
            return f"recent_steps[{j}]: step and coll_bytes must be integers in 0..2^62"
        if not all(_seconds_ok(getattr(x, k)) for k in ("step_s", "data_s", "coll_s", *_FINER)):
            return f"recent_steps[{j}]: durations must be finite seconds >= 0"
    for j, g in enumerate(r.recent_gpu):
        if not _count_ok(g.step) or not all(_seconds_ok(getattr(g, k)) for k in GPU_FIELDS):
            return f"recent_gpu[{j}]: step must be a count and durations finite seconds >= 0"
    if len(r.gpu_clock) > _SIG_TEXT:
        return f"gpu_clock is at most {_SIG_TEXT} characters"
    if len(r.frame) > FRAME_TEXT:
        return f"frame is at most {FRAME_TEXT} characters"
    if r.step_summary:
        return stepsummary.problem(r.step_summary)
    return ""


_counts_of = attrgetter(*_COUNTS)
_ages_of = attrgetter(*_AGES)
_coll_counts_of = attrgetter("seq", "done_seq", "bytes", "outstanding")
_sample_counts_of = attrgetter("step", "coll_bytes")
_sample_seconds_of = attrgetter("step_s", "data_s", "coll_s", *_FINER)
_INT, _FLOAT = {int}, {float}


def _plainly_fine(r: RankState) -> bool:
    """True only if ``rank_problem`` would find nothing, checked a field group at a
    time in C (attrgetter, map, min, max, sum) instead of a Python call per value:
    the coordinator checks every rank of every report, 16,384 a second at 16,384
    ranks. Exact types only (int counts, float seconds); anything else, or any
    doubt, is left to the field-by-field checks below, which name the problem.
    A sum of finite seconds below MAX_SECONDS each is finite, and NaN or an
    infinity makes it not, so one ``isfinite`` covers a whole group."""
    if not (0 < r.world_size <= MAX_WORLD_SIZE and 0 <= r.rank < r.world_size):
        return False
    c = r.coll
    counts = (*_counts_of(r), *_coll_counts_of(c))
    secs = (*_ages_of(r), c.since_s)
    steps = r.recent_steps
    if steps:
        counts += tuple(chain.from_iterable(map(_sample_counts_of, steps)))
        secs += tuple(chain.from_iterable(map(_sample_seconds_of, steps)))
    return (
        set(map(type, counts)) == _INT
        and min(counts) >= 0
        and max(counts) < MAX_COUNT
        and r.pid > 0
        and set(map(type, secs)) == _FLOAT
        and math.isfinite(sum(secs))
        and min(secs) >= 0
        and max(secs) < MAX_SECONDS
        and type(c.group) is int
        and -(1 << 63) <= c.group < (1 << 63)
        and type(r.cpu_percent) is float
        and 0 <= r.cpu_percent < 1e7
        and type(r.loss) is float
        and math.isfinite(r.loss)
        and type(r.created_wall) is float
        and 0 <= r.created_wall < 1e11
        and (r.fr_read_age_s == -1.0 or (type(r.fr_read_age_s) is float and 0 <= r.fr_read_age_s < MAX_SECONDS))
        and type(r.fr_newest_group) is int
        and -(1 << 63) <= r.fr_newest_group < (1 << 63)
        and not r.recent_gpu  # GPU-side steps: checked one by one below
        and len(r.gpu_clock) <= _SIG_TEXT
        and len(r.frame) <= FRAME_TEXT
        and not (r.step_summary and stepsummary.problem(r.step_summary))
    )


def split_valid(ranks: tuple[RankState, ...]) -> tuple[tuple[RankState, ...], list[tuple[RankState, str]]]:
    """(the ranks to send, [(dropped rank, why)]): the agent's half of ``rank_problem``."""
    good, bad = [], []
    for r in ranks:
        problem = rank_problem(r)
        (bad.append((r, problem)) if problem else good.append(r))
    return tuple(good), bad


# death: key -> (type, longest string); anything else a newer agent sends is dropped.
_DEATH_FIELDS: dict[str, tuple[type, int]] = {
    "summary": (str, 2000),
    "exit_code": (int, 0),
    "signal": (str, 32),
    "exit_call": (str, 240),  # how it asked to leave, where the hook saw it: "sys.exit(1)", "os._exit(3)"
    "oom": (str, 1000),
    "traceback": (str, 8000),
    "fatal": (str, 8000),
}
_EXCEPTION_FIELDS = ("type", "message", "where", "function", "thread")


def _death_from_dict(val: Any, where: str) -> dict:
    if not isinstance(val, dict):
        raise ReportError(f"{where}: death must be an object")
    out: dict[str, Any] = {}
    for key, (typ, limit) in _DEATH_FIELDS.items():
        if key in val:
            x = _get(val, key, typ, f"{where}.death")
            out[key] = x[:limit] if isinstance(x, str) else x
    exc = val.get("exception")
    if exc is not None:
        if not isinstance(exc, dict):
            raise ReportError(f"{where}.death: exception must be an object")
        out["exception"] = {k: str(exc.get(k, ""))[:1000] for k in _EXCEPTION_FIELDS}
    return out


# Fields with a default may be omitted by an older agent.
_RANK_DEFAULTS = {f.name for f in fields(RankState) if f.default is not MISSING}


_EXACT = {int: (int,), _NUM: (int, float), bool: (bool,), str: (str,)}
_FAST_FIELDS = tuple((name, _EXACT[typ], typ is _NUM) for name, typ in _RANK_TYPES.items() if typ is not None)
_STEP_KEYS = ("step", "step_s", "data_s", "coll_s")
_COLL_TYPES = {f.name: ((str,) if f.name == "op" else (int, float)) for f in fields(CollectiveState)}


_FAST_NAMES = tuple(name for name, _, _ in _FAST_FIELDS)
_FAST_TYPES = tuple(float if num else types[0] for _, types, num in _FAST_FIELDS)  # as an agent's JSON has them
_ABSENT_VALUE = object()  # a field missing from the JSON (None is JSON null)
_ABSENT = (_ABSENT_VALUE,) * len(_FAST_NAMES)
_PLANS: dict[tuple[type, ...], tuple[tuple[str, Any], ...] | None] = {}
_MAX_PLANS = 256  # distinct type tuples remembered; hostile input cannot grow it further
_COLL_NAMES = tuple(f.name for f in fields(CollectiveState))
_COLL_EXACT = tuple(
    str if f.name == "op" else {"int": int, "float": float}[str(f.type)] for f in fields(CollectiveState)
)
_coll_of = itemgetter(*_COLL_NAMES)
_STEP_SHORT = ("step", "step_s", "data_s", "coll_s", "phase")  # what the finer split leaves out
_STEP_FULL = (*_STEP_SHORT, "coll_bytes", *_FINER)
_step_short_of, _step_full_of = itemgetter(*_STEP_SHORT), itemgetter(*_STEP_FULL)
_STEP_SHORT_TYPES = (int, float, float, float, str)
_STEP_FULL_TYPES = (*_STEP_SHORT_TYPES, int, float, float, float, float)
assert tuple(f.name for f in fields(StepSample)) == _STEP_FULL


def built(cls: type[_T], values: dict[str, Any]) -> _T:
    """``made`` from every field's value by name, in any order."""
    names = _NAMES.get(cls) or _NAMES.setdefault(cls, tuple(f.name for f in fields(cls)))  # type: ignore[arg-type]
    return made(cls, *map(values.__getitem__, names))


_NAMES: dict[type, tuple[str, ...]] = {}


def _fast_rank(raw: dict) -> RankState | None:
    """``_rank_from_dict`` for a rank whose every field has exactly its JSON type;
    None for anything else (the checking path then decides, with its messages).

    The simple fields are read in C (one ``map``) and judged by the tuple of
    their types: what to do for a given tuple of types (nothing, usually; fill an
    older agent's missing fields with their defaults; make an int a float; or
    refuse) is worked out once per tuple (``_plan``) and remembered."""
    vals = tuple(map(raw.get, _FAST_NAMES, _ABSENT))
    types = tuple(map(type, vals))
    plan = _PLANS[types] if types in _PLANS else _plan(types)
    if plan is None:
        return None
    kw: dict[str, Any] = dict(zip(_FAST_NAMES, vals))
    if plan:  # an older agent's missing fields, ints where floats go
        for name, default in plan:
            kw[name] = float(kw[name]) if default is float else default
    coll = raw.get("coll")
    if type(coll) is not dict:
        return None
    if len(coll) == len(_COLL_NAMES) and _COLL_NAMES[0] in coll:
        try:
            cvals = _coll_of(coll)
        except KeyError:
            return None
        if tuple(map(type, cvals)) == _COLL_EXACT:
            kw["coll"] = built(CollectiveState, dict(zip(_COLL_NAMES, cvals)))
    if "coll" not in kw:
        if not all(type(v) in _COLL_TYPES.get(k, ()) for k, v in coll.items()):
            return None
        try:
            kw["coll"] = CollectiveState(**coll)
        except TypeError:
            return None
    steps = raw.get("recent_steps", [])
    if type(steps) is not list or len(steps) > MAX_STEPS_PER_RANK:
        return None
    samples = []
    for x in steps:
        if type(x) is not dict:
            return None
        sample = _exact_step(x) or _fast_step(x)
        if sample is None:
            return None
        samples.append(sample)
    nested = _nested(raw.get("recent_colls", []), raw.get("recent_gpu", []))
    if nested is None:
        return None
    colls, gpu = nested
    if "death" in raw and raw["death"] != {}:  # why a rank died: rare, checked field by field below
        return None
    if not 0 <= kw["rank"] < kw["world_size"]:
        return None
    summary = _summary_fast(raw["step_summary"]) if "step_summary" in raw else ()
    if summary is None:
        return None
    kw["recent_steps"] = tuple(samples)
    kw["recent_colls"] = tuple(colls)
    kw["recent_gpu"] = tuple(gpu)
    kw["step_summary"] = summary
    kw["death"] = {}
    return built(RankState, kw)  # every field set: the plan filled in what an older agent leaves out


def _nested(colls: Any, gpu: Any) -> tuple[tuple[CollSig, ...], tuple[GpuStep, ...]] | None:
    """A fast-path rank's Flight Recorder signatures (nested and rarer) and GPU-side
    steps (only where a completion source runs), through the checking parsers;
    None for anything they refuse, or not a list (null, say): the checking path
    then names it."""
    if type(colls) is not list or type(gpu) is not list:
        return None
    try:
        return (
            _colls_from_dict(colls, "ranks[]") if colls else (),
            _gpu_from_dict(gpu, "ranks[]") if gpu else (),
        )
    except ReportError:
        return None


def _exact_step(x: dict) -> StepSample | None:
    """A step sample with all its fields, or all but the finer split, each of
    exactly its JSON type; None for anything else."""
    full = len(x) == len(_STEP_FULL)
    if not full and len(x) != len(_STEP_SHORT):
        return None
    try:
        got = (_step_full_of if full else _step_short_of)(x)
    except KeyError:
        return None
    if tuple(map(type, got)) != (_STEP_FULL_TYPES if full else _STEP_SHORT_TYPES):
        return None
    # The coordinator keeps ~256 of these per rank, so they have slots, not a dict
    # each (120 bytes instead of 168; at 16,384 ranks' full histories ~200 MB less).
    return step_sample(*got)


def _plan(types: tuple[type, ...]) -> tuple[tuple[str, Any], ...] | None:
    """For a rank whose simple fields have ``types`` (in ``_FAST_NAMES`` order):
    () when every one is exactly of its type; else the (field, default) to fill
    in, with ``float`` as the "default" of an int to convert; None when a field
    is missing without a default or of another type (the checking path decides)."""
    plan: list[tuple[str, Any]] | None = []
    for (name, allowed, num), got in zip(_FAST_FIELDS, types):
        if got is _FAST_TYPES_BY_NAME[name]:
            continue
        if got is type(_ABSENT_VALUE) and name in _RANK_DEFAULT_VALUES:
            plan.append((name, _RANK_DEFAULT_VALUES[name]))  # type: ignore[union-attr]
        elif num and got in allowed:
            plan.append((name, float))  # type: ignore[union-attr]
        else:
            plan = None
            break
    out = None if plan is None else tuple(plan)
    if len(_PLANS) < _MAX_PLANS:
        _PLANS[types] = out
    return out


_FAST_TYPES_BY_NAME = dict(zip(_FAST_NAMES, _FAST_TYPES))
_RANK_DEFAULT_VALUES = {
    f.name: f.default for f in fields(RankState) if f.default is not MISSING and f.name in _FAST_TYPES_BY_NAME
}


def _fast_step(x: dict) -> StepSample | None:
    if type(x.get("step")) is not int:
        return None
    vals: list[Any] = [x.get(k) for k in _STEP_KEYS[1:]]
    phase = x.get("phase", "train")
    if not all(type(v) in (int, float) for v in vals) or type(phase) is not str:
        return None
    more: list[Any] = [x.get("coll_bytes", 0), *(x.get(k, 0.0) for k in _FINER)]  # absent from older agents
    if type(more[0]) is not int or not all(type(v) in (int, float) for v in more[1:]):
        return None
    return step_sample(x["step"], float(vals[0]), float(vals[1]), float(vals[2]), phase, more[0], *map(float, more[1:]))


# -- version 2: ranks and steps as arrays under field lists -------------------------

RANK_FIELDS = tuple(f.name for f in fields(RankState))
COLL_FIELDS = _COLL_NAMES
STEP_FIELDS = _STEP_FULL
_VERSIONS_TEXT = ", ".join(map(str, REPORT_VERSIONS))
_FIELD_LISTS = ("rank_fields", "coll_fields", "step_fields")
_NO_STEPS: tuple = ()
_SEQ = (list, tuple)


def as_rows(body: dict[str, Any]) -> dict[str, Any]:
    """The version-2 body of a version-1 body (``HostReport.to_dict()`` or JSON of
    it): the same content, each rank, its ``coll`` and each step sample an array
    under a field list sent once (the union of the names, first seen first). What
    v2 cannot say (a field one rank has and another lacks) is a ValueError; an
    agent's ranks all have every field. ``recent_colls``, ``recent_gpu`` and
    ``death`` stay objects inside the row: rarer, and read by the checking parser."""
    ranks = body["ranks"]
    rank_fields = _union(ranks) or RANK_FIELDS
    colls = [r["coll"] for r in ranks if isinstance(r.get("coll"), dict)]
    steps = [s for r in ranks if isinstance(r.get("recent_steps"), _SEQ) for s in r["recent_steps"]]
    coll_fields, step_fields = _union(colls) or COLL_FIELDS, _union(steps) or STEP_FIELDS
    rows = []
    for r in ranks:
        row = _row_of(r, rank_fields)
        if "coll" in r and isinstance(r["coll"], dict):
            row[rank_fields.index("coll")] = _row_of(r["coll"], coll_fields)
        if isinstance(r.get("recent_steps"), _SEQ):  # a tuple in to_dict(), a list in JSON
            row[rank_fields.index("recent_steps")] = [_row_of(x, step_fields) for x in r["recent_steps"]]
        rows.append(row)
    out = {k: v for k, v in body.items() if k != "ranks"}
    out.update(
        v=ROWS_VERSION,
        rank_fields=list(rank_fields),
        coll_fields=list(coll_fields),
        step_fields=list(step_fields),
        ranks=rows,
    )
    return out


def _union(objs: list) -> tuple[str, ...]:
    names: dict[str, None] = {}
    for o in objs:
        if not isinstance(o, dict):
            raise ValueError(f"version 2 has no form for {type(o).__name__} where an object goes")
        if o.keys() != names.keys():  # (as sets, in C) most have the same fields: nothing to add
            names.update(dict.fromkeys(o))
    return tuple(names)


def _row_of(obj: dict, names: tuple[str, ...]) -> list[Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"version 2 has no form for {type(obj).__name__} where an object goes")
    if len(obj) == len(names):
        try:  # as many fields, each of the names among them: the same fields
            return list(map(obj.__getitem__, names))
        except KeyError:
            pass
    raise ValueError("version 2 cannot say that one entry lacks a field another has")


_MAX_LAYOUTS = 64  # distinct field lists remembered; hostile input cannot grow it further
_LAYOUTS: dict[tuple, _Layout] = {}


def _layout(obj: dict) -> _Layout:
    """The version-2 report's field lists, checked and turned into positions once
    per distinct lists (an agent sends the same lists in every report)."""
    lists = [_get(obj, name, list, "report") for name in _FIELD_LISTS]
    for name, names in zip(_FIELD_LISTS, lists, strict=True):
        if not 0 < len(names) <= MAX_FIELDS:
            raise ReportError(f"report: {name} must list 1..{MAX_FIELDS} field names, got {len(names)}")
    try:
        key = tuple(map(tuple, lists))
        lay = _LAYOUTS.get(key)
    except TypeError:  # an unhashable name (a list, an object): refused below
        key, lay = None, None
    if lay is not None:
        return lay
    for name, names in zip(_FIELD_LISTS, lists, strict=True):
        for j, n in enumerate(names):
            if type(n) is not str or not 0 < len(n) <= MAX_FIELD_NAME:
                raise ReportError(f"report: {name}[{j}] must be a field name of 1..{MAX_FIELD_NAME} characters")
        if len(set(names)) != len(names):
            twice = next(n for j, n in enumerate(names) if n in names[:j])
            raise ReportError(f"report: {name} names {twice!r} twice")
    assert key is not None
    lay = _Layout(*key)
    if len(_LAYOUTS) < _MAX_LAYOUTS:
        _LAYOUTS[key] = lay
    return lay


class _Layout:
    """Positions of the fields in one set of version-2 field lists. Names this
    coordinator does not know are skipped, as a version-1 object's unknown keys
    are: a newer agent can add fields. A rank whose row the positional fast path
    cannot take (a missing field without a default, a value not of exactly its
    JSON type, anything odd) is made into the version-1 object of the same
    content and goes through that parser: the same result, the same messages."""

    def __init__(self, rank_fields: tuple[str, ...], coll_fields: tuple[str, ...], step_fields: tuple[str, ...]):
        self.rank_fields, self.coll_fields, self.step_fields = rank_fields, coll_fields, step_fields
        self.width, self.coll_width, self.step_width = len(rank_fields), len(coll_fields), len(step_fields)
        at = {n: i for i, n in enumerate(rank_fields)}
        # The simple fields: every one present, or absent with a default (an older agent's,
        # or a sender that leaves defaults out), read from the padding after the row.
        absent = [n for n in _FAST_NAMES if n not in at]
        self.fast = all(n in _RANK_DEFAULT_VALUES for n in absent) and "coll" in at
        self.padding = [_RANK_DEFAULT_VALUES.get(n) for n in absent]
        self.pad = bool(absent)
        self.rank_i = at.get("rank", -1)
        at.update((n, len(rank_fields) + j) for j, n in enumerate(absent))
        self.simple = itemgetter(*(at[n] for n in _FAST_NAMES))
        self.coll_i = at.get("coll", -1)
        self.steps_i, self.colls_i = at.get("recent_steps", -1), at.get("recent_colls", -1)
        self.gpu_i, self.death_i = at.get("recent_gpu", -1), at.get("death", -1)
        self.summary_i = at.get("step_summary", -1)
        cat = {n: i for i, n in enumerate(coll_fields)}
        self.coll_of = itemgetter(*(cat[n] for n in _COLL_NAMES)) if all(n in cat for n in _COLL_NAMES) else None
        sat = {n: i for i, n in enumerate(step_fields)}
        self.step_of: Any = None
        self.step_full = all(n in sat for n in _STEP_FULL)
        if self.step_full:
            self.step_of = itemgetter(*(sat[n] for n in _STEP_FULL))
        elif all(n in sat for n in _STEP_SHORT) and not any(n in sat for n in _STEP_FULL[len(_STEP_SHORT) :]):
            self.step_of = itemgetter(*(sat[n] for n in _STEP_SHORT))  # an older agent's: no finer split
        # For ``plain``: the whole report at once.
        self.whole = self.fast and self.coll_of is not None
        self.coll_at = itemgetter(self.coll_i)
        self.steps_at = itemgetter(self.steps_i) if self.steps_i >= 0 else None
        self.colls_at = itemgetter(self.colls_i) if self.colls_i >= 0 else None
        self.gpu_at = itemgetter(self.gpu_i) if self.gpu_i >= 0 else None
        self.death_at = itemgetter(self.death_i) if self.death_i >= 0 else None
        self.summary_at = itemgetter(self.summary_i) if self.summary_i >= 0 else None
        self.step_types = list(_STEP_FULL_TYPES if self.step_full else _STEP_SHORT_TYPES)
        self.step_cols = _full_cols if self.step_full else _short_cols
        # An agent's lists name the fields in the dataclasses' order: a row is then its values as read.
        self.coll_as_is = coll_fields == _COLL_NAMES
        self.steps_as_is = step_fields == (_STEP_FULL if self.step_full else _STEP_SHORT)

    def named(self, row: Any) -> Any:
        """A row's "rank" as sent, to name it when it is dropped."""
        return row[self.rank_i] if type(row) is list and len(row) == self.width and self.rank_i >= 0 else None

    def rank(self, row: Any, i: int) -> RankState:
        return self.checked_rank(row, i)[0]

    def checked_rank(self, row: Any, i: int) -> tuple[RankState, bool]:
        """(the rank, True if its values are known to be in range: ``rank_problem``
        would find nothing)."""
        fast = self._fast(row) if self.fast and type(row) is list and len(row) == self.width else None
        return fast if fast is not None else (_rank_from_dict(self.as_object(row, f"ranks[{i}]"), i), False)

    def as_object(self, row: Any, where: str) -> dict[str, Any]:
        """The version-1 rank object of ``row``, its errors naming the field lists."""
        if type(row) is not list:
            raise ReportError(f"{where} must be an array of the {self.width} values rank_fields names")
        if len(row) != self.width:
            raise ReportError(f"{where} has {len(row)} values; rank_fields names {self.width}")
        obj = dict(zip(self.rank_fields, row))
        if "coll" in obj:
            obj["coll"] = self._sub(obj["coll"], self.coll_fields, "coll_fields", f"{where}.coll")
        steps = obj.get("recent_steps")
        if type(steps) is list and len(steps) <= MAX_STEPS_PER_RANK:  # else the version-1 message
            obj["recent_steps"] = [
                self._sub(x, self.step_fields, "step_fields", f"{where}.recent_steps[{j}]") for j, x in enumerate(steps)
            ]
        return obj

    @staticmethod
    def _sub(row: Any, names: tuple[str, ...], listed: str, where: str) -> dict[str, Any]:
        if type(row) is not list or len(row) != len(names):
            raise ReportError(f"{where} must be an array of the {len(names)} values {listed} names")
        return dict(zip(names, row))

    def plain(self, rows: list) -> tuple[RankState, ...] | None:
        """Every row of a report at once, when each is plainly fine: exactly of its
        JSON types (as ``_fast`` takes them: no int where a float goes), in range
        (``_in_range``), of a rank no other row has; then the RankStates the
        per-row path gives, value for value and dict for dict. None for anything
        else or any doubt: the per-row path decides, with its drops and messages.

        The checks go a column at a time (a field's values over the ~8 rows, all
        the step samples together) through C (map, zip, min, max, sum): the
        per-row path's Python work per rank, per check, is done once a report."""
        n = len(rows)
        if not n or not self.whole:
            return None
        try:
            return self._plain(rows, n)
        except (TypeError, ValueError, OverflowError):  # pragma: no cover - not expected: the per-row path decides
            return None

    def _plain(self, rows: list, n: int) -> tuple[RankState, ...] | None:
        if set(map(type, rows)) != _LIST or set(map(len, rows)) != {self.width}:
            return None
        vals = list(map(self.simple, map(add, rows, repeat(self.padding, n)) if self.pad else rows))
        if list(map(type, chain.from_iterable(vals))) != _FAST_TYPE_LIST * n:  # a list: no resizing as a tuple
            return None
        cvals = list(map(self.coll_at, rows))
        if set(map(type, cvals)) != _LIST or set(map(len, cvals)) != {self.coll_width}:
            return None
        if not self.coll_as_is:
            cvals = list(map(self.coll_of, cvals))  # type: ignore[arg-type]
        if list(map(type, chain.from_iterable(cvals))) != _COLL_EXACT_LIST * n:
            return None
        samples: Any = repeat(_NO_STEPS, n)
        step_counts: tuple = ()
        step_secs: tuple = ()
        if self.steps_at is not None:
            steps = list(map(self.steps_at, rows))
            if set(map(type, steps)) != _LIST:
                return None
            gots = list(chain.from_iterable(steps))
            if gots:
                lens = list(map(len, steps))
                if self.step_of is None or max(lens) > MAX_STEPS_PER_RANK:
                    return None
                if set(map(type, gots)) != _LIST or set(map(len, gots)) != {self.step_width}:
                    return None
                if not self.steps_as_is:
                    gots = list(map(self.step_of, gots))
                if list(map(type, chain.from_iterable(gots))) != self.step_types * len(gots):
                    return None
                cols = tuple(zip(*gots))
                step_counts, step_secs = self.step_cols(cols)
                samples = samples_of(cols, lens)
        nested = self.nested(rows, n)
        if nested is None or not self.no_deaths(rows):
            return None
        colls, gpus = nested
        summaries = self.summaries(rows, n)
        if summaries is None:
            return None
        if not _all_in_range(tuple(zip(*vals)), tuple(zip(*cvals)), step_counts, step_secs, n):
            return None
        # GPU-side steps need no rank_problem: _gpu_from_dict refused what it would find in them.
        return ranks_of(vals, cvals, samples, colls, gpus, summaries)

    def nested(self, rows: list, n: int) -> tuple[Any, Any] | None:
        """The rows' Flight Recorder signatures and GPU-side steps (each an iterable of
        one tuple a row), through the checking parsers where any row has some; None
        where they refuse one, or a value is not a list."""
        colls: Any = repeat(_NO_STEPS, n)
        gpus: Any = repeat(_NO_STEPS, n)
        colls_raw = list(map(self.colls_at, rows)) if self.colls_at is not None else []
        gpu_raw = list(map(self.gpu_at, rows)) if self.gpu_at is not None else []
        if any(colls_raw) or any(gpu_raw):  # Flight Recorder signatures, GPU-side steps: row by row
            nested = list(map(_nested, colls_raw or repeat([], n), gpu_raw or repeat([], n)))
            if None in nested:
                return None
            colls, gpus = zip(*nested)
        elif set(map(type, colls_raw)) - _LIST or set(map(type, gpu_raw)) - _LIST:
            return None  # an empty value that is not a list (null, say)
        return colls, gpus

    def summaries(self, rows: list, n: int) -> Any:
        """The rows' step summaries (an iterable of one tuple a row), or None where
        one is not plainly fine (``stepsummary.all_fine``)."""
        if self.summary_at is None:
            return repeat(_NO_STEPS, n)
        raw = list(map(self.summary_at, rows))
        if set(map(type, raw)) != _LIST or not stepsummary.all_fine(list(filter(None, raw))):
            return None
        return list(map(tuple, raw))

    def no_deaths(self, rows: list) -> bool:
        """No row says why its rank died (rare: checked field by field)."""
        if self.death_at is None:
            return True
        deaths = list(map(self.death_at, rows))
        return set(map(type, deaths)) == _DICT and not any(deaths)

    def _fast(self, row: list) -> tuple[RankState, bool] | None:
        """``_fast_rank`` by position: a rank whose every field has exactly its
        JSON type, and whether its values are in range (``_in_range``); None for
        anything else."""
        vals = self.simple(row + self.padding if self.pad else row)
        types = tuple(map(type, vals))
        plan = _PLANS[types] if types in _PLANS else _plan(types)
        if plan is None:
            return None
        kw: dict[str, Any] = dict(zip(_FAST_NAMES, vals))
        if plan:  # ints where floats go (absent fields were read from the padding, as their defaults)
            for name, default in plan:
                kw[name] = float(kw[name]) if default is float else default
        coll = row[self.coll_i]
        if type(coll) is not list or len(coll) != self.coll_width or self.coll_of is None:
            return None
        cvals = self.coll_of(coll)
        if tuple(map(type, cvals)) != _COLL_EXACT:
            return None
        kw["coll"] = built(CollectiveState, dict(zip(_COLL_NAMES, cvals)))
        steps = row[self.steps_i] if self.steps_i >= 0 else _NO_STEPS
        step_counts: tuple = ()
        step_secs: tuple = ()
        samples: tuple = ()
        if steps:  # all at once in C: their shapes, then their values' types
            if type(steps) is not list or self.step_of is None or len(steps) > MAX_STEPS_PER_RANK:
                return None
            if set(map(type, steps)) != _LIST or set(map(len, steps)) != {self.step_width}:
                return None
            gots = list(map(self.step_of, steps))
            if self.step_full:
                step_counts = tuple(chain.from_iterable(map(_full_counts_at, gots)))
                step_secs = tuple(chain.from_iterable(map(_full_secs_at, gots)))
            else:
                step_counts = tuple(map(_step_at, gots))
                step_secs = tuple(chain.from_iterable(map(_short_secs_at, gots)))
            if (
                set(map(type, step_counts)) != _INT
                or set(map(type, step_secs)) != _FLOAT
                or set(map(type, map(_phase_at, gots))) != _STR
            ):
                return None  # ints where floats go, say: the checking path converts them
            samples = tuple(starmap(StepSample, gots))
        elif type(steps) is not list and steps is not _NO_STEPS:
            return None
        nested = _nested(row[self.colls_i] if self.colls_i >= 0 else [], row[self.gpu_i] if self.gpu_i >= 0 else [])
        if nested is None:
            return None
        colls, gpu = nested
        if self.death_i >= 0 and row[self.death_i] != {}:  # why a rank died: rare, checked field by field
            return None
        if not 0 <= kw["rank"] < kw["world_size"]:
            return None
        summary = _summary_fast(row[self.summary_i]) if self.summary_i >= 0 else ()
        if summary is None:
            return None
        kw["recent_steps"] = samples
        kw["recent_colls"] = tuple(colls)
        kw["recent_gpu"] = tuple(gpu)
        kw["step_summary"] = summary
        kw["death"] = {}
        if plan:  # the values as the rank holds them: floats for ints
            vals = tuple(map(kw.__getitem__, _FAST_NAMES))
        fine = not gpu and _in_range(vals, cvals, step_counts, step_secs)
        return built(RankState, kw), fine


def samples_of(cols: tuple, lens: list[int]) -> list[tuple[StepSample, ...]]:
    """The step samples of a report's rows: ``cols`` their values' columns (all
    the rows' samples together, in StepSample's field order, checked), ``lens``
    how many each row has."""
    made = iter(step_samples(_shared_values(cols)))
    return list(map(tuple, map(islice, repeat(made, len(lens)), lens)))


def ranks_of(vals: list, cvals: list, samples: Any, colls: Any, gpus: Any, summaries: Any) -> tuple[RankState, ...]:
    """The RankStates of a report's rows, each row's parts checked: its simple
    fields' values (``_FAST_NAMES`` order), its collective's (``_COLL_NAMES``),
    its step samples, Flight Recorder signatures, GPU-side steps and summary."""
    coll = _TWINS[CollectiveState]
    rank = _TWINS[RankState]
    out = list(
        starmap(
            rank,
            map(
                _RANK_ORDER,
                map(add, vals, zip(starmap(coll, cvals), samples, colls, gpus, summaries, map(dict, repeat(())))),
            ),
        )
    )
    for r in out:  # the twins become what they are twins of (the same layout)
        r.__class__ = RankState
        r.coll.__class__ = CollectiveState
    return tuple(out)


# A rank's field values in RankState's order from its simple fields' (_FAST_NAMES order) then the others'.
_NESTED_NAMES = ("coll", "recent_steps", "recent_colls", "recent_gpu", "step_summary", "death")
_RANK_ORDER = itemgetter(*((*_FAST_NAMES, *_NESTED_NAMES).index(f.name) for f in fields(RankState)))
_AT = {n: i for i, n in enumerate(_FAST_NAMES)}
_counts_at, _ages_at = itemgetter(*(_AT[n] for n in _COUNTS)), itemgetter(*(_AT[n] for n in _AGES))
_CHECKED_AT = itemgetter(
    *(_AT[n] for n in ("world_size", "rank", "pid", "cpu_percent", "created_wall", "fr_read_age_s", "loss"))
)
_FR_GROUP_AT, _GPU_CLOCK_AT, _FRAME_AT = _AT["fr_newest_group"], _AT["gpu_clock"], _AT["frame"]
_coll_counts_at = itemgetter(*(_COLL_NAMES.index(n) for n in ("seq", "done_seq", "bytes", "outstanding")))
_COLL_GROUP_AT, _COLL_SINCE_AT = _COLL_NAMES.index("group"), _COLL_NAMES.index("since_s")
_full_counts_at = itemgetter(*(_STEP_FULL.index(n) for n in ("step", "coll_bytes")))
_full_secs_at = itemgetter(*(_STEP_FULL.index(n) for n in ("step_s", "data_s", "coll_s", *_FINER)))
_step_at, _phase_at = itemgetter(_STEP_FULL.index("step")), itemgetter(_STEP_FULL.index("phase"))  # short too
_LIST, _STR = {list}, {str}
_short_secs_at = itemgetter(*(_STEP_SHORT.index(n) for n in ("step_s", "data_s", "coll_s")))
_INT64 = 1 << 63


def _in_range(vals: tuple, cvals: tuple, step_counts: tuple, step_secs: tuple) -> bool:
    """``_plainly_fine`` on a version-2 row's values as read, before they become a
    RankState, for values already known to be exactly of their types (an int
    count, a float second): the same ranges, without an attribute read per field.
    False means "not known": ``rank_problem`` then decides."""
    counts = (*_counts_at(vals), *_coll_counts_at(cvals), *step_counts)
    secs = (*_ages_at(vals), cvals[_COLL_SINCE_AT], *step_secs)
    world, rank, pid, cpu, created, fr_age, loss = _CHECKED_AT(vals)
    return (
        math.isfinite(loss)
        and 0 < world <= MAX_WORLD_SIZE
        and 0 <= rank < world
        and min(counts) >= 0
        and max(counts) < MAX_COUNT
        and pid > 0
        and math.isfinite(sum(secs))
        and min(secs) >= 0
        and max(secs) < MAX_SECONDS
        and -_INT64 <= cvals[_COLL_GROUP_AT] < _INT64
        and 0 <= cpu < 1e7
        and 0 <= created < 1e11
        and (fr_age == -1.0 or 0 <= fr_age < MAX_SECONDS)
        and -_INT64 <= vals[_FR_GROUP_AT] < _INT64
        and len(vals[_GPU_CLOCK_AT]) <= _SIG_TEXT
        and len(vals[_FRAME_AT]) <= FRAME_TEXT
    )


_W_AT, _R_AT, _PID_AT = _AT["world_size"], _AT["rank"], _AT["pid"]
_FLOATS_AT = itemgetter(*(_AT[n] for n in ("cpu_percent", "created_wall", "fr_read_age_s", "loss")))
_DICT = {dict}
_FAST_TYPE_LIST, _COLL_EXACT_LIST = list(_FAST_TYPES), list(_COLL_EXACT)


def _cols(*at: int):
    """An itemgetter that always gives a tuple, for one index too."""
    return itemgetter(*at) if len(at) > 1 else lambda x: (x[at[0]],)


_full_counts, _full_secs = _cols(*_full_counts_at(range(10))), _cols(*_full_secs_at(range(10)))
_short_counts, _short_secs = _cols(_STEP_SHORT.index("step")), _cols(*_short_secs_at(range(5)))


# Phases as the hook names them, one str object each: what _shared_values maps a
# sample's phase to (another phase keeps its own object; nothing here grows).
_PHASE_OBJECTS = {p.label: p.label for p in Phase}


def _shared_values(cols: tuple) -> Iterator[tuple]:
    """The step samples' values again (``cols``: their columns in StepSample's
    field order), with values that repeat from sample to sample as one object:
    the phase by name, and a finer-split column of zeros (not measured: every
    sample of an agent's full form has four) as the one 0.0. Equal values; the
    coordinator keeps ~256 samples a rank, and each such value was an object of
    its own from JSON: 54 bytes a phase, 24 a float, ~150 bytes of a ~370-byte
    sample (~600 MB at 16,384 ranks)."""
    out = list(cols)
    out[4] = map(_PHASE_OBJECTS.get, out[4], out[4])
    for i in range(6, len(out)):  # the finer split, in the full form (floats: checked before)
        if not any(array("d", out[i]).tobytes()):  # every one +0.0, bit for bit (-0.0 stays itself)
            out[i] = repeat(0.0)
    return zip(*out)


def _full_cols(c: tuple) -> tuple[tuple, tuple]:
    """A version-2 report's step samples' columns (all its ranks' together): (counts, seconds)."""
    return _full_counts(c), _full_secs(c)


def _short_cols(c: tuple) -> tuple[tuple, tuple]:
    return _short_counts(c), _short_secs(c)


def _all_in_range(cols: tuple, ccols: tuple, step_counts: tuple, step_secs: tuple, n: int) -> bool:
    """``_in_range`` of every row of a report, and their ranks distinct, on
    columns (a field's values over the rows: ``cols`` the simple fields' in
    ``_FAST_NAMES`` order, ``ccols`` the collectives', ``step_*`` the step
    samples' counts and seconds): a min, a max or a sum per group of values
    instead of per row. Never True where a row's ``_in_range`` is not; a sum
    that overflows to inf makes it False (the per-row path then decides)."""
    world, rank, pid = cols[_W_AT], cols[_R_AT], cols[_PID_AT]
    counts = (*_counts_at(cols), *_coll_counts_at(ccols), *step_counts)
    secs = (*_ages_at(cols), ccols[_COLL_SINCE_AT], *step_secs)
    cpu, created, fr_age, loss = _FLOATS_AT(cols)
    groups = (*ccols[_COLL_GROUP_AT], *cols[_FR_GROUP_AT])
    flat = chain.from_iterable
    return (
        min(world) > 0
        and max(world) <= MAX_WORLD_SIZE
        and min(rank) >= 0
        and all(map(lt, rank, world))
        and len(set(rank)) == n
        and min(pid) > 0
        and min(flat(counts)) >= 0
        and (sum(flat(counts)) < MAX_COUNT or max(flat(counts)) < MAX_COUNT)  # each is at most their sum
        and min(flat(secs)) >= 0
        # A NaN makes the sum NaN (not <), an infinity makes it not finite.
        and (sum(flat(secs)) < MAX_SECONDS or (math.isfinite(sum(flat(secs))) and max(flat(secs)) < MAX_SECONDS))
        and math.isfinite(sum((*cpu, *created, *fr_age, *loss)))
        and min(cpu) >= 0
        and max(cpu) < 1e7
        and min(created) >= 0
        and max(created) < 1e11
        and max(fr_age) < MAX_SECONDS
        and (min(fr_age) >= 0 or min((a for a in fr_age if a != -1.0), default=0.0) >= 0)  # -1: never read
        and min(groups) >= -_INT64
        and max(groups) < _INT64
        and max(map(len, cols[_GPU_CLOCK_AT])) <= _SIG_TEXT
        and max(map(len, cols[_FRAME_AT])) <= FRAME_TEXT
    )
