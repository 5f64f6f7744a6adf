"""The policy file: its TOML format and the frozen ``Policy`` it parses to.

Alert-only is the default for every kind: a monitor must never become the thing
that kills healthy jobs, so destructive actions are opt-in through a policy file::

    [actions]                  # finding kind -> action
    dead_rank = "restart"
    collective_hang = "abort"
    straggler = "checkpoint_restart"

    [limits]
    dry_run = false            # journal what would be done, do nothing
    max_restarts = 3           # per job
    max_restarts_per_hour = 2
    cooldown_seconds = 60      # after any action, before the next
    min_finding_age_seconds = 5   # a finding must persist this long first
    checkpoint_timeout_seconds = 120
    abort_grace_seconds = 10   # SIGTERM -> SIGKILL
    resume_timeout_seconds = 300  # a restarted group not stepping by then: restart failed

    [repeats]                  # the restart-loop breaker (control/repeats.py)
    same_host = "exclude_host_restart"
    same_place = "abort"
    after = 1

What the policy does with it is control/policy.py's ``plan``. Kept beside
``config.py`` (which holds the parsed ``Policy``), below the rooms that act on it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..contracts.finding import ADVISORY_KINDS, KINDS
from .vocabularies import ACTIONS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

OFF = "off"  # a [repeats] rule switched off
ESCALATIONS = ("abort", "exclude_host_restart", OFF)


class PolicyError(ValueError):
    pass


@dataclass(frozen=True)
class Repeats:
    """The [repeats] section: what a repeated failure escalates to (control/repeats.py)."""

    same_host: str = "exclude_host_restart"
    same_place: str = "abort"
    after: int = 1


@dataclass(frozen=True)
class Policy:
    actions: Mapping[str, str] = field(default_factory=dict)  # kind -> action; missing kinds alert
    dry_run: bool = False
    max_restarts: int = 3
    max_restarts_per_hour: int = 2
    cooldown_s: float = 60.0
    min_finding_age_s: float = 5.0
    checkpoint_timeout_s: float = 120.0
    abort_grace_s: float = 10.0
    repeats: Repeats = field(default_factory=Repeats)
    resume_timeout_s: float = 300.0

    def action_for(self, kind: str) -> str:
        return self.actions.get(kind, "alert")


_LIMITS = {
    "dry_run": ("dry_run", bool),
    "max_restarts": ("max_restarts", int),
    "max_restarts_per_hour": ("max_restarts_per_hour", int),
    "cooldown_seconds": ("cooldown_s", float),
    "min_finding_age_seconds": ("min_finding_age_s", float),
    "checkpoint_timeout_seconds": ("checkpoint_timeout_s", float),
    "abort_grace_seconds": ("abort_grace_s", float),
    "resume_timeout_seconds": ("resume_timeout_s", float),
}


def parse_policy(text: str, source: str = "policy") -> Policy:
    """Parse and validate a TOML policy; every mistake is a PolicyError naming it."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source}: not valid TOML: {exc}") from None
    unknown = set(doc) - {"actions", "limits", "repeats"}
    if unknown:
        raise PolicyError(f"{source}: unknown section(s) {sorted(unknown)}; expected [actions], [limits], [repeats]")
    actions = doc.get("actions", {})
    for kind, action in actions.items():
        if kind not in KINDS:
            raise PolicyError(f"{source}: [actions] unknown finding kind {kind!r}; kinds are {', '.join(KINDS)}")
        if action not in ACTIONS:
            raise PolicyError(f"{source}: [actions] {kind} = {action!r}; actions are {', '.join(ACTIONS)}")
        if kind in ADVISORY_KINDS and action != "alert":
            raise PolicyError(f'{source}: [actions] {kind} is advisory (nothing is broken): it can only be "alert"')
    kw = {}
    for key, value in doc.get("limits", {}).items():
        if key not in _LIMITS:
            raise PolicyError(f"{source}: [limits] unknown key {key!r}; keys are {', '.join(_LIMITS)}")
        attr, typ = _LIMITS[key]
        ok = isinstance(value, bool) if typ is bool else isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or (typ is not bool and value < 0):
            raise PolicyError(
                f"{source}: [limits] {key} = {value!r} must be a {'boolean' if typ is bool else 'number >= 0'}"
            )
        kw[attr] = typ(value)
    rep = doc.get("repeats", {})
    if not isinstance(rep, dict):
        raise PolicyError(f"{source}: [repeats] must be a table")
    return Policy(actions=dict(actions), repeats=_parse_repeats(rep, source), **kw)


def load_policy(path: str) -> Policy:
    try:
        with open(path, encoding="utf-8") as f:
            return parse_policy(f.read(), source=path)
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc.strerror}") from None


def _parse_repeats(doc: Mapping[str, Any], source: str) -> Repeats:
    """The [repeats] section; every mistake is a PolicyError naming it."""
    known = {"same_host", "same_place", "after"}
    unknown = set(doc) - known
    if unknown:
        raise PolicyError(f"{source}: [repeats] unknown key(s) {sorted(unknown)}; keys are {', '.join(sorted(known))}")
    kw: dict[str, Any] = {}
    for key in ("same_host", "same_place"):
        if key in doc:
            if doc[key] not in ESCALATIONS:
                raise PolicyError(f"{source}: [repeats] {key} = {doc[key]!r}; choose one of {', '.join(ESCALATIONS)}")
            kw[key] = doc[key]
    if "after" in doc:
        v = doc["after"]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise PolicyError(f"{source}: [repeats] after = {v!r} must be an integer >= 1")
        kw["after"] = v
    return Repeats(**kw)
