"""The per-host report: what an agent tells the coordinator about once a second.

The agent builds it from its slot snapshots (``watchdog.agent.report.build_report``);
the coordinator validates it with ``HostReport.from_dict`` and folds it into its
cluster view. Ages are computed by the agent against its own monotonic clock at
send time (monotonic clocks are not comparable across hosts); the coordinator adds
the time since it received the report.

JSON over HTTP, one object, ``"v": REPORT_VERSION``. Unknown keys are ignored (a
newer agent can add fields); missing or mistyped required keys are a ReportError
with a message naming the field.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

REPORT_VERSION = 1
MAX_RANKS_PER_REPORT = 4096
MAX_STEPS_PER_RANK = 256


class ReportError(ValueError):
    """A report that cannot be accepted; str() is the message sent back (4xx)."""


@dataclass(frozen=True)
class StepSample:
    step: int  # the step number that completed
    step_s: float
    data_s: float
    coll_s: float
    phase: str = "train"

    @property
    def compute_s(self) -> float:
        return max(0.0, self.step_s - self.data_s - self.coll_s)


@dataclass(frozen=True)
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
    v: int = REPORT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: Any) -> "HostReport":
        if not isinstance(obj, dict):
            raise ReportError("report must be a JSON object")
        v = obj.get("v")
        if v != REPORT_VERSION:
            raise ReportError(f"unsupported report version {v!r}; this coordinator speaks {REPORT_VERSION}")
        ranks_raw = _get(obj, "ranks", list, "report")
        if len(ranks_raw) > MAX_RANKS_PER_REPORT:
            raise ReportError(f"report has {len(ranks_raw)} ranks, limit {MAX_RANKS_PER_REPORT}")
        ranks = tuple(_rank_from_dict(r, i) for i, r in enumerate(ranks_raw))
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
        )


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
_RANK_TYPES = {
    f.name: {"int": int, "float": _NUM, "bool": bool, "str": str}.get(str(f.type))
    for f in fields(RankState)
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
        kw["coll"] = CollectiveState(
            **{f.name: coll[f.name] for f in fields(CollectiveState) if f.name in coll}
        )
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
        samples.append(
            StepSample(
                step=_get(s, "step", int, sw),
                step_s=float(_get(s, "step_s", _NUM, sw)),
                data_s=float(_get(s, "data_s", _NUM, sw)),
                coll_s=float(_get(s, "coll_s", _NUM, sw)),
                phase=str(s.get("phase", "train")),
            )
        )
    kw["recent_steps"] = tuple(samples)
    if not 0 <= kw["rank"] < kw["world_size"]:
        raise ReportError(f"{where}: rank {kw['rank']} outside world size {kw['world_size']}")
    return RankState(**kw)


# Fields with a default may be omitted by an older agent.
_RANK_DEFAULTS = {f.name for f in fields(RankState) if f.default is not MISSING}


_EXACT = {int: (int,), _NUM: (int, float), bool: (bool,), str: (str,)}
_FAST_FIELDS = tuple((name, _EXACT[typ], typ is _NUM) for name, typ in _RANK_TYPES.items() if typ is not None)
_STEP_KEYS = ("step", "step_s", "data_s", "coll_s")
_COLL_TYPES = {f.name: ((str,) if f.name == "op" else (int, float)) for f in fields(CollectiveState)}


def _fast_rank(raw: dict) -> RankState | None:
    """``_rank_from_dict`` for a rank whose every field has exactly its JSON type;
    None for anything else (the checking path then decides, with its messages)."""
    kw: dict[str, Any] = {}
    for name, types, num in _FAST_FIELDS:
        val = raw.get(name, raw)  # ``raw`` itself marks "missing"
        if val is raw:
            if name in _RANK_DEFAULTS:
                continue
            return None
        if type(val) not in types:
            return None
        kw[name] = float(val) if num else val
    coll = raw.get("coll")
    if type(coll) is not dict or not all(type(v) in _COLL_TYPES.get(k, ()) for k, v in coll.items()):
        return None
    steps = raw.get("recent_steps", [])
    if type(steps) is not list or len(steps) > MAX_STEPS_PER_RANK:
        return None
    samples = []
    for x in steps:
        if type(x) is not dict or type(x.get("step")) is not int:
            return None
        vals: list[Any] = [x.get(k) for k in _STEP_KEYS[1:]]
        phase = x.get("phase", "train")
        if not all(type(v) in (int, float) for v in vals) or type(phase) is not str:
            return None
        samples.append(StepSample(x["step"], float(vals[0]), float(vals[1]), float(vals[2]), phase))
    if not 0 <= kw["rank"] < kw["world_size"]:
        return None
    try:
        kw["coll"] = CollectiveState(**coll)
    except TypeError:
        return None
    kw["recent_steps"] = tuple(samples)
    return RankState(**kw)
