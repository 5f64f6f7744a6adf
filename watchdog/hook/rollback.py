"""Which checkpoint to resume from after a ``rollback_restart``: the contract
between rank-watchdog and a training script.

When the coordinator's policy answers a training anomaly (``loss_anomaly``: a
NaN loss, a loss spike) with ``rollback_restart``, each host's agent writes
``<run dir>/<job>.rollback.json`` (``wire.rollback_filename``) before the
workers are stopped::

    {"job": "train-42", "before_step": 1200, "action": "a-3", "command_id": "c-...", "written_wall": 1.7e9}

``before_step`` is the first step the anomaly was seen at: checkpoints saved at
that step or later may hold the corrupted state. A restarted script that
honours it resumes from its newest checkpoint *strictly before* ``before_step``,
once per rollback (``action`` names it): a later ordinary restart must again
use the newest checkpoint, since those saved after the rollback are good.
watchdog/dev/examples/train_ddp.py shows the whole pattern (``honour_rollback``)::

    rb = rollback.requested(mon)            # None, or Rollback(before_step, action)
    if rb and not already_honoured(rb.action):
        step, path = newest_checkpoint(before=rb.before_step)
        ...; mark_honoured(rb.action)       # e.g. a marker file beside the checkpoints

Reading never raises: a missing, foreign or malformed file is "no rollback".
The run directory is shared with other users, so the file is believed only when
it is a regular file (not a link) owned by the agent's account (``rank-watchdog``,
the shipped units' user), root or this process's user, or a uid passed in
``trusted_uids`` (an agent running as another account): another user's file
would otherwise make a restarted job set aside every checkpoint it has.
"""

from __future__ import annotations

import json
import os
import pwd
from dataclasses import dataclass
from typing import Any

from watchdog import sharedfile
from watchdog.contracts import slot as wire

AGENT_ACCOUNT = "rank-watchdog"  # deploy/systemd/rank-watchdog.sysusers.conf


@dataclass(frozen=True)
class Rollback:
    before_step: int
    action: str  # the coordinator's action id: one rollback, honoured once


def path_for(run_dir: str, job: str) -> str:
    return os.path.join(run_dir, wire.rollback_filename(job))


def owners(trusted_uids: frozenset[int] = frozenset()) -> frozenset[int]:
    """Who may have written a rollback file this process believes."""
    try:
        agent = {pwd.getpwnam(AGENT_ACCOUNT).pw_uid}
    except KeyError:
        agent = set()
    return frozenset({os.geteuid(), 0, *agent}) | frozenset(trusted_uids)


def requested(
    mon: Any = None,
    *,
    run_dir: str | None = None,
    job: str | None = None,
    trusted_uids: frozenset[int] = frozenset(),
) -> Rollback | None:
    """The rollback the agent wrote for this job, or None. ``mon``: the installed
    Monitor (its run directory and job); or pass ``run_dir`` and ``job``.
    ``trusted_uids``: further uids the agent may run as (see the module's docstring)."""
    cfg = getattr(mon, "config", None)
    run_dir = run_dir if run_dir is not None else getattr(cfg, "run_dir", "")
    job = job if job is not None else getattr(cfg, "job", "")
    if not run_dir or not job:
        return None
    try:
        doc = json.loads(sharedfile.read(path_for(run_dir, job), owners(trusted_uids), max_bytes=64 << 10))
    except (OSError, ValueError):  # sharedfile.Untrusted is a ValueError
        return None
    if not isinstance(doc, dict):
        return None
    step = doc.get("before_step")
    if doc.get("job") != job or not isinstance(step, int) or isinstance(step, bool) or step <= 0:
        return None
    return Rollback(before_step=step, action=str(doc.get("action") or doc.get("command_id") or ""))
