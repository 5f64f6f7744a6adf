"""Whose a process is and who started it, read through psutil: the uids a slot
file's owner is checked against, and the parent (under torchrun the elastic agent)
an abort must stop too."""

from __future__ import annotations

import psutil

from watchdog.agent.processes import steadystart


def process_uids(pid: int) -> frozenset[int] | None:
    """The real and effective uid of ``pid``; None when unreadable."""
    try:
        uids = psutil.Process(pid).uids()
        return frozenset((uids.real, uids.effective))
    except (psutil.Error, OSError):
        return None


def parent_identity(pid: int) -> tuple[int, int]:
    """(pid, start us) of ``pid``'s parent; (0, 0) when unreadable. Read once per
    rank, while it is alive: a dead rank's parent is init."""
    try:
        parent = psutil.Process(pid).parent()
        if parent is None or parent.pid <= 1:
            return (0, 0)
        started = steadystart.start_us(parent.pid)  # not moved by a clock step
        return (0, 0) if started is None else (parent.pid, started)
    except (psutil.Error, ValueError, OSError):
        return (0, 0)
