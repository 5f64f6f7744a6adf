"""The job's state and its actions as metrics, from the control loop's journal
events (control.py): the one record of what the monitor decided and what came
of it, so the metrics cannot tell another story than the journal."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..journal import event_names as je
from ..metrics import CoordinatorMetrics
from ..vocabularies import JobState


class ActionMetrics:
    KEEP = 64  # dry-run ids remembered until their outcome (one action at a time: a few at most)

    def __init__(self, metrics: CoordinatorMetrics) -> None:
        self._m = metrics
        self._dry: set[str] = set()  # a dry run's outcome says nothing happened: not a success

    def note(self, name: str, payload: Mapping[str, Any]) -> None:
        m, action = self._m, payload.get("action")
        if name == je.STATE:
            try:
                m.set_job_state(JobState(payload.get("job_state")))
            except ValueError:
                return
        elif name == je.ACTION and isinstance(action, str):
            if payload.get("dry_run"):
                m.actions.labels(action, "dry_run").inc()
                self._dry.add(str(payload.get("action_id")))
                while len(self._dry) > self.KEEP:
                    self._dry.pop()
                return
            m.actions.labels(action, "started").inc()
            if "restart" in payload:  # a restarting action, numbered in the job's budget
                m.restarts.inc()
        elif name == je.ACTION_OUTCOME and isinstance(action, str):
            if str(payload.get("action_id")) in self._dry:
                self._dry.discard(str(payload.get("action_id")))
                return
            m.actions.labels(action, "succeeded" if payload.get("ok") else "failed").inc()
