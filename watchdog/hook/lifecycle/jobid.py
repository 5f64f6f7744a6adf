"""A job id the ranks of one torchrun job agree on when torchrun's run id is ``none``.

Multi-node torchrun without ``--rdzv-id`` gives every worker of every such job
TORCHELASTIC_RUN_ID=none: used as the job name it would merge unrelated jobs in
every ``by (job)`` rule and in one coordinator. The workers of one job do share
one thing no other job has: the elastic agent's store (TORCHELASTIC_USE_AGENT_STORE
=True, at MASTER_ADDR:MASTER_PORT, the rendezvous endpoint; it lives as long as
the launcher, across worker restarts). Each rank proposes a fresh random id with
``compare_set(key, "", mine)``: the store keeps the first proposal and returns it
to everyone, so all ranks (and the workers of later restarts) read the same id,
and another job, with another store, gets another.

One round trip at install, bounded by ``timeout_s``; any failure returns None
(the caller keeps the default name and says why) and never raises.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from datetime import timedelta

log = logging.getLogger("watchdog.hook")

KEY = "watchdog/job_id"


def agree(env: Mapping[str, str], timeout_s: float = 10.0) -> str | None:
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "") != "True":
        log.warning(
            "watchdog.hook torchrun run id is 'none' and no agent store to agree on a job id: "
            "set WATCHDOG_JOB_NAME or torchrun --rdzv-id, or two such jobs share one name"
        )
        return None
    try:
        from torch.distributed import TCPStore

        store = TCPStore(
            env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=timeout_s)
        )
        value = store.compare_set(KEY, "", f"torchrun-{uuid.uuid4().hex[:12]}")
        text = value.decode() if isinstance(value, bytes) else str(value)
        return text or None
    except Exception as exc:
        log.warning("watchdog.hook could not agree on a job id through the agent store: %r", exc)
        return None
