"""Frozen slots dataclasses built fast: the report's records, of which the
coordinator builds one per rank per report (and ~256 step samples a rank)."""

from __future__ import annotations

from dataclasses import field, fields, make_dataclass
from typing import Any, TypeVar, cast

_T = TypeVar("_T")


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


def twin(cls: type) -> type:
    """The unfrozen twin of a ``twinned`` class (an instance of it becomes a
    ``cls`` by ``__class__`` assignment)."""
    return _TWINS[cls]


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


def built(cls: type[_T], values: dict[str, Any]) -> _T:
    """``made`` from every field's value by name, in any order."""
    names = _NAMES.get(cls) or _NAMES.setdefault(cls, tuple(f.name for f in fields(cls)))  # type: ignore[arg-type]
    return made(cls, *map(values.__getitem__, names))


_NAMES: dict[type, tuple[str, ...]] = {}
