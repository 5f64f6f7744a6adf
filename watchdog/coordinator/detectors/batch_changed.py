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
"""

from __future__ import annotations

from ..config import DetectorConfig
from ..finding import Finding
from ..health import OK, classify_all
from ..view import ClusterView


class BatchChanged:
    name = "batch_changed"

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg

    def check(self, now: float, view: ClusterView) -> list[Finding]:
        health = classify_all(view, now, self.cfg)
        live = [rv for r, rv in view.ranks.items() if health[r] == OK]
        if not live:
            return []
        sizes = {rv.state.world_size for rv in live}
        if len(sizes) != 1:
            return []  # mid-restart: wait until the live ranks agree
        new = sizes.pop()
        old = max(rv.state.world_size for rv in view.ranks.values())
        if old == new or len(live) < new:
            return []
        since = min(rv.registered_at for rv in live if rv.state.world_size == new)
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
            "per_rank_batch": None,
        }  # the hook does not know the batch size (yet)
        return [
            Finding(
                kind=self.name,
                ranks=(),
                hosts=tuple(sorted({rv.host for rv in live})),
                reason=reason,
                onset_mono=since,
                detected_mono=now,
                evidence=evidence,
            )
        ]
