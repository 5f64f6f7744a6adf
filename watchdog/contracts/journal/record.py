"""A journal record: one frozen dataclass per event type, one serializer, one tolerant parser.

A record class names its event (``EVENT``) and declares its payload fields in the
order they are written: ``to_dict`` is ``event``, ``t_wall``, ``t_mono``, the
fields, then ``extra`` (what this version does not know), so a record built by a
writer gives the line the journal has always had. A field made with
``optional(...)`` is left out of the line while it holds its default (a field
written only when it says something); a field made with ``absent()`` is left out
while it is ``ABSENT`` and written otherwise, ``null`` included (a field a writer
sometimes leaves out and sometimes writes as ``null``: the line tells the two apart,
and so does the record).

``from_dict`` reads any line, old or hostile, without raising: a field missing
takes its default; a field of the wrong type takes its default too and keeps its
value in ``extra`` (so ``to_dict`` gives back what was read); an unknown field
goes to ``extra``. The journal is read, never trusted.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

R = TypeVar("R", bound="Record")

_OMIT = "omit_default"
_KEY = "key"


def optional(default: Any = None, *, key: str = "") -> Any:
    """A field written only when it is not ``default`` (``key``: its name in the line).
    A field a writer writes as ``null`` is not one of these (it would be left out): ``absent()`` is."""
    meta = {_OMIT: True, **({_KEY: key} if key else {})}
    if isinstance(default, (list, dict)):
        return field(default_factory=type(default), metadata=meta)
    return field(default=default, metadata=meta)


class Absent:
    """The value of an ``absent()`` field the line does not hold: falsy, and one instance."""

    _one: ClassVar[Absent | None] = None

    def __new__(cls) -> Absent:
        if cls._one is None:
            cls._one = super().__new__(cls)
        return cls._one

    def __bool__(self) -> Literal[False]:
        return False

    def __repr__(self) -> str:
        return "ABSENT"

    def __reduce__(self) -> str:
        return "ABSENT"


ABSENT = Absent()


def absent(*, key: str = "") -> Any:
    """A field left out of the line while it is ``ABSENT`` and written otherwise: a
    writer's ``None`` is the line's ``null``, and a line's ``null`` reads as ``None``."""
    return field(default=ABSENT, metadata={_OMIT: True, **({_KEY: key} if key else {})})


@dataclass(frozen=True, kw_only=True)
class Record:
    """A journal record of event ``EVENT``: its stamps, its fields, and what it held besides."""

    EVENT: ClassVar[str] = ""

    t_wall: float | None = None  # stamped by the journal when written; None: not (a line without one)
    t_mono: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def event(self) -> str:
        return self.EVENT

    def payload(self) -> dict[str, Any]:
        """The fields as the line holds them, after ``event``, ``t_wall`` and ``t_mono``."""
        out: dict[str, Any] = {}
        for f, key, omit, default in _layout(type(self)):
            value = getattr(self, f)
            if not (omit and value == default):
                out[key] = value
        out.update(self.extra)
        return out

    def to_dict(self) -> dict[str, Any]:
        stamps = {k: v for k, v in (("t_wall", self.t_wall), ("t_mono", self.t_mono)) if v is not None}
        return {"event": self.event, **stamps, **self.payload()}

    def has(self, key: str) -> bool:
        """Whether the line holds field ``key`` (an optional field at its default: only if read so)."""
        if key in self.extra:
            return True
        return any(k == key and not (omit and getattr(self, a) == d) for a, k, omit, d in _layout(type(self)))

    @classmethod
    def from_dict(cls: type[R], d: Mapping[str, Any]) -> R:
        values, factories = _defaults(cls)
        values = dict(values)
        for attr, factory in factories:
            values[attr] = factory()
        extra: dict[str, Any] = {}
        fields = _readers(cls)
        for key, value in d.items():
            known = fields.get(key)
            if known is not None:
                attr, allowed, not_bool, omit, default = known
                # The type check inline (one call per field less: replay and the timeline parse every line).
                fits = isinstance(value, allowed) and not (not_bool and value.__class__ is bool)
                if fits and not (omit and value == default):
                    values[attr] = value
                    continue
            if key not in _NOT_FIELDS:  # unknown, of the wrong type, or an optional field written at its default
                extra[key] = value  # kept as read
        values["extra"] = extra
        # Filled in place of the frozen dataclass's __init__ (one setattr per field): a
        # coordinator restarted on a journal of millions of lines parses each one it replays.
        rec = object.__new__(cls)
        rec.__dict__.update(values)
        return rec


@dataclass(frozen=True, kw_only=True)
class Unknown(Record):
    """A record of an event this version does not know: its name, and its fields as read."""

    name: str = ""

    @property
    def event(self) -> str:
        return self.name

    @classmethod
    def from_dict(cls: type[R], d: Mapping[str, Any]) -> R:
        base = Record.from_dict(d)
        return cls(t_wall=base.t_wall, t_mono=base.t_mono, extra=base.extra, name=str(d.get("event", "")))  # type: ignore[call-arg]

    def payload(self) -> dict[str, Any]:
        return dict(self.extra)


_BASE = frozenset(f.name for f in dataclasses.fields(Record))


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


_NOT_FIELDS = frozenset({"event", "mac"})
_LAYOUTS: dict[type, tuple[tuple[str, str, bool, Any], ...]] = {}
_DEFAULTS: dict[type, tuple[dict[str, Any], tuple[tuple[str, Callable[[], Any]], ...]]] = {}


def _defaults(cls: type[Record]) -> tuple[dict[str, Any], tuple[tuple[str, Callable[[], Any]], ...]]:
    """Every field's default: (plain defaults, (attribute, factory) for the rest)."""
    got = _DEFAULTS.get(cls)
    if got is None:
        plain = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        made = tuple(
            (f.name, f.default_factory)
            for f in dataclasses.fields(cls)
            if f.default_factory is not dataclasses.MISSING and f.name != "extra"
        )
        got = _DEFAULTS[cls] = (plain, made)
    return got


_Reader = tuple[str, tuple[type, ...], bool, bool, Any]
_READERS: dict[type, dict[str, _Reader]] = {}


def _layout(cls: type[Record]) -> tuple[tuple[str, str, bool, Any], ...]:
    """(attribute, key in the line, left out at its default, default) per payload field, in order."""
    got = _LAYOUTS.get(cls)
    if got is None:
        got = _LAYOUTS[cls] = tuple(
            (f.name, f.metadata.get(_KEY, f.name), bool(f.metadata.get(_OMIT)), _default(f))
            for f in dataclasses.fields(cls)
            if f.name not in _BASE
        )
    return got


def layout(cls: type[Record]) -> tuple[tuple[str, str, bool, Any], ...]:
    """(attribute, key in the line, left out at its default, default) per payload
    field of record class ``cls``, in the order a line holds them (the reference docs)."""
    return _layout(cls)


def _readers(cls: type[Record]) -> dict[str, _Reader]:
    """Key in the line -> (attribute, the types a value read from a line may have, a bool
    refused, left out at its default, default)."""
    got = _READERS.get(cls)
    if got is not None:
        return got
    hints = typing.get_type_hints(cls)
    stamp = (*_check(float), False, None)
    out: dict[str, _Reader] = {"t_wall": ("t_wall", *stamp), "t_mono": ("t_mono", *stamp)}
    for attr, key, omit, default in _layout(cls):
        out[key] = (attr, *_check(hints[attr]), omit, default)
    _READERS[cls] = out
    return out


def _check(tp: Any) -> tuple[tuple[type, ...], bool]:
    """The types a JSON value fitting annotation ``tp`` may have, and whether a bool is
    refused though ``int`` is among them (a bool is not a number here). Elements of
    containers are not checked: the readers check what they use, as they always did."""
    if tp is Any:
        return (object,), False
    allowed = _types(tp)
    return allowed, int in allowed and bool not in allowed


def _types(tp: Any) -> tuple[type, ...]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(t for a in typing.get_args(tp) for t in _types(a))
    base = typing.get_origin(tp) or tp
    if base is float:
        return (int, float)
    if base in (list, tuple):
        return (list,)
    if base in (dict, Mapping):
        return (dict,)
    return (base,)
