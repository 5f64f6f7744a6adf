"""Command acks waiting for a report to carry them to the coordinator, per job.

An ack leaves the outbox only once a report carrying it was accepted, so a failed
send loses nothing. A command gets a small "running" ack as soon as it is
accepted (the coordinator stops re-sending it) and later its result under the
same id, which replaces the running ack if that was not sent yet.

Reports are size-limited at the coordinator (4 MiB by default): one report
carries acks up to ``budget_bytes`` (at least one ack; the executor keeps each
ack well below the limit), the rest follow in the next reports.
"""

from __future__ import annotations

import json
import threading
from typing import Any

BUDGET_BYTES = 2 << 20
MAX_PER_JOB = 64


def size(ack: dict[str, Any]) -> int:
    return len(json.dumps(ack, separators=(",", ":")))


class Outbox:
    def __init__(self, budget_bytes: int = BUDGET_BYTES, max_per_job: int = MAX_PER_JOB, log: Any = None) -> None:
        self.budget_bytes, self.max_per_job = budget_bytes, max_per_job
        self._log = log
        self._lock = threading.Lock()
        self._acks: dict[str, dict[str, tuple[dict, int]]] = {}  # job -> id -> (ack, bytes), insertion order
        self.dropped = 0

    def put(self, job: str, ack: dict[str, Any]) -> None:
        n = size(ack)
        with self._lock:
            box = self._acks.setdefault(job, {})
            box.pop(ack["id"], None)  # the result replaces the running ack; re-inserted last
            box[ack["id"]] = (ack, n)
            while len(box) > self.max_per_job:  # the coordinator is unreachable for long: keep the newest
                old = next(iter(box))
                del box[old]
                self.dropped += 1
                if self._log is not None:
                    self._log.warning("command ack dropped", job=job, id=old, reason="outbox full")

    def take(self, job: str) -> list[dict[str, Any]]:
        """Acks for the next report of ``job``, oldest first, within the budget."""
        out: list[dict[str, Any]] = []
        used = 0
        with self._lock:
            for ack, n in self._acks.get(job, {}).values():
                if out and used + n > self.budget_bytes:
                    break
                out.append(ack)
                used += n
        return out

    def delivered(self, job: str, acks: list[dict[str, Any]]) -> None:
        """A report carrying ``acks`` was accepted. An ack replaced since it was taken
        (running -> result) is a different object and stays."""
        with self._lock:
            box = self._acks.get(job)
            if not box:
                return
            for ack in acks:
                held = box.get(ack["id"])
                if held is not None and held[0] is ack:
                    del box[ack["id"]]
            if not box:
                del self._acks[job]

    def pending(self) -> int:
        with self._lock:
            return sum(len(b) for b in self._acks.values())
