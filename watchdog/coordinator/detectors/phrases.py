"""Phrases for finding reasons, shared so every detector speaks alike."""

from __future__ import annotations

from ...contracts.finding import group_name, seconds
from ..view.cluster import FoldedRank


def who(rv: FoldedRank) -> str:
    return f"rank {rv.rank} (host {rv.host}, pid {rv.state.pid})"


def where(rv: FoldedRank, now: float) -> str:
    """Where a rank was last seen: what a person looks at first."""
    s = rv.state
    if s.pg_state in ("none", "initializing"):
        return "before process-group init" if s.pg_state == "none" else "inside init_process_group (rendezvous)"
    if s.in_data_wait:
        return f"in the data loader (waiting {seconds(rv.age(s.data_wait_age_s, now))}) at step {s.step}"
    if s.coll.outstanding > 0:
        return f"in {s.coll.op} #{s.coll.seq} on {group_name(s.coll.group)} at step {s.step}"
    phase = f"in {s.phase}" if s.phase not in ("train", "") else "in training code"
    if s.frame and s.frame_step == s.step + 1:  # its hook sampled where, in this step (hook/frames.py)
        phase += f", in {s.frame}"
    return f"{phase}, outside collectives and data loading, at step {s.step}"


def heartbeat(rv: FoldedRank, now: float, frozen_s: float) -> str:
    age = rv.heartbeat_age(now)
    return f"heartbeat {'stale' if rv.state.heartbeat_age_s > frozen_s else 'fresh'} ({seconds(age)})"


def hosts_of(views: list[FoldedRank]) -> tuple[str, ...]:
    return tuple(sorted({rv.host for rv in views}))
