"""The report's leaf parsers: a field's JSON value checked against its type,
and the nested values (Flight Recorder signatures, GPU-side steps, step
summaries, why a rank died) checked field by field. A hostile value becomes a
ReportError naming the field, never a crash or a number out of range in a
detector."""

from __future__ import annotations

import math
from typing import Any

from watchdog.contracts import stepsummary

from .fields import CollSig, GpuStep
from .ranges import MAX_COLLS_PER_RANK, MAX_COUNT, MAX_SECONDS, MAX_STEPS_PER_RANK, SIG_DIMS, SIG_TEXT, ReportError
from .table import GPU_FIELDS, NUM


def summary_config(obj: dict) -> tuple[int, ...]:
    val = obj.get("step_summary_config", [])
    if val == []:
        return ()
    problem = stepsummary.config_problem(val)
    if problem:
        raise ReportError(f"report: {problem}")
    return tuple(val)


def get(obj: dict, key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise ReportError(f"{where}: missing field {key!r}")
    val = obj[key]
    # bool is an int in Python; a bool where a number is expected is a type error.
    if isinstance(val, bool) and typ is not bool and (typ is int or (isinstance(typ, tuple) and bool not in typ)):
        raise ReportError(f"{where}: field {key!r} must be {_tname(typ)}, got bool")
    if not isinstance(val, typ):
        raise ReportError(f"{where}: field {key!r} must be {_tname(typ)}, got {type(val).__name__}")
    return val


def _tname(typ: type | tuple[type, ...]) -> str:
    if isinstance(typ, tuple):
        return " or ".join(t.__name__ for t in typ)
    return typ.__name__


def list_of_dicts(obj: dict, key: str) -> list[dict]:
    val = obj.get(key, [])
    if not isinstance(val, list) or not all(isinstance(x, dict) for x in val):
        raise ReportError(f"report: field {key!r} must be a list of objects")
    return val


def colls_from_dict(val: Any, where: str) -> tuple[CollSig, ...]:
    """Hostile values become a ReportError naming the field, never a crash or a
    number out of range in a detector."""
    if not isinstance(val, list) or len(val) > MAX_COLLS_PER_RANK:
        raise ReportError(f"{where}: recent_colls must be a list of at most {MAX_COLLS_PER_RANK}")
    out = []
    for j, c in enumerate(val):
        cw = f"{where}.recent_colls[{j}]"
        if not isinstance(c, dict):
            raise ReportError(f"{cw} must be an object")
        group = get(c, "group", int, cw)
        if not -(1 << 63) <= group < (1 << 63):
            raise ReportError(f"{cw}: group out of range")
        counts = {k: get(c, k, int, cw) for k in ("seq", "elements")}
        counts["inputs"] = get(c, "inputs", int, cw) if "inputs" in c else 1
        if not all(count_ok(v) for v in counts.values()) or counts["seq"] <= 0:
            raise ReportError(f"{cw}: seq, elements and inputs must be integers in 0..2^62 (seq > 0)")
        texts = {k: get(c, k, str, cw) for k in ("op", "dtype")}
        for k in ("state", "clock"):
            if k in c:
                texts[k] = get(c, k, str, cw)
        if any(len(v) > SIG_TEXT for v in texts.values()):
            raise ReportError(f"{cw}: op, dtype, state and clock are at most {SIG_TEXT} characters")
        shape = c.get("shape")
        if shape is not None and (
            not isinstance(shape, list) or len(shape) > SIG_DIMS or not all(count_ok(d) for d in shape)
        ):
            raise ReportError(f"{cw}: shape must be null or a list of at most {SIG_DIMS} counts")
        age = c.get("age_s", 0.0)
        if not seconds_ok(age):
            raise ReportError(f"{cw}: age_s must be a finite number of seconds >= 0")
        out.append(
            CollSig(group=group, shape=None if shape is None else tuple(shape), age_s=float(age), **counts, **texts)
        )
    return tuple(out)


def gpu_from_dict(val: Any, where: str) -> tuple[GpuStep, ...]:
    if not isinstance(val, list) or len(val) > MAX_STEPS_PER_RANK:
        raise ReportError(f"{where}: recent_gpu must be a list of at most {MAX_STEPS_PER_RANK}")
    out = []
    for j, g in enumerate(val):
        gw = f"{where}.recent_gpu[{j}]"
        if not isinstance(g, dict):
            raise ReportError(f"{gw} must be an object")
        step = get(g, "step", int, gw)
        secs = {k: get(g, k, NUM, gw) for k in GPU_FIELDS if k != "lag_s" or k in g}
        phase = get(g, "phase", str, gw) if "phase" in g else "train"
        if not count_ok(step) or not all(seconds_ok(v) for v in secs.values()) or len(phase) > SIG_TEXT:
            raise ReportError(f"{gw}: step must be a count and durations finite seconds >= 0")
        out.append(GpuStep(step=step, phase=phase, **{k: float(v) for k, v in secs.items()}))
    return tuple(out)


def summary_from(val: Any, where: str) -> tuple[float, ...]:
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


def summary_fast(val: Any) -> tuple[float, ...] | None:
    """``summary_from`` for a list of floats in range; None for anything else."""
    if type(val) is not list:
        return None
    if not val:
        return ()
    out = tuple(val)
    return None if stepsummary.problem(out) else out


def count_ok(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_COUNT


def seconds_ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v < MAX_SECONDS


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


def death_from_dict(val: Any, where: str) -> dict:
    if not isinstance(val, dict):
        raise ReportError(f"{where}: death must be an object")
    out: dict[str, Any] = {}
    for key, (typ, limit) in _DEATH_FIELDS.items():
        if key in val:
            x = get(val, key, typ, f"{where}.death")
            out[key] = x[:limit] if isinstance(x, str) else x
    exc = val.get("exception")
    if exc is not None:
        if not isinstance(exc, dict):
            raise ReportError(f"{where}.death: exception must be an object")
        out["exception"] = {k: str(exc.get(k, ""))[:1000] for k in _EXCEPTION_FIELDS}
    return out


def nested(colls: Any, gpu: Any) -> tuple[tuple[CollSig, ...], tuple[GpuStep, ...]] | None:
    """A fast-path rank's Flight Recorder signatures (nested and rarer) and GPU-side
    steps (only where a completion source runs), through the checking parsers;
    None for anything they refuse, or not a list (null, say): the checking path
    then names it."""
    if type(colls) is not list or type(gpu) is not list:
        return None
    try:
        return (
            colls_from_dict(colls, "ranks[]") if colls else (),
            gpu_from_dict(gpu, "ranks[]") if gpu else (),
        )
    except ReportError:
        return None
