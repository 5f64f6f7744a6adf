"""Version 1's checking path: a rank object (``HostReport.to_dict()``'s form,
as JSON decoded it) checked field by field against the field table, each
problem a ReportError naming the field. The common case takes the fast path
(``fast.py``) first, which accepts the same inputs with the same result."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import MISSING
from typing import Any

from . import checks, fast
from .fields import CollectiveState, RankState, StepSample
from .parse import colls_from_dict, death_from_dict, get, gpu_from_dict, summary_from
from .ranges import MAX_STEPS_PER_RANK, ReportError
from .table import COLL, FINER, SIMPLE, STEP

# A sample's fields in the order they are checked (which picks the message of a
# sample with several problems): the finer split first.
_STEP_ORDER = (*(f for f in STEP if f.name in FINER), *(f for f in STEP if f.name not in FINER))


def rank_from_dict(raw: Any, i: int) -> RankState:
    # The common case first: every field present with exactly its JSON type. At
    # 16,384 ranks this runs 16,384 times a second; anything unusual (a missing
    # field, a subclass, a wrong type) takes the checking path below, which
    # accepts the same inputs and names the field in its error.
    got = fast.fast_rank(raw) if type(raw) is dict else None
    if got is not None:
        return got
    where = f"ranks[{i}]"
    if not isinstance(raw, dict):
        raise ReportError(f"{where} must be an object")
    kw: dict[str, Any] = {}
    for f in SIMPLE:
        if f.name not in raw and f.default is not MISSING:
            continue
        val = get(raw, f.name, f.json, where)
        kw[f.name] = float(val) if f.type is float else val
    coll = get(raw, "coll", dict, where)
    try:
        kw["coll"] = CollectiveState(**{f.name: coll[f.name] for f in COLL if f.name in coll})
    except TypeError as exc:  # pragma: no cover - defensive
        raise ReportError(f"{where}.coll: {exc}") from None
    for f in COLL:
        val = getattr(kw["coll"], f.name)
        ok = isinstance(val, str) if f.type is str else isinstance(val, (int, float)) and not isinstance(val, bool)
        if not ok:
            raise ReportError(f"{where}.coll: field {f.name!r} has the wrong type")
    steps = raw.get("recent_steps", [])
    if not isinstance(steps, list) or len(steps) > MAX_STEPS_PER_RANK:
        raise ReportError(f"{where}: recent_steps must be a list of at most {MAX_STEPS_PER_RANK}")
    kw["recent_steps"] = tuple(_sample(s, f"{where}.recent_steps[{j}]") for j, s in enumerate(steps))
    kw["recent_colls"] = colls_from_dict(raw.get("recent_colls", []), where)
    kw["recent_gpu"] = gpu_from_dict(raw.get("recent_gpu", []), where)
    kw["step_summary"] = summary_from(raw.get("step_summary", []), where)
    kw["death"] = death_from_dict(raw.get("death", {}), where)
    if not 0 <= kw["rank"] < kw["world_size"]:
        raise ReportError(f"{where}: rank {kw['rank']} outside world size {kw['world_size']}")
    return RankState(**kw)


def _sample(s: Any, sw: str) -> StepSample:
    """One step sample; a field with a default may be absent (an older agent's),
    a text field is taken as its text."""
    if not isinstance(s, dict):
        raise ReportError(f"{sw} must be an object")
    kw: dict[str, Any] = {}
    for f in _STEP_ORDER:
        if f.default is not MISSING and f.name not in s:
            continue
        if f.type is str:
            kw[f.name] = str(s[f.name])
        else:
            val = get(s, f.name, f.json, sw)
            kw[f.name] = float(val) if f.type is float else val
    return StepSample(**kw)


def named(raw: Any) -> Any:
    """A version-1 rank entry's "rank" as sent, to name it when it is dropped."""
    return raw.get("rank") if isinstance(raw, dict) else None


def _unchecked(raw: Any, i: int) -> tuple[RankState, bool]:
    return rank_from_dict(raw, i), False


def tolerant_ranks(
    ranks_raw: list,
    dropped: list[tuple[int, Any, str]],
    parse: Callable[[Any, int], tuple[RankState, bool]] = _unchecked,
    named_of: Callable[[Any], Any] = named,
) -> Iterator[RankState]:
    """The ranks that can be accepted, the others noted in ``dropped``.
    ``parse(raw, i)``: (the rank, whether its values are known to be in range)."""
    seen: set[int] = set()
    for i, raw in enumerate(ranks_raw):
        name = named_of(raw)
        try:
            r, fine = parse(raw, i)
        except (ReportError, TypeError, ValueError, OverflowError) as exc:
            dropped.append((i, name, str(exc)[:300]))
            continue
        problem = "" if fine else checks.rank_problem(r)
        if not problem and r.rank in seen:
            problem = f"rank {r.rank} appears twice in one report"
        if problem:
            dropped.append((i, name, f"ranks[{i}]: {problem}"))
            continue
        seen.add(r.rank)
        yield r
