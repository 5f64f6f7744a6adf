"""Failure fingerprints: is this the failure we already restarted for?

A fingerprint says where a failure happened (kind; the collective's group and
op; the step; the innermost frames of the culprit's stack) and on what (the
culprit hosts and ranks). Two questions are asked of it, each with its remedy:

- **same host**: the same kind of failure with a culprit on a host that was a
  culprit before. The host is the common factor: exclude it.
- **same place**: the same kind of failure at the same place in the code (and
  step) with culprits on other hosts. Nothing about a host: the failure is
  deterministic, and restarting again spends the budget for nothing.

What is known when. A finding carries kind, culprits, group/seq/op and the
culprits' step from the first tick; the culprit's stack arrives later (stack
evidence is gathered after the finding, ``stack_gather``), often after the
policy has acted (``min_finding_age_seconds``). So frames are compared only when
both fingerprints have them, and a fingerprint is completed (``with_frames``)
when its stacks arrive: the first occurrence, which a restart was spent on, has
its frames by the time the failure comes back. ``seq`` is recorded but not
compared: collective sequence numbers count from process start, and a restarted
incarnation resumed from another checkpoint reaches the same place at another
number.

Pure: built from a Finding (and the frames a ``stack_groups`` record gave).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

# Kinds with no place in the code: a straggler is slow everywhere. The same
# straggler is the same rank(s); another rank slow after the restart is a new
# failure, not a deterministic one (on one host every straggler would otherwise
# be "the same place").
CULPRIT_IS_PLACE = frozenset({"straggler"})
MAX_FRAMES = 3  # innermost frames compared: deeper ones are the same launcher frames on every failure


@dataclass(frozen=True)
class Fingerprint:
    kind: str
    hosts: tuple[str, ...]  # culprit hosts
    ranks: tuple[int, ...]  # culprit ranks
    group: int | None = None
    seq: int | None = None  # recorded, not compared (see the module docstring)
    op: str = ""
    step: int | None = None  # the culprits' step, when they agree
    frames: tuple[str, ...] = ()  # innermost first, "func (file:line)"; () until stacks arrive

    def with_frames(self, frames: Iterable[str]) -> Fingerprint:
        return replace(self, frames=tuple(frames)[:MAX_FRAMES])

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "hosts": list(self.hosts),
            "ranks": list(self.ranks),
            "group": self.group,
            "seq": self.seq,
            "op": self.op,
            "step": self.step,
            "frames": list(self.frames),
        }

    def place(self) -> str:
        """The place in words, for a reason line (after the kind)."""
        parts = [self.op] if self.op else []
        if self.kind in CULPRIT_IS_PLACE:
            parts.append(f"on rank{'s' if len(self.ranks) != 1 else ''} {', '.join(map(str, self.ranks))}")
        if self.step is not None:
            parts.append(f"at step {self.step}")
        if self.frames:
            parts.append(f"in {self.frames[0]}")
        return " ".join(parts)


def of(finding: Any, frames: Iterable[str] = ()) -> Fingerprint:
    """The fingerprint of a Finding: what its evidence says, plus stack frames when known."""
    ev: Mapping[str, Any] = finding.evidence if isinstance(getattr(finding, "evidence", None), Mapping) else {}
    raw = ev.get("culprits")
    culprits: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    steps = {c.get("step") for c in culprits.values() if isinstance(c, Mapping) and _int(c.get("step"))}
    step = steps.pop() if len(steps) == 1 else (ev.get("step") if _int(ev.get("step")) else None)
    return Fingerprint(
        kind=finding.kind,
        hosts=tuple(sorted(set(finding.hosts))),
        ranks=tuple(finding.ranks),
        group=ev.get("group") if _int(ev.get("group")) else None,
        seq=ev.get("seq") if _int(ev.get("seq")) else None,
        op=str(ev.get("op") or ""),
        step=step,
        frames=tuple(frames)[:MAX_FRAMES],
    )


def from_dict(d: Any) -> Fingerprint | None:
    """A journaled fingerprint (``to_dict``) back, or None when it is not one:
    the journal is read after a crash and may hold anything."""
    if not isinstance(d, Mapping) or not isinstance(d.get("kind"), str):
        return None
    hosts, ranks, frames = d.get("hosts"), d.get("ranks"), d.get("frames")
    return Fingerprint(
        kind=d["kind"],
        hosts=tuple(h for h in hosts if isinstance(h, str)) if isinstance(hosts, list) else (),
        ranks=tuple(r for r in ranks if _int(r)) if isinstance(ranks, list) else (),
        group=d["group"] if _int(d.get("group")) else None,
        seq=d["seq"] if _int(d.get("seq")) else None,
        op=d["op"] if isinstance(d.get("op"), str) else "",
        step=d["step"] if _int(d.get("step")) else None,
        frames=tuple(f for f in frames if isinstance(f, str))[:MAX_FRAMES] if isinstance(frames, list) else (),
    )


def culprit_frames(record: Mapping[str, Any]) -> tuple[str, ...]:
    """The innermost frames of the culprit's stack group in a ``stack_groups``
    record, as "func (file:line)"; () when no culprit group has frames."""
    for g in record.get("groups") or ():
        if isinstance(g, Mapping) and g.get("culprit") and g.get("frames"):
            try:
                return tuple(f"{f[0]} ({f[1]}:{f[2]})" for f in g["frames"][:MAX_FRAMES])
            except (TypeError, IndexError, KeyError):
                return ()
    return ()


def same_place(a: Fingerprint, b: Fingerprint) -> bool:
    """Same kind at the same place: op and group always, step and frames where both know them."""
    if a.kind != b.kind or a.op != b.op or a.group != b.group:
        return False
    if a.kind in CULPRIT_IS_PLACE and a.ranks != b.ranks:
        return False
    if a.step is not None and b.step is not None and a.step != b.step:
        return False
    return not (a.frames and b.frames and a.frames != b.frames)


def same_host(a: Fingerprint, b: Fingerprint) -> bool:
    """Same kind with a culprit host in common."""
    return a.kind == b.kind and bool(set(a.hosts) & set(b.hosts))


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
