"""A command's trigger (the finding or action it serves) as the per-host lines carry it.

Every request a finding's evidence plan sends, and every answer, is a journal
line that names its trigger, so a reader can put the answers of one finding
together. A job-wide stall names every rank: at 16,384 ranks the full list is
~90 KB, and the plan asks each of 2,048 hosts three times, so those lines were
~1.1 GB of journal and ~25 s of the request loop's CPU (JSON of the list in
every line, and a key made of it for every answer;
``benchmarks/evidence_fanout.py``). Past ``MAX_RANKS`` ranks the lines carry
the first ``MAX_RANKS``, how many there are and a digest of all of them, which
still tells two findings apart; the ``finding`` line and the ``stack_groups``
record, one each per finding, keep the full list.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ...contracts.finding import ranks_phrase

MAX_RANKS = 64


def brief(trigger: dict[str, Any]) -> dict[str, Any]:
    """``trigger`` with at most ``MAX_RANKS`` ranks (itself when it has no more;
    a brief trigger is its own brief)."""
    ranks = trigger.get("ranks")
    if not isinstance(ranks, list) or len(ranks) <= MAX_RANKS or "ranks_total" in trigger:
        return trigger
    return {**trigger, "ranks": ranks[:MAX_RANKS], "ranks_total": len(ranks), "ranks_digest": digest(ranks)}


def digest(ranks: list[Any]) -> str:
    """Of the whole list, in its order (journal readers get the values back as written)."""
    return hashlib.sha256(",".join(map(str, ranks)).encode()).hexdigest()[:16]


def key(trigger: dict[str, Any]) -> str:
    """Equal for a trigger and its brief: what groups a finding's lines."""
    return json.dumps(brief(trigger), sort_keys=True, default=str)


def named(trigger: dict[str, Any]) -> str:
    """For people: "ranks 0-63 and 16,320 more", "rank 2", or "" when it names none."""
    ranks = [r for r in trigger.get("ranks") or () if isinstance(r, int) and not isinstance(r, bool)]
    if not ranks:
        return ""
    total = trigger.get("ranks_total")  # only a brief trigger has more ranks than it lists
    more = total - len(ranks) if isinstance(total, int) and not isinstance(total, bool) else 0
    return ranks_phrase(ranks) + (f" and {more:,} more" if more > 0 else "")
