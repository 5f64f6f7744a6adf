"""Dotted command-line flags with ``WATCHDOG_`` environment fallbacks.

Every daemon declares its flags once as a tuple of ``Flag``; ``parse`` applies
the precedence CLI > environment > default and converts/validates each value,
so a bad ``WATCHDOG_*`` variable fails with the same clear message as a bad flag.
``--web.listen-address`` reads ``WATCHDOG_WEB_LISTEN_ADDRESS``.

Each ``Flag`` also names the config field it fills, and ``build`` makes the
daemon's frozen config dataclass from the parsed values: adding a flag is one
line in the table, and ``unmatched`` lets a test prove table and dataclass agree.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# Settings that every piece reads (hook, agent, coordinator), spelled once. Their
# environment variables follow the one rule of env_of: WATCHDOG_JOB_NAME,
# WATCHDOG_HOST_NAME, WATCHDOG_RUN_DIR.
JOB_NAME = "job.name"
HOST_NAME = "host.name"
RUN_DIR = "run-dir"
# Names the hook read before they were unified (issue #15). Still accepted, with
# one warning naming the variable to use; the new name wins when both are set.
OLD_ENV: dict[str, tuple[str, ...]] = {
    JOB_NAME: ("WATCHDOG_JOB",),
    HOST_NAME: ("WATCHDOG_HOST",),
}


class FlagError(ValueError):
    pass


@dataclass(frozen=True)
class Flag:
    name: str  # dotted, without the leading dashes: "web.listen-address"
    default: Any
    help: str
    convert: Callable[[str], Any] = str
    secret: bool = False  # never logged
    # The config dataclass field this flag fills ("" = none). Several flags may
    # name one field when the daemon computes it from all of them (the job token
    # from its file or inline flag): ``build`` then takes the computed value.
    field: str = ""
    # Deprecated environment variables still read (after ``env``), with a warning.
    old_env: tuple[str, ...] = ()

    @property
    def env(self) -> str:
        return env_of(self.name)

    @property
    def dest(self) -> str:
        return dest_of(self.name)


def env_of(name: str) -> str:
    """The environment variable a flag falls back to: "web.listen-address" -> "WATCHDOG_WEB_LISTEN_ADDRESS"."""
    return "WATCHDOG_" + dest_of(name).upper()


def dest_of(name: str) -> str:
    """The key of a flag's value in ``parse``'s result: "web.listen-address" -> "web_listen_address"."""
    return name.replace(".", "_").replace("-", "_")


def positive_float(text: str) -> float:
    val = float(text)
    if not val > 0:
        raise ValueError("must be > 0")
    return val


def non_negative_float(text: str) -> float:
    val = float(text)
    if not val >= 0:
        raise ValueError("must be >= 0")
    return val


def positive_int(text: str) -> int:
    val = int(text)
    if val <= 0:
        raise ValueError("must be > 0")
    return val


def boolean(text: str) -> bool:
    low = str(text).strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be one of 1/0, true/false, yes/no, on/off")


def listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:19400 (port 0 picks a free one)")
    return (host.strip("[]") or "0.0.0.0", int(port))


def build_parser(prog: str, description: str, flags: Sequence[Flag]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for f in flags:
        shown = "(secret)" if f.secret else repr(f.default)
        parser.add_argument(
            f"--{f.name}",
            dest=f.dest,
            default=None,
            metavar=f.name.rsplit(".", 1)[-1].upper().replace("-", "_"),
            help=f"{f.help} [env {f.env}; default {shown}]",
        )
    return parser


def parse(
    prog: str,
    description: str,
    flags: Sequence[Flag],
    argv: Sequence[str] | None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Returns {dest: value}. argparse exits (status 2) on unknown flags; a value
    that does not convert raises FlagError naming the flag and where it came from."""
    environ = os.environ if environ is None else environ
    ns = build_parser(prog, description, flags).parse_args(argv)
    out: dict[str, Any] = {}
    for f in flags:
        raw, origin = getattr(ns, f.dest), f"--{f.name}"
        if raw is None and f.env in environ:
            raw, origin = environ[f.env], f.env
        if f.old_env and getattr(ns, f.dest) is None and not (raw or "").strip():  # env unset or empty
            old = next((v for v in f.old_env if environ.get(v, "").strip()), None)
            if old is not None:
                raw, origin = environ[old], old
        if raw is None:
            # A text default is what a user would type: convert it like a typed
            # value, so callers always get the converted type (a listen address
            # default comes back as (host, port), not "host:port").
            out[f.dest] = f.convert(f.default) if isinstance(f.default, str) else f.default
            continue
        try:
            out[f.dest] = f.convert(raw)
        except (TypeError, ValueError) as exc:
            shown = "<secret>" if f.secret else repr(raw)
            raise FlagError(f"{origin}={shown}: {exc}") from None
    return out


def deprecated_env(name: str, environ: Mapping[str, str]) -> str | None:
    """The warning for a deprecated variable of setting ``name`` found in ``environ``
    (None when none is set). One message, for the hook and the daemons alike."""
    new = env_of(name)
    for old in OLD_ENV.get(name, ()):
        if environ.get(old, "").strip() == "":
            continue
        if environ.get(new, "").strip() != "":
            return f"{old} is deprecated and ignored: {new} is set and wins; unset {old}"
        return f"{old} is deprecated: set {new} instead (the name the hook, agent and coordinator all read)"
    return None


def deprecations(flags: Sequence[Flag], environ: Mapping[str, str] | None = None) -> list[str]:
    """Warnings for every deprecated variable the daemon's flags read from ``environ``."""
    environ = os.environ if environ is None else environ
    return [w for w in (deprecated_env(f.name, environ) for f in flags if f.old_env) if w]


def loggable(flags: Sequence[Flag], values: Mapping[str, Any]) -> dict[str, Any]:
    """The effective config for the start-up log line, secrets masked."""
    return {f.name: ("<set>" if values.get(f.dest) else "<unset>") if f.secret else values.get(f.dest) for f in flags}


def build(cls: type[T], flags: Sequence[Flag], values: Mapping[str, Any], **computed: Any) -> T:
    """Instantiate the frozen dataclass ``cls``: each flag's parsed value goes to the
    field it names, ``computed`` supplies the fields the daemon derives (and wins
    where flags also name that field); fields left out keep their defaults."""
    kwargs: dict[str, Any] = {}
    for f in flags:
        if not f.field or f.field in computed:
            continue
        if f.field in kwargs:
            raise TypeError(f"flags {f.name!r} and another both fill {cls.__name__}.{f.field}; compute it instead")
        kwargs[f.field] = values[f.dest]
    return cls(**kwargs, **computed)


def unmatched(cls: type, flags: Sequence[Flag], not_from_flags: Sequence[str] = ()) -> list[str]:
    """What keeps a flag table and its dataclass from matching (empty = they match):
    a flag naming no field or a missing one, an init field no flag fills that is not
    in ``not_from_flags``. For tests: adding a flag or a field cannot forget the other."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    problems = [f"flag --{f.name} fills no field" for f in flags if not f.field]
    problems += [
        f"flag --{f.name} names {cls.__name__}.{f.field}, which does not exist"
        for f in flags
        if f.field and f.field not in names
    ]
    filled = {f.field for f in flags} | set(not_from_flags)
    problems += [f"{cls.__name__}.{n} has no flag" for n in sorted(names - filled)]
    return problems
