"""Destructive actions, one small module each, behind one protocol::

    start(op, view, now) -> ActionStep    # first commands, when the policy chose it
    advance(op, view, now) -> ActionStep  # every tick until the step says done

Pure: the time and the cluster view are arguments, commands and journal events
are returned (``ActionStep``). Idempotent: re-running ``advance`` on the same state
asks for nothing twice within a period, and a signal that found its process
already gone is a success (the goal is "gone"). A failure is never raised out
of the coordinator's tick; the next tick tries again.
"""

from __future__ import annotations

from . import abort, checkpoint_restart, restart, rollback_restart

# policy action -> module. exclude_host_restart shares the restart module: it
# differs only in also stopping the culprit host's launcher.
MODULES = {
    "abort": abort,
    "restart": restart,
    "checkpoint_restart": checkpoint_restart,
    "exclude_host_restart": restart,
    "rollback_restart": rollback_restart,
}
