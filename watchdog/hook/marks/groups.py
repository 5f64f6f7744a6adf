"""Per-process-group collective counters: how many collectives this rank entered
on each group, and the highest one completed. Comparing these across ranks is
what names the rank that has not entered the collective the others wait in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from watchdog.contracts import slot as wire


class GroupCounters:
    """Collective counters of one process group (shared by every handle to it)."""

    __slots__ = ("done", "key", "seq")

    def __init__(self, key: int) -> None:
        self.key = key  # wire.group_key of the group's name: equal on every rank
        self.seq = 0  # collectives entered
        self.done = 0  # highest seq completed


def _attribute_name(group: Any) -> str:
    return str(getattr(group, "group_name", "") or "")


class GroupTable:
    """Counters by group handle. ``by_handle`` is the hot lookup (a plain dict:
    one ``get`` per collective); ``add`` is the miss path. None is the default
    group (key 0); handles with the same name share counters, so group=None and
    group=WORLD agree. ``name_of`` is replaced by the torch patch with c10d's own
    naming."""

    def __init__(self) -> None:
        self.by_handle: dict[Any, GroupCounters] = {}
        self._by_key: dict[int, GroupCounters] = {}
        self.name_of: Callable[[Any], str] = _attribute_name

    def add(self, group: Any) -> GroupCounters:
        key = wire.group_key("" if group is None else self.name_of(group))
        st = self._by_key.setdefault(key, GroupCounters(key))
        self.by_handle[group] = st
        return st

    def reset(self, group: Any = None) -> None:
        """Forget counters: all (the default group was destroyed or re-created:
        sequence numbers restart on every rank), or one subgroup's. In place:
        the recorder keeps a reference to ``by_handle``."""
        if group is None:
            self.by_handle.clear()
            self._by_key.clear()
        else:
            st = self.by_handle.pop(group, None)
            if st is not None:
                self._by_key.pop(st.key, None)
