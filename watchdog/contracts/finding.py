"""Findings: what a detector concluded, with a reason a person reads at 03:00.

Kinds are an API (alerts, journals, dashboards key on them); see KINDS.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = (
    "dead_rank",
    "frozen_rank",
    "collective_hang",
    "straggler",
    "never_joined",
    "loader_starvation",
    "loss_anomaly",
    "batch_changed",
    "collective_mismatch",
    "periodic_stall",
    "host_unobserved",
    "wedged",
    "extra_work",
)
# Kinds that explain rather than accuse: they name no culprit, the policy never
# acts on them and no alert pages for them.
ADVISORY_KINDS = frozenset({"batch_changed", "periodic_stall", "host_unobserved", "extra_work"})
# Kinds that name where, not who: their hosts are never culprits (the per-host
# culprit counters, the restart-loop breaker's history). host_unobserved is about
# the monitor; wedged is every rank stopped together (a fabric, driver or
# filesystem wedge), nobody's fault.
BLAMELESS_KINDS = frozenset({"host_unobserved", "wedged"})
ACTIONABLE_KINDS = tuple(k for k in KINDS if k not in ADVISORY_KINDS)


@dataclass(frozen=True)
class Finding:
    kind: str
    ranks: tuple[int, ...]  # the culprits, sorted; () when no culprit could be named
    hosts: tuple[str, ...]
    reason: str  # one line, for a person
    onset_mono: float  # coordinator monotonic estimate of when it began
    detected_mono: float
    evidence: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    wants_stacks: tuple[int, ...] = ()  # ranks whose Python stacks would confirm it
    onset_wall: float = 0.0  # filled by the daemon from its one clock reading per tick
    detected_wall: float = 0.0

    @property
    def key(self) -> tuple[str, tuple[int, ...]]:
        """Dedupe key: the same kind blaming the same ranks is the same finding."""
        return (self.kind, self.ranks)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ranks"] = list(self.ranks)
        out["hosts"] = list(self.hosts)
        out["wants_stacks"] = list(self.wants_stacks)
        return out


def rank_ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 4, 5, 6, 7] -> '0-2,4-7': readable for 1000 ranks too."""
    items = sorted(set(ranks))
    breaks: list[int] = []  # k where items[k] does not follow items[k - 1]
    if items:
        _breaks(items, 0, len(items), breaks)
    starts, ends = [0, *breaks], [*breaks, len(items)]
    return ",".join(
        str(items[i]) if j - i == 1 else f"{items[i]}-{items[j - 1]}" for i, j in zip(starts, ends) if j > i
    )


def _breaks(items: list[int], lo: int, hi: int, out: list[int]) -> None:
    """Appends, in order, each k in (lo, hi) where ``items[k]`` does not follow
    ``items[k - 1]`` (``items`` sorted and distinct). A slice whose ends are as far
    apart as its length has none, so a hang's 16,383 waiters with one gap cost ~30
    checks, not a step per rank (~2 ms on every tick of the hang); short slices are
    walked rank by rank (scattered ranks cost what they did)."""
    if items[hi - 1] - items[lo] == hi - 1 - lo:
        return
    if hi - lo <= 32:
        out += [k for k in range(lo + 1, hi) if items[k] != items[k - 1] + 1]
        return
    mid = (lo + hi) // 2
    _breaks(items, lo, mid, out)
    if items[mid] != items[mid - 1] + 1:
        out.append(mid)
    _breaks(items, mid, hi, out)


def ranks_phrase(ranks: Iterable[int]) -> str:
    items = sorted(set(ranks))
    return f"rank {items[0]}" if len(items) == 1 else f"ranks {rank_ranges(items)}"


def group_name(group: int) -> str:
    return "the default group" if group == 0 else f"group {group:#x}"


def seconds(value: float) -> str:
    """Durations as people read them: 85 ms, 12.4 s, 31.0 min."""
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.1f} s" if value < 600 else f"{value / 60:.1f} min"
