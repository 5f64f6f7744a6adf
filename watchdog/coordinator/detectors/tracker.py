"""De-duplicate findings while their condition lasts and record when it ends.

Pure: ``update`` takes the active set, this tick's findings and ``now`` and
returns the new active set, the findings that opened and the ones resolved. A
finding resolves once absent for ``grace_s`` (so a condition hovering at its
threshold does not flap open/resolved every tick), and only if its detector ran
this tick.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from ...contracts.finding import Finding

Key = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class Active:
    first: Finding  # as opened (and journaled)
    latest: Finding  # as seen most recently (the status API shows this one)
    last_seen: float


@dataclass(frozen=True)
class Resolved:
    finding: Finding  # the latest version
    opened: Finding
    resolved_mono: float

    @property
    def duration_s(self) -> float:
        return max(0.0, self.resolved_mono - self.opened.onset_mono)


def update(
    active: Mapping[Key, Active],
    findings: Iterable[Finding],
    now: float,
    ran: Iterable[str],
    grace_s: float = 0.0,
) -> tuple[dict[Key, Active], list[Finding], list[Resolved]]:
    ran = set(ran)
    out: dict[Key, Active] = {}
    opened: list[Finding] = []
    for f in findings:
        if f.key in out:
            continue  # the same kind blaming the same ranks twice in one tick
        prev = active.get(f.key)
        if prev is None:
            opened.append(f)
            out[f.key] = Active(first=f, latest=f, last_seen=now)
        else:
            # Keep the first onset: a re-estimate must not make a long fault look young.
            out[f.key] = Active(
                first=prev.first,
                latest=replace(f, onset_mono=prev.first.onset_mono, onset_wall=prev.first.onset_wall),
                last_seen=now,
            )
    resolved: list[Resolved] = []
    for key, prev in active.items():
        if key in out:
            continue
        if key[0] not in ran or now - prev.last_seen < grace_s:
            out[key] = prev
        else:
            resolved.append(Resolved(finding=prev.latest, opened=prev.first, resolved_mono=now))
    return out, opened, resolved
