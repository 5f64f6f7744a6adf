"""batch_changed: the job came back from an elastic restart with another world
size, so its global batch is no longer the one its learning rate was tuned for.

Under torchrun elastic (``--nnodes=min:max``) a job that lost a host carries on
with fewer ranks; with a fixed per-rank batch the global batch shrinks by the
same factor, and a learning rate (and warm-up, and schedule) tuned for the old
batch may no longer fit. Nothing is wrong with any rank, so the finding names
none and is advisory: the policy never acts on it and no alert pages for it.

The old world size is the largest one any rank of the job reported (the ranks
beyond the new size keep their last state in the view); the new one is what
every live rank reports now. The configured ``--job.world-size`` is not used: an
elastic job may legitimately start below it.

Where the hook knows each rank's batch (the wrapped loader's ``batch_size``, its
first batch, or ``mon.set_batch_size``), the finding gives the global batch
before and after (the sum over the ranks) and the per-rank batch of each; a
script that rescaled its per-rank batch to keep the global batch raises
nothing: its learning rate still fits.
"""

from __future__ import annotations

from collections import Counter

from ...contracts.finding import Finding
from ..analysis.health import OK, classify_all, one_world
from ..config import DetectorConfig
from ..view import columns
from ..view.cluster import ClusterView


class BatchChanged:
    name = "batch_changed"

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        c = columns.of(view)
        if one_world(c):
            return []  # every rank, live or not, says one world size: no restart changed it
        sizes_all = c.world_size
        health = classify_all(view, now, self.cfg)
        live = [i for i, r in enumerate(c.rank) if health[r] == OK]
        if not live:
            return []
        sizes = {sizes_all[i] for i in live}
        if len(sizes) != 1:
            return []  # mid-restart: wait until the live ranks agree
        new = sizes.pop()
        if len(live) < new:
            return []  # (checked before the largest size ever reported: the cheap test first)
        old = max(sizes_all)
        if old == new:
            return []
        since = min(c.registered_at[i] for i in live if sizes_all[i] == new)
        # The old group's per-rank batch from its ranks still in the view (those
        # beyond the new size); the new one from the live ranks. 0: not known.
        old_batch = _per_rank([b for b, size in zip(c.batch_per_rank, sizes_all) if size == old])
        new_batches = [c.batch_per_rank[i] for i in live]
        new_batch = _per_rank(new_batches)
        old_global = old_batch * old if old_batch else 0
        new_global = sum(new_batches) if all(new_batches) else 0
        if old_global and new_global:
            ratio = new_global / old_global
            if old_global == new_global:
                return []  # the script rescaled its per-rank batch: the global batch, and its learning rate, hold
            reason = (
                f"the job restarted with {new} ranks instead of {old}: the global batch is {new_global} samples "
                f"instead of {old_global} ({new_batch} per rank, was {old_batch}), {ratio:.2g}x what it was, so a "
                f"learning rate tuned for the old batch may no longer fit (linear scaling would use {ratio:.2g}x "
                f"the learning rate, or keep the global batch with {old_global / new_global * new_batch:.0f} "
                "per rank or gradient accumulation)"
            )
        else:
            ratio = new / old
            reason = (
                f"the job restarted with {new} ranks instead of {old}: with the same per-rank batch the global "
                f"batch is {ratio:.2g}x what it was, so a learning rate tuned for the old batch may no longer fit "
                f"(linear scaling would use {ratio:.2g}x the learning rate, or keep the global batch with "
                f"{old / new:.2g}x the per-rank batch or gradient accumulation)"
            )
        evidence = {
            "old_world_size": old,
            "new_world_size": new,
            "global_batch_ratio": round(ratio, 4),
            "old_per_rank_batch": old_batch or None,  # None: the hook was not told (older hook, no wrapped loader)
            "per_rank_batch": new_batch or None,
            "old_global_batch": old_global or None,
            "new_global_batch": new_global or None,
        }
        return [
            Finding(
                kind=self.name,
                ranks=(),
                hosts=tuple(sorted({c.host[i] for i in live})),
                reason=reason,
                onset_mono=since,
                detected_mono=now,
                evidence=evidence,
            )
        ]


def _per_rank(batches: list[int]) -> int:
    """The per-rank batch most ranks report (0 when none knows it)."""
    known = Counter(b for b in batches if b > 0)
    return known.most_common(1)[0][0] if known else 0
